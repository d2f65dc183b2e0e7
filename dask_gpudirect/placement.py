"""Placement: which worker reads each shard, and a scheduler plugin that makes it so.

Each shard goes to a worker that can read its file, balancing bytes across workers; the choice
is deterministic, so the same inputs and workers give the same placement. Because dask-expr
drops annotations and fuses tasks, the placement travels inside the shard itself, and
:class:`PlacementPlugin` finds shards in incoming tasks (fused or not) and restricts each task
to its worker. Restrictions are loose: if that worker is gone, any worker may run it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dask.task_spec import DataNode, Task
from distributed import SchedulerPlugin

from .access import allowed
from .errors import InputError
from .shards import Shard, load


def readable_dirs(dirs: list[str]) -> list[str]:
    """The directories of ``dirs`` this process can list and read and its allowed roots admit
    (run on each worker)."""
    return [d for d in dirs if os.path.isdir(d) and os.access(d, os.R_OK | os.X_OK) and allowed(d)]


def assign(shards: list[Shard], readable: dict[str, set[str]]) -> list[Shard]:
    """``shards`` with ``worker`` set: largest first, onto the least-loaded able worker."""
    load_bytes = {worker: 0 for worker in sorted(readable)}
    placed: dict[int, Shard] = {}
    order = sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, i))
    for i in order:
        shard = shards[i]
        directory = os.path.dirname(shard.path)
        able = [w for w in load_bytes if directory in readable[w]]
        if not able:
            raise InputError(
                shard.path,
                "no worker can read this file (checked every worker: it must exist there, be "
                "readable, and lie inside gpudirect.allowed-roots where that is set)",
            )
        worker = min(able, key=lambda w: (load_bytes[w], w))
        load_bytes[worker] += shard.nbytes
        placed[i] = dataclasses.replace(shard, worker=worker)
    return [placed[i] for i in range(len(shards))]


def _shard_of(node: Any) -> Shard | None:
    """The shard a task loads, looking inside fused tasks; None for other tasks."""
    if not isinstance(node, Task):
        return None
    if node.func is load and node.args:
        arg = node.args[0]
        arg = arg.value if isinstance(arg, DataNode) else arg
        return arg if isinstance(arg, Shard) else None
    if node.has_subgraph():
        for inner in node.args[0].values():
            shard = _shard_of(inner)
            if shard is not None:
                return shard
    return None


class PlacementPlugin(SchedulerPlugin):
    """Restricts every task that loads a shard to the worker placement chose for it."""

    name = "gpudirect-placement"
    idempotent = True

    def update_graph(self, scheduler, *, tasks, **kwargs) -> None:
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None:
                continue
            shard = _shard_of(ts.run_spec)
            if shard is not None and shard.worker in scheduler.workers:
                ts.worker_restrictions = {shard.worker}
                ts.loose_restrictions = True
