"""GPU-to-GPU shuffles over Distributed's comms, coordinated through the worker plugin.

``split`` cuts partitions by destination; ``worker`` sends, receives and waits for peers;
``buffer`` keeps received pieces within memory limits; ``coordinator`` runs it from the client;
``api`` is what users call.

The package imports nothing itself: the worker plugin needs ``worker`` without the client side.
"""
