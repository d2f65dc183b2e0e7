"""A worker process that dies while it loads: its shards are read again by the others.

A test plugin on one worker ends its process (``os._exit``) the moment that worker starts a
loading task: a real worker death mid-load, not a mock. The loading tasks are restricted to their
worker while it lives (work stealing must not move them) and unrestricted once it has left, so the
scheduler hands the lost shards to workers that can read them, and the result is complete.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pandas as pd
import psutil
import pytest
from distributed import Client, Event, WorkerPlugin, wait
from object_servers import Gate
from util import (
    HANG_GUARD,
    assert_same_frame,
    clear_ledgers,
    error_while_stopped,
    expected_parquet,
    shard_of,
    shards_of,
    start_cluster,
    stopped,
)

import dask_gpudirect as dg
from dask_gpudirect import known_workers


class DieWhenLoading(WorkerPlugin):
    """Ends this worker's process when it starts a dask-gpudirect loading task."""

    name = "die-when-loading"

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and "gpudirect-read" in str(key):
            os._exit(1)


def test_shards_of_a_worker_that_died_are_read_by_the_others(tmp_path):
    expected = np.arange(60_000, dtype=np.int64)
    np.save(tmp_path / "x.npy", expected)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        arr = dg.read_binary(tmp_path / "x.npy", blocksize=40_000, client=client)  # 12 shards
        victim = sorted(client.nthreads())[0]
        placed_on_victim = sum(s.worker == victim for s in _shards(arr))
        assert placed_on_victim  # balanced placement gave it shards to lose
        client.run(_add_plugin, workers=[victim])  # on the victim only, not kept by the scheduler
        np.testing.assert_array_equal(client.compute(arr).result(), expected)
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert victim not in client.nthreads()  # it did die
        assert victim not in readers and readers  # its shards came from the other workers
        client.wait_for_workers(
            2, timeout=300
        )  # the nanny's restart, done before the cluster closes


def test_shards_of_the_only_worker_that_died_are_read_by_its_restart(tmp_path):
    """The only worker dies mid-read (as under the nanny's or the kernel's memory kill): the
    read waits in ``no-worker`` until the nanny's restart joins, which reads it. Loosened to the
    gone worker, the reads were never given to the new one (the scheduler takes up a task in
    ``no-worker`` by its valid workers alone): the compute waited for ever."""
    expected = np.arange(60_000, dtype=np.int64)
    np.save(tmp_path / "x.npy", expected)
    with start_cluster("tcp", n_workers=1, threads=1) as cluster, Client(cluster) as client:
        arr = dg.read_binary(tmp_path / "x.npy", blocksize=40_000, client=client)
        (victim,) = client.nthreads()
        client.run(_add_plugin, workers=[victim])  # not kept: the restarted worker lives
        np.testing.assert_array_equal(client.compute(arr).result(timeout=HANG_GUARD), expected)
        (reader,) = client.nthreads()
        assert reader != victim  # read by the restart


def test_shards_of_a_retiring_worker_are_read_by_the_others(tmp_path):
    """``retire_workers(..., close_workers=False, remove=False)`` keeps a worker in the cluster,
    retiring (``closing_gracefully``) for good, and gives it no task: reads placed on it before
    it retired run on the others (they waited in ``no-worker`` for ever)."""
    expected = np.arange(60_000, dtype=np.int64)
    np.save(tmp_path / "x.npy", expected)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        arr = dg.read_binary(tmp_path / "x.npy", blocksize=40_000, client=client)  # 12 shards
        retiring = sorted(client.nthreads())[0]
        assert any(s.worker == retiring for s in _shards(arr))
        client.retire_workers([retiring], close_workers=False, remove=False)
        np.testing.assert_array_equal(client.compute(arr).result(timeout=120), expected)
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert readers and retiring not in readers


def test_shards_of_a_dead_worker_on_a_shared_file_system_are_read_by_its_restart(tmp_path):
    """Every worker sees the file. The victim dies and its nanny restarts it (a new address);
    then its shards are read while the other worker's one thread is held: the restart reads
    them. (Restricted to the other workers that had found the file, the survivor alone, they
    waited for it while the restart idled.)"""
    expected = np.arange(60_000, dtype=np.int64)
    np.save(tmp_path / "x.npy", expected)
    # no queued task goes to a worker whose one thread is held
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        cluster = start_cluster("tcp", n_workers=2, threads=1)
    with cluster, Client(cluster) as client:
        arr = dg.read_binary(tmp_path / "x.npy", blocksize=40_000, client=client)  # 12 shards
        victim, busy = sorted(client.nthreads())
        graph = dict(arr.__dask_graph__())
        keys = [k for k, task in graph.items() if shard_of(task).worker == victim]
        assert keys
        client.run(_die, workers=[victim], wait=False)
        deadline = time.monotonic() + HANG_GUARD
        while victim in client.nthreads() or len(client.nthreads()) < 2:
            assert time.monotonic() < deadline, "the nanny did not restart the victim"
            time.sleep(0.05)
        (restart,) = set(client.nthreads()) - {busy}
        started, release = Event(), Event()
        holder = client.submit(_hold_started, started.name, release.name, workers=[busy])
        assert started.wait(timeout=HANG_GUARD)
        try:
            read = client.get(graph, keys, sync=False)
            wait(read, timeout=120)  # while busy's one thread is held
            got = np.concatenate(client.gather(read))
        finally:
            release.set()
        holder.result()
        np.testing.assert_array_equal(
            np.sort(got),
            np.sort(np.concatenate([expected[k[1] * 5000 : (k[1] + 1) * 5000] for k in keys])),
        )
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert readers == {restart}, readers


async def _die() -> None:
    os._exit(1)


def _hold_started(started: str, release: str) -> None:
    """Keeps a worker thread until ``release`` is set, ``started`` set once it runs."""
    Event(started).set()
    Event(release).wait()


class DieWhenSurveyed(dg.GPUDirectPlugin):
    """The reader plugin, which ends this worker's process when a read's survey asks it what
    it sees: a worker killed while the client asks the workers, before any task."""

    def describe(self):
        os._exit(1)


def test_a_worker_that_dies_while_a_read_asks_the_workers_is_left_out(tmp_path):
    """The read is planned and read by the workers still there (it raised Distributed's
    ``CommClosedError`` from the survey's broadcast)."""
    expected = pd.DataFrame({"k": np.arange(2_000), "x": np.arange(2_000) * 0.5})
    for i in range(4):
        expected.iloc[i * 500 : (i + 1) * 500].to_parquet(tmp_path / f"part-{i}.parquet")
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        victim = sorted(client.nthreads())[0]
        client.run(_add_plugin, plugin=DieWhenSurveyed(), workers=[victim])
        df = dg.read_parquet(tmp_path, client=client)
        assert_same_frame(df.compute(), expected)
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert readers and victim not in readers
        client.wait_for_workers(2, timeout=300)  # the nanny's restart, before the cluster closes


def test_a_worker_that_dies_while_it_plans_a_read_leaves_its_files_to_the_others(
    http_url, local_data
):
    """Each worker plans one file (its footer's request held by the server) when one is
    killed: the other plans that file too, and reads both (it raised ``CommClosedError``)."""
    base, _, server = http_url
    urls = [f"{base}/pq/part-{k}.parquet" for k in range(2)]
    expected = expected_parquet([local_data / "pq" / f"part-{k}.parquet" for k in (0, 1)])
    gate = Gate()
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        victim = sorted(client.nthreads())[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        server.gate = gate
        try:
            with ThreadPoolExecutor(1) as pool:
                read = pool.submit(dg.read_parquet, urls, client=client)
                for _ in urls:
                    assert gate.arrived.acquire(timeout=HANG_GUARD), read.exception()
                victim_process = psutil.Process(pid)  # before the kill: its nanny reaps it
                os.kill(pid, signal.SIGKILL)
                victim_process.wait(timeout=HANG_GUARD)  # dead before it gets its footer
                gate.opened.set()
                df = read.result(timeout=HANG_GUARD)
        finally:
            server.gate = None
            gate.opened.set()
        assert_same_frame(df.compute(), expected)
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert readers and victim not in readers
        client.wait_for_workers(2, timeout=300)  # the nanny's restart, before the cluster closes


def _read(how: str, path, client: Client):
    if how == "parquet":
        return dg.read_parquet(path.with_suffix(".parquet"), client=client)
    return dg.read_binary(path.with_suffix(".npy"), client=client)


def _write(path) -> np.ndarray:
    expected = np.arange(2_000, dtype=np.int64)
    np.save(path.with_suffix(".npy"), expected)
    pd.DataFrame({"x": expected}).to_parquet(path.with_suffix(".parquet"))
    return expected


def _values(data) -> np.ndarray:
    out = data.compute()
    return out if isinstance(out, np.ndarray) else out["x"].to_numpy()


@pytest.mark.parametrize("how", ["parquet", "binary"])
def test_a_stopped_worker_fails_the_first_read_of_a_cluster_within_the_timeout(how, tmp_path):
    """The first read of a cluster sets the package's plugins up on the workers and asks each
    how it sees the paths: a worker stopped (SIGSTOP) before it held the read for as long as
    it stayed stopped. It is a ClusterError naming the worker and gpudirect.planning.timeout,
    and the cluster reads once the worker goes on."""
    expected = _write(tmp_path / "a")
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        victim = sorted(client.nthreads())[0]
        with dask.config.set({"gpudirect.planning.timeout": "3s"}):
            error = error_while_stopped(
                client,
                victim,
                lambda: _read(how, tmp_path / "a", client),
                dg.ClusterError,
                r"3 s \(gpudirect.planning.timeout\)",
            )
        assert victim in str(error) and "survey" in str(error)
        np.testing.assert_array_equal(_values(_read(how, tmp_path / "a", client)), expected)


def test_a_stopped_worker_fails_the_planning_of_a_read_within_the_timeout(tmp_path):
    """After a first read, a read of other files asks the scheduler alone for the survey (the
    workers see the client's files) and each worker to plan some of the files (two files: one
    each): a stopped worker is a ClusterError naming it, not a wait for as long as it stays
    stopped."""
    _write(tmp_path / "a")
    (tmp_path / "b").mkdir()
    expected = pd.DataFrame({"x": np.arange(2_000)})
    for i in range(2):
        expected.iloc[i * 1_000 : (i + 1) * 1_000].to_parquet(tmp_path / "b" / f"{i}.parquet")
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        for _ in range(2):  # the first registers the plugins; the second is remembered
            _read("parquet", tmp_path / "a", client)
        assert known_workers.recall(client) is not None
        victim = sorted(client.nthreads())[0]

        def read():
            return dg.read_parquet(tmp_path / "b", client=client)

        with dask.config.set({"gpudirect.planning.timeout": "3s"}):
            error = error_while_stopped(
                client, victim, read, dg.ClusterError, "gpudirect.planning.timeout"
            )
        assert victim in str(error) and "plan its files" in str(error)
        assert_same_frame(read().compute(), expected)


async def _add_plugin(dask_worker, plugin: WorkerPlugin | None = None) -> None:
    await dask_worker.plugin_add(plugin or DieWhenLoading())


def _shards(arr) -> list:
    """The Shards the loading tasks of ``arr`` read."""
    return list(shards_of(arr).values())


def test_a_busy_worker_keeps_its_shards_while_it_lives(tcp, tmp_path):
    """Work stealing hands queued tasks to idle workers; a shard's task must stay with the
    worker placement chose while that worker lives (on node-local disks only it can read the
    file). Its threads are held by other work while an idle worker could take its shards."""
    expected = np.arange(60_000, dtype=np.int64)
    np.save(tmp_path / "x.npy", expected)
    clear_ledgers(tcp)
    arr = dg.read_binary(tmp_path / "x.npy", blocksize=40_000, client=tcp)  # 12 shards
    busy = sorted(tcp.nthreads())[0]
    planned = {s.name: s.worker for s in _shards(arr)}
    release = Event()
    holders = [
        tcp.submit(_hold, release.name, i, workers=[busy], pure=False)
        for i in range(tcp.nthreads()[busy])
    ]
    result = tcp.compute(arr)
    # the idle worker reads its own shards, then idles while busy's wait: stealing's chance
    idle = sum(worker != busy for worker in planned.values())
    while len(dg.ledger_report.records(tcp).query("op == 'read'")) < idle:
        time.sleep(0.05)
    time.sleep(2)  # stealing balances every 100 ms: twenty chances to move busy's shards
    release.set()
    np.testing.assert_array_equal(result.result(), expected)
    wait(holders)
    reads = dg.ledger_report.records(tcp).query("op == 'read'")
    assert dict(zip(reads.shard, reads.worker, strict=True)) == planned


def _hold(event: str, i: int) -> int:
    """Keeps a worker thread until ``event`` is set."""
    Event(event).wait()
    return i


def written(directory, files: int) -> pd.DataFrame:
    """24,000 rows (``id``: 97 keys, ``x``) written to ``files`` Parquet files in ``directory``."""
    frame = pd.DataFrame({"id": np.arange(24_000) % 97, "x": np.arange(24_000)})
    rows = len(frame) // files
    for i in range(files):
        frame.iloc[i * rows : (i + 1) * rows].to_parquet(directory / f"{i}.parquet", index=False)
    return frame


@pytest.mark.parametrize("persisted", [False, True], ids=["read", "persisted"])
def test_a_shuffle_leaves_out_a_retiring_worker(persisted, tmp_path):
    """A worker retiring for good (``retire_workers(..., close_workers=False, remove=False)``,
    as the reads above) is given no task: a shuffle of a read placed on it, or of a frame it
    holds, runs its stages on the others. Its stage was pinned to it and never ran: the others
    waited for its pieces until ``gpudirect.shuffle.timeout`` and the shuffle failed."""
    frame = written(tmp_path, 6)
    limit = {"gpudirect.shuffle.timeout": "20s"}  # a hang before the fix fails fast
    with (
        dask.config.set(limit),
        start_cluster("tcp", n_workers=2, threads=1, config=limit) as cluster,
        Client(cluster) as client,
    ):
        df = dg.read_parquet(tmp_path, client=client)
        if persisted:
            df = df.persist()
            wait(df)
        retiring = sorted(client.nthreads())[0]
        if persisted:
            assert retiring in {w for ws in client.who_has(df).values() for w in ws}
        else:
            assert any(s.worker == retiring for s in shards_of(df).values())
        client.retire_workers([retiring], close_workers=False, remove=False)
        out = dg.shuffle(df, "id", client=client)  # was a ShuffleError after 20 s
        assert retiring not in {w for ws in client.who_has(out).values() for w in ws}
        assert_same_frame(out.compute(), frame, by=["x"])


def _sum_held_at_zero(started: str, release: str):
    """``then=`` of a shuffle: the output that holds key 0 says so and waits for ``release``
    (its stage, and so the shuffle, stays in flight); each output's sums of x by id."""

    def then(part):
        if (part.id == 0).any():
            Event(started).set()
            assert Event(release).wait(timeout=HANG_GUARD)
        return part.groupby("id").x.sum()

    return then


def _stages_done(dask_scheduler) -> int:
    """How many shuffle stages (string keys; the outputs' are tuples) are in memory."""
    return sum(
        isinstance(key, str) and key.startswith("gpudirect-shuffle-") and ts.state == "memory"
        for key, ts in dask_scheduler.tasks.items()
    )


def _to_close(dask_scheduler, target: int) -> list[str]:
    """What a cluster that scales down to ``target`` workers (``adapt``) would retire now."""
    return dask_scheduler.workers_to_close(target=target)


def test_a_cluster_scaling_down_keeps_the_workers_of_a_shuffle_in_flight(tmp_path):
    """``adapt`` retires the workers ``workers_to_close`` names. A shuffle participant whose
    stage has ended holds outputs the scheduler learns of only when every stage has ended: it
    looked idle and was retired, and the shuffle failed ("left the cluster during shuffle").
    Now none is named while the shuffle runs; once it is over, retiring them moves the outputs
    and later computes are right."""
    frame = written(tmp_path, 6)
    expected = frame.groupby("id").x.sum()
    with start_cluster("tcp", n_workers=3, threads=1) as cluster, Client(cluster) as client:
        df = dg.read_parquet(tmp_path, client=client).persist()
        wait(df)
        assert len({w for ws in client.who_has(df).values() for w in ws}) == 3  # 3 participants
        started, release = Event(), Event()
        then = _sum_held_at_zero(started.name, release.name)
        with ThreadPoolExecutor(1) as pool:
            shuffled = pool.submit(dg.shuffle, df, "id", npartitions=3, client=client, then=then)
            try:
                assert started.wait(timeout=HANG_GUARD)
                deadline = time.monotonic() + HANG_GUARD
                while client.run_on_scheduler(_stages_done) < 2:  # the other two have ended
                    assert time.monotonic() < deadline and not shuffled.done()
                    time.sleep(0.05)
                assert client.run_on_scheduler(_to_close, target=1) == []
            finally:
                release.set()
            out = shuffled.result(timeout=HANG_GUARD)
        # the shuffle is over: its workers may go, and its outputs with the one that stays
        retiring = client.run_on_scheduler(_to_close, target=1)
        assert len(retiring) == 2
        client.retire_workers(retiring, close_workers=True)
        assert set(client.nthreads()).isdisjoint(retiring)
        pd.testing.assert_series_equal(out.compute().sort_index(), expected)


def test_a_read_does_not_ask_a_retiring_worker(tmp_path):
    """A retiring worker (``closing_gracefully``) is given no read, and is not asked how it
    sees the paths either: one that answers nothing as it closes (stopped here, for good) held
    the read up until ``gpudirect.planning.timeout`` and failed it (under ``adapt``, a worker
    that closed as it was asked held it up for Distributed's connect timeout, 30 s)."""
    frame = written(tmp_path, 4)
    limit = {"gpudirect.planning.timeout": "20s"}  # a wait before the fix fails fast
    with (
        dask.config.set(limit),
        start_cluster("tcp", n_workers=2, threads=1) as cluster,
        Client(cluster) as client,
    ):
        dg.read_parquet(tmp_path, client=client).compute()  # the plugins set up, the paths seen
        retiring = sorted(client.nthreads())[0]
        client.retire_workers([retiring], close_workers=False, remove=False)
        with ThreadPoolExecutor(1) as pool, stopped(client, retiring):
            read = pool.submit(lambda: dg.read_parquet(tmp_path, client=client).compute())
            got = read.result(timeout=HANG_GUARD)  # was a ClusterError naming it, after 20 s
        assert_same_frame(got, frame, by=["x"])
