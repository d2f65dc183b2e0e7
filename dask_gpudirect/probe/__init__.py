"""``dask-gpudirect probe``: what each worker's GPU, storage and comms can do, and what they do.

The workers report their own facts (``client.run``): host, GPU, kvikio, GDS, comms, peer access.
The client assembles them with short measurements into one document: for each path (storage ->
GPU, host -> GPU, GPU -> GPU in a node and across nodes) the route in use, its copies, its
bandwidth and a verdict. Copies are counted as NVIDIA's GPUDirect write-ups count them (see
:data:`~dask_gpudirect.ledger.COPIES`). The JSON form is stable and documented in docs/probe.md.

Nothing asks CUDA anything, let alone the cuFile driver (which hangs where there is none), on a
worker where :func:`~dask_gpudirect.cuda.gpu_count` finds no GPU: that worker says "no GPU".
"""

from .command import probe
from .facts import _gds_reason, parse_ep_info
from .routes import LABELS, pair_route

__all__ = ["LABELS", "_gds_reason", "pair_route", "parse_ep_info", "probe"]
