"""Placement: which worker plans each file and reads each shard, and a plugin that makes it so.

Each file is planned, and each shard read, by a worker that can read the file (as discovery
found), balancing files and bytes across workers; the choice
is deterministic, so the same inputs and workers give the same placement. Because dask-expr
drops annotations and fuses tasks, the placement travels inside the shard itself, and
:class:`PlacementPlugin` finds shards in incoming tasks (fused or not) and restricts each task
to its worker. The restriction is strict while that worker lives (work stealing would otherwise
hand a busy worker's shards to an idle one that may not see the file). When it leaves (or
retires: ``closing_gracefully``, where ``retire_workers`` may keep it for good), the task is
restricted to the other workers that found its files (node-local copies on other nodes), and
where none of them is left, or every worker found them (a shared file system: the shard then
names none), to none: then any worker may run it (a restarted one, with a new address), and
the read says why it ran there. A task that loads shards of several reads (Dask fuses the reads
of ``dd.concat([a, b], axis=1)`` or ``a.x + b.y`` into one task) runs on a worker that found
every file it loads; where no worker did (two datasets on different nodes' own disks), it fails
at once, naming two of its files.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable
from time import time
from typing import Any

from dask.task_spec import DataNode, Task
from dask.typing import Key
from distributed import Scheduler, SchedulerPlugin, Status
from distributed.scheduler import TaskState, TaskStateState

from .errors import InputError
from .formats import parquet
from .loading import load_chunk, load_partition, unreadable_together
from .shards import Shard


def _readers(paths: list[str], readable: dict[str, set[str]]) -> list[str]:
    """The workers that can read every one of ``paths``."""
    return [w for w, seen in readable.items() if all(path in seen for path in paths)]


def _readers_of(paths: list[str], readable: dict[str, set[str]]) -> list[str]:
    """The workers of ``readable`` that can read every one of ``paths``; an InputError naming
    a file that none can where there is none."""
    able = _readers(paths, readable)
    if not able:
        unread = next(
            (p for p in paths if not any(p in seen for seen in readable.values())), paths[0]
        )
        raise InputError(
            unread,
            "no worker can read this file (checked every worker: it must exist there and lie "
            "inside gpudirect.allowed-roots where that is set)",
        )
    return able


def _least_loaded(paths: list[str], load: dict[str, int], readable: dict[str, set[str]]) -> str:
    """The worker of ``load`` that can read all ``paths`` and has least load (ties: by name)."""
    able = _readers_of(paths, {w: readable[w] for w in load})
    return min(able, key=lambda w: (load[w], w))


def planners(files: list[str], readable: dict[str, set[str]]) -> dict[str, list[str]]:
    """Which worker plans (reads the footer or header of) which files: an able one, files
    spread evenly; every worker's files stay in the order of ``files``."""
    count = {worker: 0 for worker in sorted(readable)}
    groups: dict[str, list[str]] = {}
    for path in files:
        worker = _least_loaded([path], count, readable)
        count[worker] += 1
        groups.setdefault(worker, []).append(path)
    return groups


def join_small(
    shards: list[Shard],
    blocksize: int,
    readable: dict[str, set[str]],
    at_least: int = 1,
    joins: Callable[[Shard], bool] = lambda shard: True,
    spread: int = 1,
) -> list[tuple[Shard, ...]]:
    """Consecutive shards joined into partitions of about ``blocksize`` bytes, as Dask's and
    dask_cudf's ``read_parquet`` join small files and row groups: fewer, larger partitions, in
    file order.

    The bytes are cut into equal spans, as many as ``blocksize`` needs, moved to the nearest
    multiple of ``spread`` (halves down) and at least ``at_least``, where there are shards
    enough; each shard goes with the span its middle falls in: files of about one size make
    partitions of about one size, and a partition passes ``blocksize`` by less than a shard
    (by up to half as much again where ``spread`` moved the count down). A shard joins the one
    before it only where some worker can read both files and ``joins`` allows both.

    ``spread`` (the workers) gives each worker as many bytes to read and to shuffle: with five
    partitions on two workers one reads three while the other waits (a shuffle stage's wait
    for its peer: 72-111 ms of 0.42-0.53 s, 8 GiB in 64 files on one H200 shared by two
    workers). That machine could not show the gain (its two workers share one GPU's reads):
    the ETL's many-keys query took 0.43 / 0.44 / 0.50 s in four / five / six partitions, its
    scan 0.24 / 0.21-0.22 / 0.21 s, differences about as large as two calls of one count
    (``docs/benchmarks/2026-12-03-h200-shared2-etl-8gib-partitions-bec59e7.md``). Nearest,
    halves down: a partition passes ``blocksize`` by at most about half, and of two counts
    as near the fewer wins.
    """
    total = sum(shard.nbytes for shard in shards)
    needed = math.ceil(total / blocksize)
    nearest = math.ceil(needed / spread - 0.5) * spread
    count = min(len(shards), max(at_least, nearest, 1))
    if count == len(shards):
        return [(shard,) for shard in shards]
    span = total / count if total else 1.0  # no bytes at all: one partition
    partitions: list[list[Shard]] = []
    able: set[str] = set()  # the workers that can read every file of the last partition
    start, previous = 0, -1
    for shard in shards:
        index = min(int((start + shard.nbytes / 2) // span), count - 1)
        start += shard.nbytes
        readers = {w for w, seen in readable.items() if shard.path in seen}
        if index == previous and able & readers and joins(partitions[-1][-1]) and joins(shard):
            partitions[-1].append(shard)
            able &= readers
        else:
            partitions.append([shard])
            able = readers
        previous = index
    return [tuple(p) for p in partitions]


def fold_rowless(
    partitions: list[tuple[Shard, ...]],
    readable: dict[str, set[str]],
    rowless: Callable[[Shard], bool],
) -> list[tuple[Shard, ...]]:
    """``partitions`` with each one of ``rowless`` shards only (a Parquet file that filters ruled
    out whole) joined to the next one that has rows, else the one before, where a worker can
    read the files of both: Dask drops such partitions, and they hold no index values to divide
    by; here their files are still checked. Where none has rows, they are joined into as few
    partitions as one worker each can read: one for files every worker sees, as Dask's one
    empty partition."""
    with_rows = [i for i, p in enumerate(partitions) if not all(map(rowless, p))]
    if not with_rows:
        return _joined_while_readable(partitions, readable)
    # each partition with rows, and the rowless ones joined before and after it, in file order,
    # and the workers that can read all of their files
    joined: dict[int, tuple[list[Shard], ...]] = {
        i: ([], list(partitions[i]), []) for i in with_rows
    }
    able = {i: _able(partitions[i], readable) for i in with_rows}
    alone: dict[int, tuple[list[Shard], ...]] = {}
    for i in sorted(set(range(len(partitions))) - set(with_rows), reverse=True):
        k = bisect.bisect(with_rows, i)  # the first partition with rows after i
        after = with_rows[k] if k < len(with_rows) else None
        before = with_rows[k - 1] if k else None
        mine = _able(partitions[i], readable)
        for j, side in ((after, 0), (before, 2)):
            if j is not None and able[j] & mine:
                joined[j][side][0:0] = partitions[i]
                able[j] &= mine
                break
        else:
            alone[i] = (list(partitions[i]),)
    return [tuple(itertools.chain(*p)) for _, p in sorted({**joined, **alone}.items())]


def _able(partition: tuple[Shard, ...], readable: dict[str, set[str]]) -> set[str]:
    """The workers that can read every file of ``partition``."""
    return set(_readers([s.path for s in partition], readable))


def _joined_while_readable(
    partitions: list[tuple[Shard, ...]], readable: dict[str, set[str]]
) -> list[tuple[Shard, ...]]:
    """Consecutive ``partitions`` joined for as long as one worker can read all their files."""
    joined: list[list[Shard]] = []
    able: set[str] = set()  # the workers that can read every file of the last joined one
    for part in partitions:
        mine = _able(part, readable)
        if joined and able & mine:
            joined[-1].extend(part)
            able &= mine
        else:
            joined.append(list(part))
            able = mine
    return [tuple(p) for p in joined]


def assign(
    partitions: list[tuple[Shard, ...]], readable: dict[str, set[str]]
) -> list[tuple[Shard, ...]]:
    """``partitions`` (shards read by one task) with each shard's ``worker`` set: largest
    first, onto the least-loaded worker that can read all their files."""
    load_bytes = {worker: 0 for worker in sorted(readable)}
    placed: dict[int, tuple[Shard, ...]] = {}
    seen: dict[tuple[str, ...], tuple[str, ...]] = {}
    sizes = [sum(s.nbytes for s in p) for p in partitions]
    for i in sorted(range(len(partitions)), key=lambda i: (-sizes[i], i)):
        paths = sorted({s.path for s in partitions[i]})
        able = _readers_of(paths, readable)
        worker = min(able, key=lambda w: (load_bytes[w], w))
        load_bytes[worker] += sizes[i]
        # who may read it if ``worker`` leaves: none named where every worker found its files
        # (a shared file system: any worker may, a restart too). Named, they are pickled into
        # every task (and its token): 25 KB a task on 1,000 workers, for nothing
        found = () if len(able) == len(readable) else tuple(sorted(able))
        # one tuple for every partition of the same readers, which the graph's pickle then
        # writes once
        readers = seen.setdefault(found, found)
        placed[i] = tuple(
            dataclasses.replace(s, worker=worker, readers=readers) for s in partitions[i]
        )
    return [placed[i] for i in range(len(partitions))]


def _shards_of(node: Any) -> tuple[Shard, ...]:
    """The shards a task loads, looking inside fused tasks, as it loads them (narrowed to the
    columns a selection pushed into the read); none for other tasks."""
    if not isinstance(node, Task):
        return ()
    if node.func in (load_chunk, load_partition) and node.args:
        arg, columns = node.args[0], node.kwargs.get("columns")
        arg = arg.value if isinstance(arg, DataNode) else arg
        columns = columns.value if isinstance(columns, DataNode) else columns
        shards = (s for s in (arg if isinstance(arg, tuple) else (arg,)) if isinstance(s, Shard))
        return tuple(s if columns is None else parquet.projected(s, columns) for s in shards)
    if node.has_subgraph():
        return tuple(shard for inner in node.args[0].values() for shard in _shards_of(inner))
    return ()


def placed_read(node: Any) -> tuple[str, int] | None:
    """The worker a read task will run on and about the bytes it makes (decoded, not as
    stored), where every shard it loads was placed on one worker (:class:`PlacementPlugin` pins
    the task there); None for any other task. A shuffle of a read plans on this before the
    read has run: its memory check and how many outputs it builds at once."""
    shards = _shards_of(node)
    workers = {shard.worker for shard in shards}
    worker = workers.pop() if len(workers) == 1 else None
    return None if worker is None else (worker, sum(shard.decoded_bytes for shard in shards))


class PlacementPlugin(SchedulerPlugin):
    """Restricts every task that loads a shard to the worker placement chose for it."""

    name = "gpudirect-placement"
    idempotent = True

    def update_graph(self, scheduler: Scheduler, *, tasks: list[Key], **kwargs: Any) -> None:
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None:
                continue
            shards = _shards_of(ts.run_spec)
            if not any(shard.worker is not None for shard in shards):
                continue
            found = _found(shards)
            if found == set():  # no worker found every file it loads: it fails at once
                ts.run_spec = Task(ts.key, unreadable_together, *_apart(shards))
                continue
            # gone or retiring already: the others that found its files (else any worker); of
            # those, where the caller restricted it too, the ones the caller allows
            able = _pin(scheduler, ts, shards, found)
            if able:
                ts.worker_restrictions = able
                # Distributed lets a task run on its worker restrictions or its hosts: kept,
                # the caller's hosts let the read run on any worker there (the one placement
                # chose is among them), not the one a shuffle's stage waits for it on
                ts.host_restrictions = None
                ts.loose_restrictions = False
            # else the caller's own restrictions, if any, stand: where those workers did not
            # find its files, the read there fails naming the file, rather than wait for ever

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        """The shards placed on ``worker`` may now run on the other workers that found their
        files (node-local copies), or anywhere where none of those is left (other tasks
        restricted to it keep their restriction): those the scheduler has already found no
        worker for are sent back to be scheduled again. Dropped, not loosened: a task in
        ``no-worker`` is taken up when a worker joins by its valid workers alone, so a read
        loosened to a gone worker that found none running (the only one, or all, died) would
        wait for ever."""
        again: dict[Key, TaskStateState] = {}
        for ts in scheduler.tasks.values():
            held = ts.worker_restrictions
            if not held or worker not in held or ts.loose_restrictions or ts.run_spec is None:
                continue
            shards = _shards_of(ts.run_spec)
            named = {w for shard in shards for w in (shard.worker, *shard.readers)}
            if not shards or not held <= named:
                continue  # not a restriction placement made
            able = _pin(scheduler, ts, shards, _found(shards), worker)
            # none: the caller's own restrictions, if any, as the caller gave them
            workers, hosts = _callers(scheduler, ts)
            ts.worker_restrictions = able or workers or None
            ts.host_restrictions = None if able else hosts or None
            ts.loose_restrictions = not able and _loose(ts)
            if ts.state == "no-worker":
                again[ts.key] = "waiting"
        if again:
            scheduler.transitions(again, stimulus_id=f"gpudirect-placement-left-{time()}")


def _found(shards: tuple[Shard, ...]) -> set[str] | None:
    """The workers that found every file ``shards`` are of; None where every worker found
    each (a shard that names no readers). Shards of several reads, which Dask fused into one
    task (``dd.concat([a, b], axis=1)``, ``a.x + b.y``), may have been placed apart."""
    found: set[str] | None = None
    for shard in shards:
        if shard.readers:
            found = set(shard.readers) if found is None else found & set(shard.readers)
    return found


def _restriction(
    scheduler: Scheduler,
    shards: tuple[Shard, ...],
    found: set[str] | None,
    gone: str | None = None,
    fits: Callable[[str], bool] = lambda worker: True,
) -> set[str] | None:
    """Where a task that loads ``shards`` may run: the worker placement chose for the first of
    them that is in the cluster, not retiring (not ``gone``), ``fits`` the task (the caller's
    own restrictions: :func:`_fits`) and found every file the task loads (``found``, as
    :func:`_found` gives it; a task of one read: its own worker); else the others that found
    them all, fit it and are in the cluster, not retiring; None (any worker the caller's
    restrictions allow) where none of those is left, or every worker found them."""
    for worker in dict.fromkeys(shard.worker for shard in shards):
        if worker is not None and worker != gone and staying(scheduler, worker):
            if (found is None or worker in found) and fits(worker):
                return {worker}
    if found is None:
        return None
    return {w for w in found if w != gone and staying(scheduler, w) and fits(w)} or None


def _pin(
    scheduler: Scheduler,
    ts: TaskState,
    shards: tuple[Shard, ...],
    found: set[str] | None,
    gone: str | None = None,
) -> set[str] | None:
    """:func:`_restriction` among the workers the caller's own restrictions of ``ts`` allow
    (:func:`_fits`); where the caller's workers were only preferred (``allow_other_workers``)
    and none of them found its files, among the others that have the resources it asks for.
    None where every worker found them: the caller's restrictions alone then stand."""
    able = _restriction(scheduler, shards, found, gone, _fits(scheduler, ts))
    if able is None and found is not None and _loose(ts):
        able = _restriction(scheduler, shards, found, gone, _fits(scheduler, ts, strict=False))
    return able


def _loose(ts: TaskState) -> bool:
    """Whether the caller let ``ts`` run on other workers than those it named
    (``allow_other_workers``), as its annotations keep it."""
    annotations = ts.annotations or {}
    return bool(annotations.get("allow_other_workers", annotations.get("loose_restrictions")))


def _callers(scheduler: Scheduler, ts: TaskState) -> tuple[set[str], set[str]]:
    """The worker addresses and the hosts the caller restricted ``ts`` to
    (``dask.annotate(workers=...)``, ``client.compute(..., workers=...)``), as Distributed
    reads its annotations (its ``worker_restrictions`` and ``host_restrictions`` are
    placement's once the plugin has pinned it); both empty where none. A name that is no
    address or alias of a worker here counts as a host, as Distributed counts it: a worker
    that left named by its ``name`` (an int where ``LocalCluster`` names them, kept as its
    string: Distributed's hosts are strings) then matches no worker, and the task waits for
    it, as Distributed's own restriction to it does."""
    annotations = ts.annotations or {}
    named = annotations.get("workers", annotations.get("restrictions"))
    addresses: set[str] = set()
    hosts: set[str] = set()
    for name in [named] if isinstance(named, str) else named or ():
        try:
            addresses.add(scheduler.coerce_address(name))
        except ValueError:  # a host name (or the string name of a worker that left)
            hosts.add(name)
        except TypeError:  # the name of a worker that left, not a string: no host's
            hosts.add(str(name))
    return addresses, hosts


def _fits(scheduler: Scheduler, ts: TaskState, strict: bool = True) -> Callable[[str], bool]:
    """Whether a worker meets the caller's own restrictions of ``ts``: the resources it asks
    for (``dask.annotate(resources=...)``, which only some workers may have) and, ``strict``,
    the workers or hosts it was restricted to. Pinned to a worker without them, a read waited
    in ``no-worker`` for ever; pinned to another than the caller named, it ignored them (Dask's
    own readers run where they say)."""
    needs = ts.resource_restrictions or {}
    workers, named_hosts = _callers(scheduler, ts) if strict else (set(), set())
    hosts = {scheduler.coerce_hostname(h) for h in named_hosts}

    def fits(worker: str) -> bool:
        ws = scheduler.workers.get(worker)
        if ws is None:
            return False
        if any(ws.resources.get(name, 0) < amount for name, amount in needs.items()):
            return False
        return not (workers or hosts) or worker in workers or ws.host in hosts

    return fits


def _apart(shards: tuple[Shard, ...]) -> tuple[str, str]:
    """For ``shards`` of which no worker found every file (reads of datasets on different
    nodes' own disks that Dask fused into one task): the first file that none found with those
    before it, and why it cannot be loaded with them."""
    k = next(k for k in range(len(shards)) if _found(shards[: k + 1]) == set())
    shard, before = shards[k], [s for s in shards[:k] if s.readers]
    other = next((s for s in before if not set(s.readers) & set(shard.readers)), before[0])
    return shard.path, (
        f"cannot be loaded in one task with {other.path}: no worker found both "
        f"(this file: {', '.join(shard.readers)}; that one: {', '.join(other.readers)}). "
        "Dask fused reads of several datasets into one task (dd.concat([a, b], axis=1), "
        "a.x + b.y, a.assign(y=b.y)...): persist each read (a = a.persist()) before "
        "combining them"
    )


def staying(scheduler: Scheduler, worker: str) -> bool:
    """Whether ``worker`` is in the cluster and not retiring: a task may be pinned to it (a
    retiring one is given none)."""
    ws = scheduler.workers.get(worker)
    return ws is not None and ws.status != Status.closing_gracefully
