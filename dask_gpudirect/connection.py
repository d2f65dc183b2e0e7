"""The client every public function works through: the one given, or Dask's current one.

Checked before use, so a closed or wrong ``client=`` is a clear error in the user's process, not
an ``AttributeError`` from deep inside distributed.
"""

from __future__ import annotations

from distributed import Client, default_client

from .errors import InputError


def connected(client: Client | None) -> Client:
    """``client`` (default: the current client), a running :class:`distributed.Client`."""
    if client is None:
        return default_client()  # "No clients found": Dask's own error says what to do
    if not isinstance(client, Client):
        raise InputError(None, f"client= must be a distributed.Client, not {type(client).__name__}")
    if client.status != "running":
        raise InputError(
            None,
            f"client= is {client.status}, not running: connect a new one, e.g. "
            "Client(cluster), and pass that",
        )
    return client
