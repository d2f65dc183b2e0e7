"""``shuffle_method="gpudirect"``: Dask's own shuffles through this package's exchange.

Dask's group-bys with ``split_out``, its merges, ``drop_duplicates``, ``set_index``,
``sort_values`` and ``df.shuffle`` all come down to two expressions: ``RearrangeByColumn``
(shuffle on these columns), which Dask lowers to a ``_partitions`` column of each row's output
and a ``Shuffle`` of that, which the sorts make directly from their divisions. Their
``_lower`` picks the tasks of the method asked for, and is wrapped here, as dask-cuda wrapped
it for its explicit-comms shuffle: ``shuffle_method="gpudirect"`` (or the config
``dataframe.shuffle.method: gpudirect``) runs the all-to-all at once, while Dask lowers the
graph on the client (in ``compute``, ``persist`` or ``optimize``), and puts the computed
outputs in its place, as ``dg.shuffle`` returns them. A shuffle on columns is cut by Dask's
own hash on the workers (no task per partition to add the column, none to drop it); the rest
by the ``_partitions`` column. Rows go where Dask puts them; within a partition pandas rows in
input order, as Dask's task shuffle keeps them, cuDF rows in no set order, as dask_cudf's task
shuffle gives them (the GPU's unordered cut, libcudf's ``hash_partition``). A merge takes
Dask's broadcast join where asked (``broadcast=``).
Every other method is left to Dask.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import dask
import dask.base
from dask.base import named_schedulers
from dask.dataframe.dask_expr._collection import FrameBase, new_collection
from dask.dataframe.dask_expr._merge import Merge
from dask.dataframe.dask_expr._shuffle import RearrangeByColumn, Shuffle, ShuffleBase
from dask.utils import get_default_shuffle_method
from distributed import Client, default_client

from .. import targets
from ..connection import off_its_loop
from ..errors import ClusterError
from . import engines
from .api import Computed, exchanged
from .split import AssignedSplit, HashSplit

#: The name Dask's ``shuffle_method`` takes for this package's exchange.
METHOD = "gpudirect"

_dask_lower = Shuffle._lower
_dask_rearrange = RearrangeByColumn._lower
_dask_broadcast = Merge.__dict__["is_broadcast_join"]

#: The calls that lower a graph for a scheduler they were told: Distributed's (the client is
#: their ``self``), Dask's (the scheduler, ``schedule``, is known before the graph is lowered)
#: and dask-expr's ``persist``, which lowers before it calls Dask's (``scheduler=`` is among
#: its ``kwargs``).
_CLIENTS = {Client.compute.__code__, Client.persist.__code__}
_SCHEDULES = {dask.base.compute.__code__, dask.base.persist.__code__}
_PERSIST = FrameBase.persist.__code__


def _lower(self: Shuffle) -> Any:
    if not _asked(self.method):
        return _dask_lower(self)
    return run(self, AssignedSplit)  # by Dask's "_partitions" column: each row's output


def _rearrange(self: RearrangeByColumn) -> Any:
    on = self._partitioning_index
    hashed = self.frame.ndim == 2 and isinstance(on, list) and set(on) <= set(self.frame.columns)
    if not (_asked(self.method) and hashed and not self.index_shuffle):
        return _dask_rearrange(self)  # on the index, an expression or a Series: via Shuffle
    return run(self, HashSplit)


def _broadcast(self: Merge) -> bool:
    """Whether a merge sends its smaller frame whole to each partition of the other rather than
    shuffle both. Dask decides so for its own methods only; on this one where asked
    (``broadcast=True``, or a float: Dask's rule with that bias), as on the task shuffle. Not by
    default: shuffling both sides here took less time than Dask's broadcast join of a frame of
    three partitions with one of 256 (two CPU workers: 1.4-1.9 against 2.9-3.0 s at 4 M rows,
    2.7-3.8 against 3.7-4.1 s at 16 M)."""
    if not _asked(self.shuffle_method):
        return _dask_broadcast.func(self)
    if self.broadcast is None:
        return False
    return _dask_broadcast.func(self.substitute_parameters({"shuffle_method": "tasks"}))


def install() -> None:
    """Route Dask's ``shuffle_method="gpudirect"`` here (done on ``import dask_gpudirect``)."""
    Shuffle._lower = _lower  # type: ignore[method-assign]
    RearrangeByColumn._lower = _rearrange  # type: ignore[method-assign]
    broadcast = functools.cached_property(_broadcast)
    broadcast.__set_name__(Merge, "is_broadcast_join")
    Merge.is_broadcast_join = broadcast  # type: ignore[assignment]


def _asked(method: str | None) -> bool:
    return (method or get_default_shuffle_method()) == METHOD


def run(shuffle: ShuffleBase, cut: type[HashSplit]) -> Computed:
    """``shuffle``, done now by the workers, each row sent where ``cut`` says: its outputs,
    computed. Their index is the one Dask's meta of this method keeps (the task shuffle's alone
    drops it): with ``ignore_index`` it is labelled 0, 1, 2... (no index bytes move) only
    where that changes nothing but its values, an unnamed integer index; others travel, as
    P2P's do (labels 0, 1, 2... under a name and type of another index broke ``reset_index``
    and the like on the computed partitions)."""
    meta = shuffle._meta
    dropped = meta.reset_index(drop=True)
    index = not (shuffle.ignore_index and _same_type(dropped.index, meta.index))
    meta = meta if index else dropped
    target = targets.holding(meta)
    npartitions = shuffle.npartitions_out
    keep_order = target != "device"
    on = list(shuffle._partitioning_index)
    splitter = cut(on, npartitions, target, meta, index, keep_order=keep_order)
    partitions = max(shuffle.frame.npartitions, npartitions)
    candidates = engines.choose(None, target, meta, index, partitions, keep_order)
    frame = new_collection(shuffle.frame)
    return exchanged(_client(), frame, splitter, meta, candidates)


def _same_type(a: Any, b: Any) -> bool:
    """Whether indexes ``a`` and ``b`` differ in their values alone: name, type, levels."""
    return a.nlevels == b.nlevels and a.name == b.name and a.dtype == b.dtype


def _client() -> Client:
    """The client of the cluster that computes the graph being lowered: the one whose
    ``compute`` or ``persist`` lowers it, or the ``scheduler=`` given to Dask's (in the call or
    its config); else (``optimize()``, ``.dask``) the current client. Not simply the current
    one: with two clients, ``client.compute(x)`` ran the exchange on the other's cluster, and
    its outputs were then "lost dependencies" to this one's."""
    asked = _scheduler_asked()
    client = getattr(asked, "__self__", asked)  # Dask's scheduler for a client: client.get
    if isinstance(client, Client):
        return off_its_loop(client)
    try:
        current = default_client()
    except ValueError:
        raise ClusterError(
            f"shuffle_method={METHOD!r} runs on a Dask cluster and no distributed Client is "
            "connected: start one (Client(cluster)), or use shuffle_method='tasks'"
        ) from None
    local = _local(asked)
    if local:  # run there, the outputs would be missing dependencies to Dask's own scheduler
        raise ClusterError(
            f"shuffle_method={METHOD!r} runs on a Dask cluster, and this graph is computed by "
            f"Dask's local scheduler {local}, not a distributed Client: "
            "compute it with client.compute(...) or scheduler=client, or use "
            "shuffle_method='tasks'"
        )
    return off_its_loop(current)


def _local(asked: Any) -> str | None:
    """The local scheduler ``asked`` names (a Client's: None): by name where Dask has one
    (``'sync'``), else the executor or function (``scheduler=ThreadPoolExecutor()``, whose
    outputs were as missing to it as to ``'threads'``)."""
    if isinstance(asked, str):
        asked = asked.lower()
        if asked not in named_schedulers:
            return None  # 'distributed', 'dask.distributed': the current client
    elif asked is None:
        return None
    names = [name for name, get in named_schedulers.items() if asked in (name, get)]
    if names:
        return repr(min(names, key=len))
    if isinstance(asked, functools.partial):  # an executor's: partial(get_async, pool.submit)
        asked = getattr(asked.args[0], "__self__", asked.func) if asked.args else asked.func
    return getattr(asked, "__qualname__", type(asked).__name__)


def _scheduler_asked() -> Any:
    """The scheduler the call that lowers the graph was told (None: not said), from the
    innermost of :data:`_CLIENTS`, :data:`_SCHEDULES` and :data:`_PERSIST` among its callers;
    else the config's ``scheduler``."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code, names = frame.f_code, frame.f_locals
        if code in _CLIENTS:
            return names.get("self")
        if code in _SCHEDULES:
            return names.get("schedule")
        if code is _PERSIST and names.get("kwargs", {}).get("scheduler") is not None:
            return names["kwargs"]["scheduler"]
        frame = frame.f_back
    return dask.config.get("scheduler", None)
