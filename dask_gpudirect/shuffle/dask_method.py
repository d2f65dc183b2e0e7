"""``shuffle_method="gpudirect"``: Dask's own shuffles through this package's exchange.

Dask's group-bys with ``split_out``, its merges, ``set_index``, ``sort_values`` and
``df.shuffle`` all come down to one expression, ``Shuffle``, of a frame whose ``_partitions``
column says which output each row goes to; its ``_lower`` picks the tasks of the method asked
for. That method is wrapped here, as dask-cuda wrapped it for its explicit-comms shuffle:
``shuffle_method="gpudirect"`` (or the config ``dataframe.shuffle.method: gpudirect``) runs the
all-to-all at once, while Dask lowers the graph on the client (in ``compute``, ``persist`` or
``optimize``), and puts the computed outputs in its place, as ``dg.shuffle`` returns them.
Rows go where Dask put them, in input order within a partition, as in Dask's task shuffle.
Every other method is left to Dask.
"""

from __future__ import annotations

from typing import Any

from dask.dataframe.dask_expr._collection import new_collection
from dask.dataframe.dask_expr._shuffle import Shuffle
from dask.utils import get_default_shuffle_method
from distributed import Client, default_client

from .. import targets
from ..errors import ClusterError
from . import engines
from .api import Computed, exchanged
from .split import AssignedSplit

#: The name Dask's ``shuffle_method`` takes for this package's exchange.
METHOD = "gpudirect"

_dask_lower = Shuffle._lower


def _lower(self: Shuffle) -> Any:
    if (self.method or get_default_shuffle_method()) != METHOD:
        return _dask_lower(self)
    return run(self)


def install() -> None:
    """Route Dask's ``shuffle_method="gpudirect"`` here (done on ``import dask_gpudirect``)."""
    Shuffle._lower = _lower  # type: ignore[method-assign]


def run(shuffle: Shuffle) -> Computed:
    """``shuffle``, done now by the workers: its outputs, computed."""
    meta = shuffle.frame._meta
    if shuffle.ignore_index:
        meta = meta.reset_index(drop=True)
    target = targets.holding(meta)
    npartitions = shuffle.npartitions_out
    (column,) = shuffle._partitioning_index  # Dask's "_partitions": each row's output
    index = not shuffle.ignore_index
    splitter = AssignedSplit([column], npartitions, target, meta, index)
    partitions = max(shuffle.frame.npartitions, npartitions)
    candidates = engines.choose(None, target, meta, index, partitions, keep_order=True)
    frame = new_collection(shuffle.frame)
    return exchanged(_client(), frame, splitter, meta, candidates)


def _client() -> Client:
    try:
        return default_client()
    except ValueError:
        raise ClusterError(
            f"shuffle_method={METHOD!r} runs on a Dask cluster and no distributed Client is "
            "connected: start one (Client(cluster)), or use shuffle_method='tasks'"
        ) from None
