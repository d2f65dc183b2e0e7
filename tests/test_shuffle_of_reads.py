"""``dg.shuffle`` of a read that was not persisted: the shuffle starts while the files are read.

A ``dg.read_parquet`` partition is pinned to the worker placement chose, so the shuffle plans on
those workers before any file is read, starts its stages at once, and each stage takes its
inputs as its worker finishes reading them: no round trip to the client between the read and
the shuffle, and a worker that finished reading splits while the others still read. What a user
relies on stays: the same partitions as a shuffle of the persisted read, a file that changed
named in the user's process, a worker that dies while reading failing the shuffle by name, and
the same collection shuffled again once that worker is gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, Event, Future, WorkerPlugin, futures_of, wait
from distributed.client import FutureCancelledError
from util import (
    HANG_GUARD,
    assert_hash_partitions,
    assert_released,
    later,
    owner_of_rows,
    partitions,
    start_cluster,
)

import dask_gpudirect as dg
from dask_gpudirect.placement import placed_read
from dask_gpudirect.shuffle import coordinator
from dask_gpudirect.shuffle.plugin import service


def write_files(directory, count: int = 6, rows: int = 2000) -> list[str]:
    """``count`` Parquet files of a key with repeats across files and two value columns."""
    paths = []
    for k in range(count):
        frame = pd.DataFrame(
            {"k": (np.arange(rows) * 7 + k) % 501, "v": np.arange(rows) + k * rows}
        )
        frame["w"] = frame["v"] * 0.5
        paths.append(str(directory / f"part-{k}.parquet"))
        frame.to_parquet(paths[-1], index=False)
    return paths


def per_file(paths: list[str]) -> pd.DataFrame:
    """The files end to end, each with its own index from 0: a partition per file, as read."""
    return pd.concat([pd.read_parquet(path) for path in paths])


def _stage_phases(dask_worker) -> dict[str, float]:
    return service(dask_worker).last_phases


def test_a_shuffle_of_a_read_takes_its_inputs_as_they_are_read(tcp, tmp_path):
    paths = write_files(tmp_path)
    df = dg.read_parquet(paths, blocksize=1, client=tcp)  # a partition per file, both workers
    out = dg.shuffle(df, "k", npartitions=5, client=tcp)
    # the client never waited for the reads: the stages did, each for its own worker's
    assert "inputs" not in coordinator.last_phases, coordinator.last_phases
    stages = tcp.run(_stage_phases)
    assert len(stages) == 2 and all("wait for inputs" in p for p in stages.values()), stages
    expected = per_file(paths)
    assert_hash_partitions(partitions(tcp, out), expected, "k", 5)

    # a read persisted first gives the very same partitions, the inputs waited for first
    again = dg.shuffle(df.persist(), "k", npartitions=5, client=tcp)
    assert "inputs" in coordinator.last_phases, coordinator.last_phases
    assert_hash_partitions(partitions(tcp, again), expected, "k", 5)


def test_a_read_shuffled_without_its_index_as_bench_etl_shuffles_it(tcp, tmp_path):
    """``ignore_index=True`` on a read shuffled as it is read (``bench etl``'s pipeline): each
    output holds its rows in file order, labelled from 0."""
    paths = write_files(tmp_path)
    df = dg.read_parquet(paths, blocksize=1, client=tcp)
    out = dg.shuffle(df, "k", npartitions=5, client=tcp, ignore_index=True)
    assert "inputs" not in coordinator.last_phases, coordinator.last_phases
    expected = per_file(paths)
    where = owner_of_rows(expected, "k", 5)
    for j, part in enumerate(partitions(tcp, out)):
        pd.testing.assert_frame_equal(part, expected[where == j].reset_index(drop=True))


def test_a_selection_of_a_read_is_shuffled_as_it_is_read(tcp, tmp_path):
    """A read narrowed by a later selection (only its columns' chunks read) is still a read
    placed on its workers: the shuffle takes its partitions as they are read."""
    paths = write_files(tmp_path)
    df = dg.read_parquet(paths, blocksize=1, client=tcp)[["k", "w"]]
    out = dg.shuffle(df, "k", npartitions=5, client=tcp)
    assert "inputs" not in coordinator.last_phases, coordinator.last_phases
    assert list(out.columns) == ["k", "w"]
    assert_hash_partitions(partitions(tcp, out), per_file(paths)[["k", "w"]], "k", 5)


def test_progress_counts_the_inputs_as_they_are_read(tcp, tmp_path, capsys):
    """``progress=True`` on a shuffle of a read: the inputs counted as the workers read them,
    then the pieces received."""
    paths = write_files(tmp_path)
    df = dg.read_parquet(paths, blocksize=1, client=tcp)
    out = dg.shuffle(df, "k", npartitions=5, client=tcp, progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "dg.shuffle" in line]
    read = [line for line in lines if "input partitions" in line]
    assert read and read[-1].startswith("dg.shuffle: input partitions: 6/6 (100%)"), lines
    assert re.match(r"dg.shuffle \w+: pieces received: (\d+)/\1 \(100%\)", lines[-1]), lines
    assert_hash_partitions(partitions(tcp, out), per_file(paths), "k", 5)


def test_a_frame_that_is_not_a_read_is_computed_before_its_shuffle(tcp, tmp_path):
    """A partition Dask may compute anywhere (here: two reads' partitions joined) cannot be
    planned on before it exists: the inputs are computed, then shuffled."""
    paths = write_files(tmp_path, count=4)
    df = dg.read_parquet(paths, blocksize=1, client=tcp).repartition(npartitions=2)
    out = dg.shuffle(df, "k", npartitions=3, client=tcp)
    assert "inputs" in coordinator.last_phases, coordinator.last_phases
    assert_hash_partitions(partitions(tcp, out), per_file(paths), "k", 3)


def test_a_file_changed_after_planning_is_named_in_the_users_process(tcp, tmp_path):
    """The read fails on its worker while that worker's stage waits for it: the user gets the
    read's own error, naming the file, not a shuffle error; the cluster shuffles on."""
    paths = write_files(tmp_path)
    df = dg.read_parquet(paths, blocksize=1, client=tcp)
    changed = change(paths[3])
    with pytest.raises(dg.InputError, match=f"{changed}: changed since it was planned"):
        dg.shuffle(df, "k", client=tcp)
    fresh = dg.read_parquet(paths, blocksize=1, client=tcp)
    out = dg.shuffle(fresh, "k", npartitions=4, client=tcp)
    assert_hash_partitions(partitions(tcp, out), per_file(paths), "k", 4)


def change(path: str) -> str:
    """Write other rows to ``path`` after it was planned (a later write even on a coarse
    clock)."""
    pd.DataFrame({"k": [1, 2], "v": [3, 4], "w": [0.5, 1.0]}).to_parquet(path, index=False)
    later(path)
    return path


def _held(keys: list, dask_worker=None) -> list:
    return [key for key in keys if key in dask_worker.data]


def test_a_read_error_caught_by_the_user_keeps_none_of_their_results_alive(tcp, tmp_path):
    """A read's error, raised in the user's process by the shuffle that waited for it, holds
    none of the frames it passed through: a result the same function makes after catching it
    leaves the workers once dropped. (Raised as the client's own record of the failed read, it
    kept that function's frame, and the result in it, until the client closed.)"""
    paths = write_files(tmp_path)

    def shuffle_after_a_failed_one() -> list:
        df = dg.read_parquet(paths, blocksize=1, client=tcp)
        change(paths[3])
        with pytest.raises(dg.InputError, match="changed since it was planned"):
            dg.shuffle(df, "k", client=tcp)
        out = dg.shuffle(dg.read_parquet(paths, blocksize=1, client=tcp), "k", client=tcp)
        assert sum(len(part) for part in partitions(tcp, out)) == 6 * 2000 - 1998
        return [future.key for future in futures_of(out)]

    assert_released(tcp, _held, shuffle_after_a_failed_one())


class Priorities(WorkerPlugin):
    """Records each task's priority as the worker gets it ready to run (lower runs first)."""

    name = "priorities"

    def setup(self, worker):
        self.worker = worker
        self.seen: dict = {}

    def transition(self, key, start, finish, **kwargs):
        if finish == "ready":
            self.seen[key] = self.worker.state.tasks[key].priority


def _order_of_stage_and_reads(dask_worker) -> tuple[list, list]:
    seen = dask_worker.plugins[Priorities.name].seen
    stages = [p for key, p in seen.items() if str(key).startswith("gpudirect-shuffle")]
    reads = [p for key, p in seen.items() if "gpudirect-read" in str(key)]
    return stages, reads


def test_a_stage_runs_before_its_workers_waiting_reads(tcp, tmp_path):
    """A shuffle's stage comes before every read waiting on its worker, whichever of the
    session's graphs the read is of: on a worker of one thread (dask-cuda's default) it runs
    first, secedes at once and splits each chunk as it is read. (By Dask's own order, from the
    scheduler's generation of each graph and the worker's count of arrivals, a stage could
    go behind its worker's reads and start only once it had read them all.)"""
    paths = write_files(tmp_path)
    tcp.register_plugin(Priorities())
    try:
        for _ in range(2):
            df = dg.read_parquet(paths, blocksize=1, client=tcp)
            out = dg.shuffle(df, "k", npartitions=5, client=tcp)
            assert_hash_partitions(partitions(tcp, out), per_file(paths), "k", 5)
        orders = tcp.run(_order_of_stage_and_reads)
    finally:
        tcp.unregister_worker_plugin(Priorities.name)
    for stages, reads in orders.values():
        assert len(stages) == 2 and reads, orders
        assert max(stages) < min(reads), orders


class DieWhenReading(WorkerPlugin):
    """Ends this worker's process when it starts a read task: a real death mid-read."""

    name = "die-when-reading"

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and "gpudirect-read" in str(key):
            os._exit(1)


async def _add_plugin(dask_worker) -> None:
    await dask_worker.plugin_add(DieWhenReading())


@pytest.mark.timeout(HANG_GUARD)
def test_a_worker_that_dies_reading_fails_the_shuffle_by_name_and_it_runs_again(tmp_path):
    """The victim dies as it starts its first read: before the shuffle's plan asked it for its
    room (its reads then run on the other worker and the shuffle completes) or after its stage
    started (the shuffle fails, naming it). Either way nothing partial comes back, and the same
    collection shuffles again once the worker is gone."""
    paths = write_files(tmp_path)
    expected = per_file(paths)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)  # both before planning: the victim gets reads to die on
        df = dg.read_parquet(paths, blocksize=1, client=client)
        victim = sorted(client.nthreads())[0]
        client.run(_add_plugin, workers=[victim])  # on the victim only
        try:
            out = dg.shuffle(df, "k", npartitions=4, client=client)
        except dg.ShuffleError as exc:
            assert f"worker {victim} left the cluster" in str(exc), exc
        else:
            assert_hash_partitions(partitions(client, out), expected, "k", 4)
        assert victim not in client.nthreads()  # it did die
        client.wait_for_workers(2, timeout=300)  # the nanny's restart, at a new address
        # the same collection: its reads were placed on a worker that is gone, so they are
        # computed wherever the scheduler puts them, then shuffled
        out = dg.shuffle(df, "k", npartitions=4, client=client)
        assert "inputs" in coordinator.last_phases, coordinator.last_phases
        assert_hash_partitions(partitions(client, out), expected, "k", 4)


def test_a_read_in_memory_whose_placed_worker_left_is_waited_for_before_its_shuffle(tmp_path):
    """A read placed on a worker that left (``client.restart_workers``) runs wherever the
    scheduler puts it. Held in memory elsewhere when a shuffle plans, it may be released and run
    again on a third worker before the stage takes it (the user's last future of it let go as
    the shuffle's persist makes new ones): a stage that waited for it on its holder then waited
    for ever. So a shuffle whose reads were placed on a worker that is gone waits for its inputs
    first, held or not, and plans by where they are."""
    paths = write_files(tmp_path)
    expected = per_file(paths)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        df = dg.read_parquet(paths, blocksize=1, client=client)
        held = df.persist()
        wait(held)
        victim = sorted(client.nthreads())[0]
        client.restart_workers([victim], timeout=HANG_GUARD)  # a new worker at a new address
        wait(held)  # its reads read again by the workers there are, and held
        optimized = df.optimize()
        graph = optimized.__dask_graph__()
        placed = [placed_read(graph[key]) for key in optimized.__dask_keys__()]
        assert victim in {worker for worker, _ in placed}
        prepared = client.sync(
            client.scheduler.gpudirect_shuffle_prepare,
            keys=[f.key for f in futures_of(held)],
            target="host",
            placed=placed,
            timeout=30,
        )
        assert prepared == {"unplaced": True}, prepared
        out = dg.shuffle(df, "k", npartitions=4, client=client)
        assert "inputs" in coordinator.last_phases, coordinator.last_phases
        assert_hash_partitions(partitions(client, out), expected, "k", 4)


def _wait_for_event(name: str) -> None:
    Event(name).wait()


def _stage_states(dask_scheduler) -> list[str]:
    return [
        ts.state
        for ts in dask_scheduler.tasks.values()
        if str(ts.key).startswith("gpudirect-shuffle-")
    ]


@contextlib.contextmanager
def shuffling_while_busy(client, df) -> Iterator[concurrent.futures.Future]:
    """``dg.shuffle(df)`` in a thread while each worker's one thread waits for the event
    "go": yields it once its stages were submitted (no read or stage has run), and lets the
    workers go on leaving. Not waited for where it hangs: the test fails and the cluster
    closes."""
    busy = [
        client.submit(_wait_for_event, "go", workers=[w], pure=False) for w in client.nthreads()
    ]
    pool = ThreadPoolExecutor(1)
    try:
        running = pool.submit(dg.shuffle, df, "k", npartitions=4, client=client)
        deadline = time.monotonic() + HANG_GUARD
        while not client.run_on_scheduler(_stage_states):
            assert not running.done(), running.exception()
            assert time.monotonic() < deadline, "the stages never started"
            time.sleep(0.05)
        yield running
    finally:
        Event("go", client=client).set()
        pool.shutdown(wait=False)
        del busy


def test_a_read_cancelled_while_its_stage_waits_for_it_fails_the_shuffle(tmp_path):
    """The user cancels a read (``client.cancel`` of its key) while the shuffle of it waits
    for it: the scheduler forgets it, and a stage that waits for it on its worker (no
    dependent of it, so not cancelled with it) waited for ever. The shuffle ends, with the
    read's CancelledError, as a shuffle that waits for its inputs first ends; the cluster
    shuffles on."""
    paths = write_files(tmp_path)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        df = dg.read_parquet(paths, blocksize=1, client=client)
        with shuffling_while_busy(client, df) as running:
            client.cancel([Future(key, client) for key in df.optimize().__dask_keys__()])
        with pytest.raises(FutureCancelledError):
            running.result(timeout=HANG_GUARD)
        out = dg.shuffle(dg.read_parquet(paths, blocksize=1, client=client), "k", client=client)
        assert_hash_partitions(partitions(client, out), per_file(paths), "k", 6)


def test_a_held_read_whose_copy_is_dropped_before_its_stage_takes_it(tmp_path):
    """A read the user holds (persisted) on two workers (``client.replicate``, or a copy a
    task elsewhere fetched) when a shuffle of it plans: Dask's memory manager drops extra
    copies every 2 s, and the one dropped may be where the shuffle planned to take it. The
    stage waited for it to be computed on its worker, for ever; it now takes it from where
    it is."""
    paths = write_files(tmp_path)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        # the test drops the copies itself, where the stage plans to take them: the memory
        # manager's own tick (every 2 s) in between would drop either copy first, and then
        # _drop_copies would fail on a replica that is gone, or drop a key's last one
        client.amm.stop()
        df = dg.read_parquet(paths, blocksize=1, client=client)
        held = df.persist()
        wait(held)
        keys = [f.key for f in futures_of(held)]
        client.replicate(futures_of(held))
        first = sorted(client.nthreads())[0]  # the holder a stage takes an input from
        with shuffling_while_busy(client, df) as running:
            client.run_on_scheduler(_drop_copies, first, keys)
        out = running.result(timeout=HANG_GUARD)
        assert_hash_partitions(partitions(client, out), per_file(paths), "k", 4)


def _drop_copies(worker: str, keys: list, dask_scheduler=None) -> None:
    """As Dask's active memory manager drops extra copies of ``keys``: those on ``worker``
    (never a last copy: each must be on ``worker`` and one other)."""
    held = {key: {ws.address for ws in dask_scheduler.tasks[key].who_has or ()} for key in keys}
    assert all(worker in h and len(h) > 1 for h in held.values()), held
    dask_scheduler.request_remove_replicas(worker, keys, stimulus_id=f"test-drop-{time.time()}")


def _fails_once(part: pd.DataFrame, marks: str) -> pd.DataFrame:
    """``part`` unchanged, but the first time a partition is computed it raises: a transient
    fault, as a flaky storage read makes one. A file per partition remembers that it failed."""
    mark = os.path.join(marks, f"failed-{int(part['v'].iloc[0])}")
    if not os.path.exists(mark):
        open(mark, "w").close()
        raise OSError("transient")
    return part


@pytest.mark.timeout(HANG_GUARD)
def test_a_read_retried_after_a_transient_fault_is_shuffled(tmp_path):
    """``dask.annotate(retries=...)`` around the shuffle of a read that fails once per
    partition: the scheduler runs each read again on its worker, and the shuffle takes it,
    where its stage had failed the shuffle at the read's first error (the worker cannot know
    the scheduler retries it). The stage itself is not retried (it would find its run ended)."""
    paths = write_files(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        df = dg.read_parquet(paths, blocksize=1, client=client)
        flaky = df.map_partitions(_fails_once, str(marks), meta=df._meta)
        with dask.annotate(retries=2):
            out = dg.shuffle(flaky, "k", npartitions=4, client=client)
        assert len(os.listdir(marks)) == len(paths)  # every read did fail once
        assert_hash_partitions(partitions(client, out), per_file(paths), "k", 4)


def test_a_read_that_fails_for_good_under_retries_raises_its_own_error(tcp, tmp_path):
    """Retries spent, the read's own error reaches the caller, as without retries."""
    paths = write_files(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    df = dg.read_parquet(paths, blocksize=1, client=tcp)
    flaky = df.map_partitions(_fails_once, str(marks), meta=df._meta)
    with dask.annotate(retries=0), pytest.raises(OSError, match="transient"):
        dg.shuffle(flaky, "k", npartitions=4, client=tcp)


def test_a_shuffle_under_resources_its_reads_ask_for_finishes(tmp_path):
    """``dask.annotate(resources={"X": 1})`` on workers of one ``X``: the reads ask for it, and
    the stages, which wait for those reads while seceded, must not hold it (a task holds its
    resources until it ends, seceded or not): no read would ever run and the shuffle waited
    for ever."""
    paths = write_files(tmp_path)
    with (  # the caller's thread outlives the client, whose close ends a shuffle that hangs
        ThreadPoolExecutor(1) as caller,
        start_cluster("tcp", n_workers=2, threads=1, resources={"X": 1}) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)

        def shuffled():
            with dask.annotate(resources={"X": 1}):
                df = dg.read_parquet(paths, blocksize=1, client=client)
                return dg.shuffle(df, "k", npartitions=4, client=client)

        out = caller.submit(shuffled).result(timeout=120)  # before the fix: never
        assert_hash_partitions(partitions(client, out), per_file(paths), "k", 4)


def _gate(part: pd.DataFrame) -> pd.DataFrame:
    assert Event("gpudirect-test-read-go").wait(timeout=HANG_GUARD)
    return part


def _fixed_ports(cluster, count: int) -> None:
    """``count`` workers on the cluster, each on a port of its own that its restarts keep
    (``dask worker --worker-port``)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    (spec,) = cluster.new_worker_spec().values()
    for i, port in enumerate(ports):
        cluster.worker_spec[f"fixed-{i}"] = {
            **spec,
            "options": {**spec["options"], "worker_port": port},
        }
    cluster.sync(cluster._correct_state)


def test_a_read_whose_worker_restarted_at_its_address_is_waited_for(tmp_path, monkeypatch):
    """The read's worker (a fixed port) restarts while the shuffle persists the read: placement
    lets the read run anywhere, it runs on the other worker, and the worker comes back at the
    same address before the shuffle plans. The planning's "placed worker left" check compared
    addresses, so a stage on the restarted worker waited for ever for a read it never ran."""
    (path,) = write_files(tmp_path, count=1)
    with start_cluster("tcp", n_workers=0, threads=1) as cluster, Client(cluster) as client:
        _fixed_ports(cluster, 2)
        client.wait_for_workers(2)
        df = dg.read_parquet(path, client=client)
        df = df.map_partitions(_gate, meta=df._meta)  # fused into the read: held as it runs
        optimized = df.optimize()
        graph = optimized.__dask_graph__()
        ((victim, _),) = [placed_read(graph[key]) for key in optimized.__dask_keys__()]
        persist, prepare = client.persist, coordinator._prepare
        go = Event("gpudirect-test-read-go", client=client)

        def restarted_around_persist(*args, **kwargs):
            with ThreadPoolExecutor(1) as pool:
                restart = pool.submit(client.restart_workers, [victim], timeout=HANG_GUARD)
                while victim in client.nthreads():  # gone: the scheduler lets the read go
                    assert not restart.done(), restart.result()
                    time.sleep(0.05)
                persisted = persist(*args, **kwargs)
                restart.result()  # back at the same address
            assert victim in client.nthreads()
            return persisted

        def prepared(*args, **kwargs):
            result = prepare(*args, **kwargs)
            go.set()  # the read finishes only once the shuffle planned
            return result

        monkeypatch.setattr(client, "persist", restarted_around_persist)
        monkeypatch.setattr(coordinator, "_prepare", prepared)
        pool = ThreadPoolExecutor(1)
        try:
            call = pool.submit(dg.shuffle, df, "k", npartitions=3, client=client)
            out = call.result(timeout=60)  # the shuffle takes about a second
        finally:
            pool.shutdown(wait=False)
        assert_hash_partitions(partitions(client, out), per_file([path]), "k", 3)


def _late_reads(scheduler, seconds: float) -> None:
    """Make ``scheduler`` (a LocalCluster's, in this process) take each graph of reads
    ``seconds`` late off its client's stream: the shuffle's planning request, on a comm of
    its own, then comes first."""
    handler = scheduler.stream_handlers["update-graph"]

    async def late(**msg):
        if any("read-parquet" in str(key) for key in msg.get("keys", ())):
            await asyncio.sleep(seconds)
        return await handler(**msg)

    scheduler.stream_handlers["update-graph"] = late


@pytest.mark.parametrize("where", ["worker", "host"])
def test_a_shuffle_of_reads_the_caller_restricts_finishes(tmp_path, where):
    """``dask.annotate(workers=[a])`` (or the host of every worker) around ``dg.shuffle`` of a
    read. Placement pins a read among the workers the caller allows, which need not be the one
    it was placed on; the shuffle planned before the read's graph came (its persist goes on the
    batched stream) took the placed worker as the read's, and its stage there waited for ever.
    Under a host the pin did not hold: Distributed runs a task on its workers or its hosts."""
    paths = write_files(tmp_path)
    with (  # the caller's thread outlives the client, whose close ends a shuffle that hangs
        ThreadPoolExecutor(1) as caller,
        start_cluster("tcp", n_workers=2, threads=1) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        a = sorted(client.nthreads())[0]
        _late_reads(cluster.scheduler, 1.0 if where == "worker" else 0.0)

        def shuffled():
            with dask.annotate(workers=[a] if where == "worker" else ["127.0.0.1"]):
                df = dg.read_parquet(paths, blocksize=1, client=client)
                return dg.shuffle(df, "k", npartitions=3, client=client)

        out = caller.submit(shuffled).result(timeout=120)  # before the fix: never
        assert_hash_partitions(partitions(client, out), per_file(paths), "k", 3)
