"""Placement: which worker plans each file and reads each shard, and a plugin that makes it so.

Each file is planned, and each shard read, by a worker that can read the file (as discovery
found), balancing files and bytes across workers; the choice
is deterministic, so the same inputs and workers give the same placement. Because dask-expr
drops annotations and fuses tasks, the placement travels inside the shard itself, and
:class:`PlacementPlugin` finds shards in incoming tasks (fused or not) and restricts each task
to its worker. Restrictions are loose: if that worker is gone, any worker may run it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dask.task_spec import DataNode, Task
from distributed import SchedulerPlugin

from .errors import InputError
from .shards import Shard, load


def _least_loaded(path: str, load: dict[str, int], readable: dict[str, set[str]]) -> str:
    """The worker of ``load`` that can read ``path`` and has least load (ties: by name)."""
    able = [w for w in load if path in readable[w]]
    if not able:
        raise InputError(
            path,
            "no worker can read this file (checked every worker: it must exist there and lie "
            "inside gpudirect.allowed-roots where that is set)",
        )
    return min(able, key=lambda w: (load[w], w))


def planners(files: list[str], readable: dict[str, set[str]]) -> dict[str, list[str]]:
    """Which worker plans (reads the footer or header of) which files: an able one, files
    spread evenly; every worker's files stay in the order of ``files``."""
    count = {worker: 0 for worker in sorted(readable)}
    groups: dict[str, list[str]] = {}
    for path in files:
        worker = _least_loaded(path, count, readable)
        count[worker] += 1
        groups.setdefault(worker, []).append(path)
    return groups


def assign(shards: list[Shard], readable: dict[str, set[str]]) -> list[Shard]:
    """``shards`` with ``worker`` set: largest first, onto the least-loaded able worker."""
    load_bytes = {worker: 0 for worker in sorted(readable)}
    placed: dict[int, Shard] = {}
    order = sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, i))
    for i in order:
        shard = shards[i]
        worker = _least_loaded(shard.path, load_bytes, readable)
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
