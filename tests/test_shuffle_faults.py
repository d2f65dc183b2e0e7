"""Shuffles that go wrong, and the limits that make them spill or refuse to start.

The destructive tests run on a cluster of their own per protocol (``tight``) whose workers keep
1 KiB of received pieces in host memory (every piece spills straight to disk) and 64 KiB on
disk. The limits reach the worker processes through each Nanny's ``config=``, as dotted keys: the
nanny hands them to its worker process on start and on every restart. Two other ways do not
survive a restart or do not work at all: ``dask.config.set`` around the cluster's start reaches
the first worker processes, but the nanny's copy of the config shares its nested dicts with the
client's, so leaving the ``with`` block resets what a restarted worker gets; and
``LocalCluster(env={"DASK_GPUDIRECT__SHUFFLE__HOST_LIMIT": ...})`` is overridden by the
client's whole config (gpudirect defaults included) that the nanny forwards.

Faults are real: a worker process killed with SIGKILL while its shuffle is in flight, a
connection aborted by the receiving worker, a peer slower than ``gpudirect.shuffle.timeout``. To
keep a shuffle in flight long enough, a test wraps one worker's ``gpudirect_shuffle_receive``
comm handler so it sleeps before receiving; the sleep is test instrumentation, the transfer
itself is untouched. Knobs read when a run starts (max-in-flight, timeout) are changed on the
running workers. Bad options, which need no cluster of their own, close the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import glob
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.sizeof import sizeof
from distributed import CancelledError, Client, Event, futures_of, get_worker, wait
from util import (
    HANG_GUARD,
    RECEIVE,
    assert_hash_partitions,
    clear_ledgers,
    compute,
    delay_receive,
    error_while_stopped,
    owner_of_rows,
    partitions,
    start_cluster,
    stopped,
    wait_for_file,
    worker_config,
)

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.bench.common import held_keys, wait_released
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.shuffle.plugin import START, ShuffleWorkerPlugin
from dask_gpudirect.shuffle.plugin import service as shuffle_service

# The worker-side helpers below travel to the worker processes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROTOCOLS = ["tcp", "ucxx"]
HOST_LIMIT = "1 KiB"
DISK_LIMIT = "64 KiB"


@pytest.fixture(scope="module", params=PROTOCOLS)
def tight(request):
    """A 2-worker cluster whose workers keep 1 KiB of shuffle pieces in memory, 64 KiB on disk."""
    limits = {
        "gpudirect.shuffle.host-limit": HOST_LIMIT,
        "gpudirect.shuffle.disk-limit": DISK_LIMIT,
    }
    cluster = start_cluster(request.param, threads=1, config=limits)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(2)
    ensure_plugins(client)  # the readers' and the shuffle's, which the tests reach into
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def cluster(tight):
    """``tight``, made current, with empty ledgers and every handler as the plugin set it."""
    tight.run(restore_receive)
    clear_ledgers(tight)
    with tight.as_current():
        yield tight
    tight.run(restore_receive)


# --- run on the workers ------------------------------------------------------------------------


def shuffle_state(dask_worker) -> dict:
    """The worker's live shuffle runs, ended runs, and spill directories left behind."""
    service = shuffle_service(dask_worker)
    local = dask_worker.local_directory
    spills = [d for d in os.listdir(local) if d.startswith("gpudirect-shuffle-")]
    return {"runs": sorted(service.runs), "closed": dict(service.closed), "spills": spills}


def shuffle_limits(dask_worker) -> dict:
    return shuffle_service(dask_worker).limits("host")


def break_receive(dask_worker) -> None:
    """Make this worker abort the connection of every shuffle message it is sent."""

    async def receive(comm, **msg):
        comm.abort()

    dask_worker.handlers[RECEIVE] = receive


def restore_receive(dask_worker) -> None:
    dask_worker.handlers[RECEIVE] = shuffle_service(dask_worker).receive


def has_shuffle_plugin(dask_worker) -> bool:
    return ShuffleWorkerPlugin.name in dask_worker.plugins


def hold_thread(started: str, release: str) -> None:
    """Hold this worker's thread (touching ``started``) until the test makes ``release``."""
    open(started, "w").close()
    wait_for_file(release, "the release")


def note_the_loop_during_the_next_store(dask_worker) -> None:
    """Make this worker's next keeping of received pieces wait (a minute at most) for a callback
    on its event loop, and note whether it ran: it can only if pieces are kept off the loop."""
    from dask_gpudirect.shuffle.buffer import SpillBuffer

    update = SpillBuffer.update

    def update_once(self, pieces):
        SpillBuffer.update = update
        ran = threading.Event()
        dask_worker.loop.add_callback(ran.set)
        dask_worker.loop_ran_during_store = ran.wait(60)
        update(self, pieces)

    SpillBuffer.update = update_once


def loop_ran_during_store(dask_worker) -> bool | None:
    return getattr(dask_worker, "loop_ran_during_store", None)


def reader_threads(dask_worker) -> int:
    return dask_worker.plugins["gpudirect"].options["threads"]


def heartbeats_heard(client, worker: str, count: int) -> bool:
    """Wait until the scheduler has heard ``count`` heartbeats from ``worker`` from now on;
    False if the worker left first (or ``HANG_GUARD`` passed)."""

    def last_seen(dask_scheduler, worker):
        ws = dask_scheduler.workers.get(worker)
        return None if ws is None else ws.last_seen

    seen, heard = client.run_on_scheduler(last_seen, worker=worker), 0
    deadline = time.monotonic() + HANG_GUARD
    while heard < count and time.monotonic() < deadline:
        now = client.run_on_scheduler(last_seen, worker=worker)
        if now is None:
            return False
        if now != seen:
            seen, heard = now, heard + 1
        time.sleep(0.05)
    return heard >= count


def stall_outputs(dask_worker, flag: str) -> None:
    """Make this worker's stages, once every peer has finished, touch ``flag`` and stall before
    building their outputs (test instrumentation: only a kill ends them)."""
    from dask_gpudirect.shuffle.worker import ShuffleRun

    def outputs(self, *args):
        open(flag, "w").close()
        time.sleep(HANG_GUARD)

    ShuffleRun.outputs = outputs


def shuffle_ended_here(dask_worker, timeout: float) -> bool:
    """Wait (from a task on this worker) until a shuffle run here has ended: what a stage
    hears when the shuffle is aborted; False after ``timeout``."""
    service = shuffle_service(dask_worker)
    ids = set(service.runs)
    deadline = time.monotonic() + timeout
    while not ids & set(service.closed):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def then_raises_on(first: str):
    """A then= that raises on worker ``first``'s outputs, and on the others returns each only
    once the shuffle has ended there (the abort that the failure sends has arrived)."""

    def then(part):
        worker = get_worker()
        if worker.address == first:
            raise ValueError("bad partition")
        shuffle_ended_here(worker, timeout=60)
        return part

    return then


def then_waits_for_the_end(flag: str):
    """A then= that touches ``flag`` (the stages build outputs) and returns its output only once
    the shuffle has ended on its worker (or after a minute)."""

    def then(part):
        open(flag, "w").close()
        shuffle_ended_here(get_worker(), timeout=60)
        return part

    return then


def outputs_kept(dask_worker) -> dict:
    """The outputs a worker's stages kept and never saw published, by shuffle."""
    return {k: len(v) for k, v in shuffle_service(dask_worker).built.items()}


# --- helpers -----------------------------------------------------------------------------------


def frame(n: int, keys: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"k": rng.integers(0, keys, n), "v": rng.random(n)}, index=np.arange(n) * 2 + 1
    )


def wait_until_clean(client, timeout: float = 20) -> dict:
    """Poll until no worker has a live run or a spill directory; the last state seen."""
    deadline = time.monotonic() + timeout
    while True:
        state = client.run(shuffle_state)
        if all(not s["runs"] and not s["spills"] for s in state.values()):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"shuffle state left behind: {state}")
        time.sleep(0.1)


def wait_until_clean_on(client, worker: str, timeout: float) -> dict:
    """Poll until ``worker`` has no live run; its state then (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (state := client.run(shuffle_state, workers=[worker])[worker])["runs"]:
        assert time.monotonic() < deadline, f"{worker} still runs {state['runs']}"
        time.sleep(0.1)
    return state


def shuffle_records(client) -> pd.DataFrame:
    records = ledger_report.records(client)
    return records[records["op"] == "shuffle"]


def moved_records(client) -> pd.DataFrame:
    """Shuffle records of pieces that went to another worker."""
    records = shuffle_records(client)
    return records[records["path"] != "local"]


# --- the config reaches the workers ------------------------------------------------------------


def test_limits_reach_the_workers(cluster):
    limits = cluster.run(shuffle_limits)
    assert len(limits) == 2
    for limit in limits.values():
        assert limit == {"device": 0, "host": 1024, "disk": 64 * 1024}


# --- spilling ----------------------------------------------------------------------------------


def test_spills_to_disk_and_is_right(cluster):
    """Every received piece passes the 1 KiB host limit and is spilled; the result is exact."""
    pdf = frame(2000, keys=97)  # 48 KB: 24 KB a worker, within 1 KiB + 64 KiB
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    out = dg.shuffle(df, "k", npartitions=4, client=cluster)
    outputs = partitions(cluster, out)
    assert_hash_partitions(outputs, pdf, "k", 4)

    records = ledger_report.records(cluster)
    spills = records[records["op"] == "spill"]
    assert set(spills["path"]) == {"host-to-disk"}
    assert set(spills["worker"]) == set(cluster.nthreads())  # both workers spilled
    assert (spills["bytes"] > 1024).all() and (spills["copies"] == 1).all()
    assert set(spills["shard"]) == set(shuffle_records(cluster)["shard"])  # the shuffle's id
    # every row went through the disk: the raw 24 bytes a row, give or take headers
    assert 0.8 * len(pdf) * 24 <= spills["bytes"].sum() <= 1.5 * sum(map(sizeof, outputs))
    wait_until_clean(cluster)  # spill files removed


def test_shuffle_array_spills_and_is_right(cluster):
    data = np.arange(3000 * 2, dtype="i8").reshape(3000, 2)  # 48 KB
    y = dg.shuffle_array(da.from_array(data, chunks=(750, 2)), seed=4, client=cluster)
    got = compute(cluster, y)
    assert (got[:, 1] == got[:, 0] + 1).all()
    np.testing.assert_array_equal(np.sort(got[:, 0]), data[:, 0])
    spills = ledger_report.records(cluster)
    spills = spills[spills["op"] == "spill"]
    assert set(spills["path"]) == {"host-to-disk"} and spills["bytes"].sum() >= 0.8 * data.nbytes
    wait_until_clean(cluster)


def test_memory_precheck_refuses_before_moving_data(cluster):
    """A share bigger than host + disk limits fails with "cannot fit" before a byte moves."""
    pdf = frame(20_000, keys=50)  # 480 KB: about 240 KB a worker, over 1 KiB + 64 KiB
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    before = cluster.run(shuffle_state)
    with pytest.raises(dg.ShuffleError, match="cannot fit") as info:
        dg.shuffle(df, "k", client=cluster)
    assert any(w in str(info.value) for w in cluster.nthreads())  # names the worker
    assert "host-limit" in str(info.value)  # and the knobs to raise
    assert ledger_report.records(cluster).empty  # nothing was sent, kept or spilled
    assert cluster.run(shuffle_state) == before  # no run was even started
    # a shuffle that fits still runs
    small = frame(500, keys=10, seed=1)
    out = dg.shuffle(dd.from_pandas(small, npartitions=2), "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), small, "k", 2)


def test_a_read_is_sized_decoded_before_it_is_shuffled(cluster, tmp_path):
    """A shuffle of a read plans before the files are read, on the bytes they will decode to:
    a file that compresses a hundredfold, small on disk but over the host + disk limits once
    decoded, is refused with "cannot fit" before a piece moves (on its compressed bytes the
    check passed it, and the exchange failed part way)."""
    path = tmp_path / "zeros.parquet"
    n = 40_000  # 640 KB decoded: about 320 KB a worker, over 1 KiB + 64 KiB
    pd.DataFrame({"k": np.arange(n) % 50, "v": np.zeros(n)}).to_parquet(path, index=False)
    assert os.path.getsize(path) < 16 * 1024  # what the plan saw before
    df = dg.read_parquet(path, blocksize=1, client=cluster)
    before = cluster.run(shuffle_state)
    with pytest.raises(dg.ShuffleError, match="cannot fit"):
        dg.shuffle(df, "k", npartitions=4, client=cluster)
    assert shuffle_records(cluster).empty  # no piece was sent, kept or spilled
    assert cluster.run(shuffle_state) == before


def test_disk_limit_reached_mid_shuffle(cluster):
    """The pre-check expects an even split; one key sends everything to one worker's disk:
    the error names that worker and the limit."""
    pdf = frame(4000, keys=1)  # 96 KB: 48 KB a worker expected, 96 KB on one in fact
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    with pytest.raises(dg.ShuffleError, match="would pass the disk limit of 65536 bytes") as info:
        dg.shuffle(df, "k", npartitions=2, client=cluster)
    assert "gpudirect.shuffle.disk-limit" in str(info.value)
    wait_until_clean(cluster)  # the spill files of the failed run are gone
    spills = ledger_report.records(cluster)
    spills = spills[spills["op"] == "spill"]
    spilled = spills.groupby("worker")["bytes"].sum()
    assert 0 < spilled.max() <= 64 * 1024  # the limit held
    assert f"failed on {spilled.idxmax()}: " in str(info.value)  # the worker it was reached on
    # the cluster still shuffles what fits
    small = frame(500, keys=10, seed=2)
    out = dg.shuffle(dd.from_pandas(small, npartitions=2), "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), small, "k", 2)


# --- transfers that fail -----------------------------------------------------------------------


def test_broken_connection(cluster):
    """A receiver that drops the connection fails the shuffle, names it, and leaves no state."""
    victim = sorted(cluster.nthreads())[0]
    cluster.run(break_receive, workers=[victim])
    pdf = frame(2000, keys=97, seed=3)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    start = time.monotonic()
    with pytest.raises(dg.ShuffleError, match="no output was returned") as info:
        dg.shuffle(df, "k", client=cluster)
    assert time.monotonic() - start < 30
    assert victim in str(info.value)
    wait_until_clean(cluster)
    assert (moved_records(cluster)["peer"] != victim).all()  # no transfer to it claimed
    cluster.run(restore_receive, workers=[victim])
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_slow_peer_is_waited_for(cluster):
    """A receiver that takes seconds per message is slow, not failed."""
    victim = sorted(cluster.nthreads())[0]
    cluster.run(delay_receive, seconds=1.5, workers=[victim])
    pdf = frame(1000, keys=31, seed=4)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=2), "k", npartitions=3, client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 3)
    moved = moved_records(cluster)
    moved = moved[moved["peer"] == victim]
    assert len(moved) >= 1
    assert (moved["worker"] != victim).all() and (moved["seconds"] >= 1.5).all()


def test_received_pieces_are_kept_off_the_event_loop(cluster):
    """Keeping received pieces, spilling them to disk here, runs in a thread of its own: the
    worker's event loop goes on meanwhile (its comms, heartbeats, other shuffles), and every
    row still lands in its partition."""
    victim = sorted(cluster.nthreads())[0]
    cluster.run(note_the_loop_during_the_next_store, workers=[victim])
    pdf = frame(2000, keys=97, seed=7)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=4, client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)
    assert cluster.run(loop_ran_during_store, workers=[victim]) == {victim: True}


def test_a_slow_shuffle_lets_go_of_its_data_without_the_garbage_collector(cluster):
    """A shuffle whose stages outlast the client's polls (a peer slow to receive) leaves
    nothing on the workers once the user drops its input and result, with Python's garbage
    collector off: a timed wait's error through ``Client.sync`` once kept every frame of the
    call, and the futures they held, in a reference cycle until a collection happened."""
    victim = sorted(cluster.nthreads())[0]
    cluster.run(delay_receive, seconds=1.5, workers=[victim])
    pdf = frame(1000, keys=31, seed=4)
    gc.collect()
    before = sum(cluster.run(held_keys).values())  # what earlier tests may still be letting go
    gc.disable()
    try:
        df = dd.from_pandas(pdf, npartitions=2).persist()
        out = dg.shuffle(df, "k", npartitions=3, client=cluster)
        assert_hash_partitions(partitions(cluster, out), pdf, "k", 3)
        del df, out
        deadline = time.monotonic() + 60  # a release is a message to the scheduler and back
        while sum(cluster.run(held_keys).values()) > before and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        gc.enable()
    assert sum(cluster.run(held_keys).values()) <= before


def test_tiny_max_in_flight(cluster):
    """One message on the wire at a time (each over the 1-byte cap) still gets everything."""
    pdf = frame(2000, keys=97, seed=6)
    with worker_config(cluster, {"gpudirect.shuffle.max-in-flight": 1}):
        out = dg.shuffle(dd.from_pandas(pdf, npartitions=8), "k", npartitions=5, client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 5)


def test_peer_slower_than_the_timeout(cluster):
    """Waiting longer than ``gpudirect.shuffle.timeout`` for a peer fails the shuffle, naming it.

    Both workers wait on each other (one for its sends, one for the pieces those carry): either
    may report first, and each names the other."""
    workers = sorted(cluster.nthreads())
    cluster.run(delay_receive, seconds=3, workers=workers[:1])
    pdf = frame(2000, keys=97, seed=7)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    with worker_config(cluster, {"gpudirect.shuffle.timeout": "1s"}):
        start = time.monotonic()
        with pytest.raises(dg.ShuffleError, match=r"1 s \(gpudirect.shuffle.timeout\)") as e:
            dg.shuffle(df, "k", client=cluster)
        assert time.monotonic() - start < HANG_GUARD
    assert any(w in str(e.value) for w in workers), str(e.value)
    wait_until_clean(cluster)
    cluster.run(restore_receive)
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_a_peer_still_sending_is_waited_for_past_the_timeout(cluster):
    """``gpudirect.shuffle.timeout`` bounds each wait on a peer, not the whole exchange: a
    worker that finished first waits for a peer that holds more input for as long as that
    peer's pieces keep coming (here 14 messages, one at a time, each held 0.5 s by the
    receiver: at least 7 s against a timeout of 5 s). The wait was bounded as a whole.

    Each wait is a message's 0.5 s and its handling, which on a loaded machine took up to 1.8 s
    more (a timeout of 2 s against 0.6 s a message failed there): the timeout leaves 4.5 s."""
    a, b = sorted(cluster.nthreads())
    messages = 14
    pdf = frame(100 * (messages + 1), keys=97, seed=8)
    pieces = [pdf.iloc[i * 100 : (i + 1) * 100] for i in range(messages + 1)]
    futures = [  # one small input on a, the others on b
        cluster.scatter(p, workers=[a if i == 0 else b], hash=False) for i, p in enumerate(pieces)
    ]
    # the scattered futures themselves, no task per input: from_delayed's tasks queued on b's
    # one thread, and on a loaded machine work stealing ran some on a (6 messages, not 8)
    keys = [f.key for f in futures]
    layer = dict(zip(keys, futures, strict=True))
    df = dd.from_graph(layer, pdf.iloc[:0], (None,) * (len(keys) + 1), keys, "inputs")
    cluster.run(delay_receive, seconds=0.5, workers=[a])
    settings = {
        "gpudirect.shuffle.timeout": "5s",
        "gpudirect.shuffle.chunk-size": 1,  # each input a chunk: a message each
        "gpudirect.shuffle.max-in-flight": 1,  # one at a time
    }
    with worker_config(cluster, settings):
        out = dg.shuffle(df, "k", npartitions=4, client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)
    sent = moved_records(cluster)
    assert len(sent[sent["peer"] == a]) >= messages


def test_concurrent_shuffles_on_one_thread_workers(cluster):
    """Shuffles started at once from several client threads all finish, on 1-thread workers.

    A stage holds its worker's thread until its peers' stages have sent everything; when two
    shuffles' stages take the threads of different workers first, each waits for the other's
    (until ``gpudirect.shuffle.timeout``, 30 s here instead of 600 s: a deadlock fails the
    test, a loaded machine's slow peer does not).
    """
    frames = [frame(1000, keys=50 + s, seed=s) for s in range(6)]  # 24 KB each: they fit

    def shuffle(pdf):
        with cluster.as_current():
            out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=3)
            return partitions(cluster, out)

    with worker_config(cluster, {"gpudirect.shuffle.timeout": "30s"}):
        for _ in range(2):
            with ThreadPoolExecutor(len(frames)) as pool:
                results = list(pool.map(shuffle, frames))
            for pdf, parts in zip(frames, results, strict=True):
                assert_hash_partitions(parts, pdf, "k", 3)
    wait_until_clean(cluster)


def test_abort_frees_a_stage_stuck_sending(cluster):
    """When a shuffle fails, the others' stages end at once, even one whose send is stuck.

    The victim takes 10 s per message and times out waiting (1 s); the other worker's stage is
    then still waiting on its send to the victim. The abort must wake it (ShuffleService.abort:
    "Fail the run (waking its stage task)"), not leave its thread busy until the send returns.
    """
    victim, _ = sorted(cluster.nthreads())
    cluster.run(delay_receive, seconds=10, workers=[victim])
    df = cluster.persist(dd.from_pandas(frame(2000, keys=97, seed=8), npartitions=4))
    try:
        with worker_config(cluster, {"gpudirect.shuffle.timeout": "1s"}):
            with pytest.raises(dg.ShuffleError, match="gpudirect.shuffle.timeout"):
                dg.shuffle(df, "k", client=cluster)
        wait_until_clean(cluster, timeout=4)
    finally:
        cluster.run(restore_receive)
        wait_until_clean(cluster, timeout=20)  # later tests need the worker's thread


def test_stopped_peer_fails_the_shuffle_within_the_timeout(cluster):
    """A peer frozen by SIGSTOP (alive to the kernel and the scheduler, answering nothing) fails
    the shuffle within gpudirect.shuffle.timeout and the abort grace, naming it; once it goes
    on (SIGCONT), the cluster is clean and the same shuffle runs."""
    victim, _ = sorted(cluster.nthreads())
    pdf = frame(2000, keys=97, seed=9)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)

    def shuffle():
        with cluster.as_current():
            return dg.shuffle(df, "k", client=cluster)

    with worker_config(cluster, {"gpudirect.shuffle.timeout": "3s"}):
        with ThreadPoolExecutor(1) as pool:
            cluster.run(delay_receive, seconds=1, workers=[victim])  # still busy when stopped
            running = pool.submit(shuffle)
            deadline = time.monotonic() + HANG_GUARD
            while not cluster.run(shuffle_state, workers=[victim])[victim]["runs"]:
                assert not running.done(), running.exception()
                assert time.monotonic() < deadline, "the shuffle never started on the victim"
            with stopped(cluster, victim):
                with pytest.raises(dg.ShuffleError, match="no output was returned") as info:
                    running.result(timeout=HANG_GUARD)
    assert victim in str(info.value)
    cluster.run(restore_receive)
    wait_until_clean(cluster, timeout=HANG_GUARD)
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_a_stopped_worker_holding_inputs_fails_the_shuffle_within_the_timeout(cluster):
    """Stopped (SIGSTOP) before the shuffle asks the input holders for their room: a
    ShuffleError naming it after gpudirect.shuffle.timeout (the call waited as long as the
    worker stayed stopped), and the same shuffle runs once it goes on."""
    pdf = frame(2000, keys=97, seed=18)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    victim = sorted({w for ws in cluster.who_has(df).values() for w in ws})[0]
    assert victim in str(_fails_while_stopped(cluster, df, victim))
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_a_stopped_worker_fails_the_first_shuffle_of_a_cluster_within_the_timeout():
    """The first call of the package on a cluster sets its plugins up on the workers: a worker
    stopped (SIGSTOP) before it held that call for as long as it stayed stopped. It is a
    ShuffleError after gpudirect.shuffle.timeout, and the shuffle runs once the worker goes on."""
    with start_cluster("tcp", threads=1) as lc, Client(lc) as client:
        pdf = frame(2000, keys=97, seed=21)
        df = client.persist(dd.from_pandas(pdf, npartitions=4))
        wait(df)
        _fails_while_stopped(client, df, sorted(client.nthreads())[0])
        out = dg.shuffle(df, "k", client=client)
        assert_hash_partitions(partitions(client, out), pdf, "k", 4)


def _fails_while_stopped(client, df, victim: str) -> BaseException:
    """The ShuffleError ``dg.shuffle(df, "k")`` must end in while ``victim`` is stopped, with a
    3 s shuffle timeout."""

    def shuffle():
        with client.as_current():
            return dg.shuffle(df, "k", client=client)

    with dask.config.set({"gpudirect.shuffle.timeout": "3s"}):
        return error_while_stopped(client, victim, shuffle, dg.ShuffleError, "did not answer")


def test_a_client_that_leaves_mid_shuffle_ends_it_on_the_workers(cluster):
    """A client closed while its shuffle waits on a stopped peer ends that shuffle on every
    worker at once, not after gpudirect.shuffle.timeout (here far longer than the test's
    wait): the worker still running ends its stage and keeps nothing; the stopped one, once it
    goes on, too; and the cluster shuffles again."""
    victim, survivor = sorted(cluster.nthreads())
    pdf = frame(2000, keys=97, seed=13)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    leaving = Client(cluster.scheduler.address, set_as_default=False)

    def shuffle() -> BaseException | None:
        try:
            dg.shuffle(leaving.persist(dd.from_pandas(pdf, npartitions=4)), "k", client=leaving)
        except Exception as exc:  # its client closes under it
            return exc
        return None

    with worker_config(cluster, {"gpudirect.shuffle.timeout": f"{HANG_GUARD}s"}):
        with ThreadPoolExecutor(1) as pool:
            cluster.run(delay_receive, seconds=1, workers=[victim])  # still busy when stopped
            running = pool.submit(shuffle)
            deadline = time.monotonic() + HANG_GUARD
            while not all(s["runs"] for s in cluster.run(shuffle_state).values()):
                assert not running.done(), running.exception()
                assert time.monotonic() < deadline, "the shuffle never started on both workers"
            with stopped(cluster, victim):
                leaving.close()
                state = wait_until_clean_on(cluster, survivor, timeout=HANG_GUARD / 10)
                assert not state["runs"]
            error = running.result(timeout=HANG_GUARD)
    # the stages' cancelled error (an AttributeError of the closed client's hid it)
    assert isinstance(error, (dg.ShuffleError, CancelledError)), repr(error)
    cluster.run(restore_receive)
    wait_until_clean(cluster, timeout=HANG_GUARD)
    assert not any(cluster.run(lambda dask_worker: shuffle_service(dask_worker).built).values())
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_a_run_whose_stage_never_started_is_freed_when_the_shuffle_fails(cluster, tmp_path):
    """A worker gets a peer's pieces while its one thread is busy, so its stage has not started
    when the shuffle fails (the peer's wait runs out): the abort frees the run those pieces
    made, spill directory included, without waiting for the thread."""
    busy, peer = sorted(cluster.nthreads())
    halves = [
        cluster.persist(dd.from_pandas(half, npartitions=2), workers=[w])
        for half, w in ((frame(1000, keys=97, seed=12), busy), (frame(1000, 97, 13), peer))
    ]
    df = cluster.persist(dd.concat(halves))  # its own futures: the shuffle runs no task first
    wait(df)
    assert {w for ws in cluster.who_has(futures_of(df)).values() for w in ws} == {busy, peer}
    started, release = tmp_path / "started", tmp_path / "release"
    blocker = cluster.submit(hold_thread, str(started), str(release), workers=[busy], pure=False)
    wait_for_file(started, "the blocking task's start")
    try:
        with worker_config(cluster, {"gpudirect.shuffle.timeout": "2s"}):
            with pytest.raises(dg.ShuffleError, match="gpudirect.shuffle.timeout"):
                dg.shuffle(df, "k", client=cluster)
        assert cluster.run(shuffle_state, workers=[busy])[busy]["closed"]  # pieces came, then
        wait_until_clean(cluster)  # freed while the thread is still held
        assert not blocker.done()
    finally:
        release.touch()
    blocker.result(timeout=HANG_GUARD)


def test_outputs_built_after_the_abort_are_not_kept(cluster):
    """then= fails on one worker while the other still builds its outputs: that one hears the
    abort and keeps none of them (it kept every output it built after it, unknown to the
    scheduler, for good)."""
    first, other = sorted(cluster.nthreads())
    pdf = frame(2000, keys=97, seed=14)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    with pytest.raises(dg.ShuffleError, match="then=then raised on output partition"):
        dg.shuffle(df, "k", then=then_raises_on(first), meta=pdf.iloc[:0], client=cluster)
    wait_until_clean(cluster, timeout=HANG_GUARD)
    assert cluster.run(outputs_kept) == {first: {}, other: {}}
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_an_interrupted_call_ends_the_shuffle_on_the_workers(cluster, tmp_path):
    """Ctrl-C in the caller while the stages build their outputs: every worker hears the
    shuffle end, and keeps none of its outputs (the stages built and kept them all, outputs
    that nothing would publish or free)."""
    import _thread

    pdf = frame(2000, keys=97, seed=15)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    building = tmp_path / "building"

    def interrupt_once_building() -> None:
        deadline = time.monotonic() + HANG_GUARD
        while not building.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        _thread.interrupt_main()

    interrupter = threading.Thread(target=interrupt_once_building, daemon=True)
    # Python's own Ctrl-C handler, whatever an earlier test in this process left in its place
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            then = then_waits_for_the_end(str(building))
            dg.shuffle(df, "k", then=then, meta=pdf.iloc[:0], client=cluster)
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, handler)
    wait_until_clean(cluster, timeout=HANG_GUARD)
    assert not any(cluster.run(outputs_kept).values())
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


@contextlib.contextmanager
def scheduler_handler(client, name: str, handler, stream: bool = False):
    """The scheduler's (in this process) handler ``name`` (of its comms, or with ``stream`` of
    its streams) replaced by ``handler(real, **msg)``, and Python's own Ctrl-C handler in place
    (an earlier test may have left another)."""
    scheduler = client.cluster.scheduler
    handlers = scheduler.stream_handlers if stream else scheduler.handlers
    real = handlers[name]

    def replaced(**msg):  # a coroutine where handler is one: the scheduler awaits it
        return handler(real, **msg)

    async def awaited(**msg):  # a stream awaits only a coroutine function
        return await handler(real, **msg)

    handlers[name] = awaited if asyncio.iscoroutinefunction(handler) else replaced
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield scheduler
    finally:
        handlers[name] = real
        signal.signal(signal.SIGINT, sigint)


def ctrl_c() -> None:
    """The caller's Ctrl-C: SIGINT to this process, which its main thread raises."""
    os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_as_the_stages_start_ends_them(cluster):
    """Ctrl-C while the stages are submitted, the caller's end (a call of its own) handled
    before the start (on the client's stream, the stages behind it): every participant hears
    the shuffle end and keeps no output (the call left before its ``try``, and the stages ran
    on and kept outputs that nothing published)."""
    pdf = frame(2000, keys=97, seed=16)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    started: list[str] = []

    async def start_after_the_end(real, shuffle_id, **msg):
        started.append(shuffle_id)
        ctrl_c()
        plugin = cluster.cluster.scheduler.plugins["gpudirect-shuffle"]
        deadline = time.monotonic() + 30
        while shuffle_id not in plugin.ended and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return real(shuffle_id=shuffle_id, **msg)

    with scheduler_handler(cluster, START, start_after_the_end, stream=True):
        with pytest.raises(KeyboardInterrupt):
            dg.shuffle(df, "k", client=cluster)
    deadline = time.monotonic() + HANG_GUARD
    while not all(started[0] in s["closed"] for s in cluster.run(shuffle_state).values()):
        assert time.monotonic() < deadline, "a participant never heard the shuffle end"
        time.sleep(0.1)
    wait_until_clean(cluster, timeout=HANG_GUARD)
    assert not any(cluster.run(outputs_kept).values())
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_an_interrupt_as_the_outputs_are_published_lets_them_go(cluster):
    """Ctrl-C as the scheduler's reply to the publish comes back: the outputs it kept for the
    client are let go (they stayed wanted by a client that held no future of them, on the
    workers until it closed)."""
    pdf = frame(2000, keys=97, seed=17)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    held = set(cluster.cluster.scheduler.tasks)

    def publish_then_interrupt(real, **msg):
        reply = real(**msg)
        ctrl_c()
        return reply

    with scheduler_handler(cluster, "gpudirect_shuffle_publish", publish_then_interrupt) as s:
        with pytest.raises(KeyboardInterrupt):
            dg.shuffle(df, "k", client=cluster)
        deadline = time.monotonic() + HANG_GUARD
        while set(s.tasks) != held:
            assert time.monotonic() < deadline, f"left on the scheduler: {set(s.tasks) - held}"
            time.sleep(0.1)
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)


def test_registering_the_readers_again_mid_shuffle_leaves_it_alone(cluster):
    """``register_plugin(GPUDirectPlugin(...))``, the documented way to change reader options,
    while a shuffle is in flight: the shuffle finishes right (its service is a plugin of its
    own), the new options hold, and the ledger keeps what it had recorded."""
    victim = sorted(cluster.nthreads())[0]
    cluster.run(delay_receive, seconds=0.5, workers=[victim])  # keeps the exchange in flight
    pdf = frame(2000, keys=97, seed=10)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=8))
    wait(df)

    def shuffle():
        with cluster.as_current():
            return partitions(cluster, dg.shuffle(df, "k", npartitions=4, client=cluster))

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(shuffle)
        deadline = time.monotonic() + HANG_GUARD
        while moved_records(cluster).empty:  # a piece has reached the victim
            assert not running.done(), running.exception()
            assert time.monotonic() < deadline, "no piece ever moved"
        before = moved_records(cluster)
        cluster.register_plugin(dg.GPUDirectPlugin(threads=2))
        cluster.register_plugin(ShuffleWorkerPlugin())  # idempotent: the live one stays
        parts = running.result(timeout=HANG_GUARD)
    assert_hash_partitions(parts, pdf, "k", 4)
    assert set(cluster.run(reader_threads).values()) == {2}
    after = moved_records(cluster)
    assert set(before["time"]) <= set(after["time"]), "the ledger lost records"
    cluster.register_plugin(dg.GPUDirectPlugin())


def test_removing_the_shuffle_plugin_mid_shuffle_leaves_the_workers_running():
    """``client.unregister_worker_plugin("gpudirect-shuffle")`` while a shuffle is in flight: the
    shuffle fails with a ShuffleError, and the workers stay. The client's abort reached them on
    their stream after the plugin had removed its handler, and that KeyError broke each
    worker's stream to the scheduler: every worker closed. On a cluster of its own, so a
    failure leaves the others' alone."""
    cluster = start_cluster("tcp", threads=1)
    client = Client(cluster, set_as_default=False)
    try:
        with client.as_current():
            client.wait_for_workers(2)
            ensure_plugins(client)
            workers = sorted(client.nthreads())
            pdf = frame(2000, keys=97, seed=18)
            df = client.persist(dd.from_pandas(pdf, npartitions=4))
            wait(df)
            client.run(delay_receive, seconds=1)  # keeps the exchange in flight

            def shuffle() -> BaseException | None:
                try:
                    dg.shuffle(df, "k", client=client)
                except Exception as exc:
                    return exc
                return None

            with ThreadPoolExecutor(1) as pool:
                running = pool.submit(shuffle)
                deadline = time.monotonic() + HANG_GUARD
                while not all(s["runs"] for s in client.run(shuffle_state).values()):
                    assert not running.done(), running.exception()
                    assert time.monotonic() < deadline, "the shuffle never started on both workers"
                client.unregister_worker_plugin(ShuffleWorkerPlugin.name)
                error = running.result(timeout=HANG_GUARD)
            assert isinstance(error, dg.ShuffleError), repr(error)
            # the abort reached the workers as the stages ended: a worker it broke leaves
            # before it is heard twice more (False)
            assert all(heartbeats_heard(client, w, 2) for w in workers)
            assert sorted(client.nthreads()) == workers
            out = dg.shuffle(df, "k", client=client)  # registers the plugin again
            assert_hash_partitions(partitions(client, out), pdf, "k", 4)
    finally:
        client.close()
        cluster.close()


def test_worker_killed_mid_shuffle(cluster):
    """SIGKILL a worker while the shuffle waits on it: a ShuffleError naming it, then a rerun.

    Last in the module: the nanny restarts the worker under a new address.
    """
    victim, survivor = sorted(cluster.nthreads())
    pid = cluster.run(os.getpid, workers=[victim])[victim]
    cluster.run(delay_receive, seconds=60, workers=[victim])
    pdf = frame(2000, keys=97, seed=5)
    df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    assert set(map(tuple, cluster.who_has(futures_of(df)).values())) == {(victim,), (survivor,)}

    def shuffle():
        with cluster.as_current():
            return dg.shuffle(df, "k", client=cluster)

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(shuffle)
        deadline = time.monotonic() + HANG_GUARD
        while not cluster.run(shuffle_state, workers=[victim])[victim]["runs"]:
            assert not running.done(), running.exception()
            assert time.monotonic() < deadline, "the shuffle never started on the victim"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(dg.ShuffleError, match="no output was returned") as info:
            running.result(timeout=HANG_GUARD)
    assert time.monotonic() - killed < 30  # the loss is found, not waited out
    assert victim in str(info.value)

    state = wait_until_clean(cluster, timeout=HANG_GUARD)
    assert victim not in state
    # the same shuffle again, on whatever now holds the inputs (the survivor recomputed the lost)
    out = dg.shuffle(df, "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)
    # the nanny's new worker joins with the plugin and the limits, and takes part in a shuffle
    deadline = time.monotonic() + HANG_GUARD
    while not all(cluster.run(has_shuffle_plugin).values()) or len(cluster.nthreads()) < 2:
        assert time.monotonic() < deadline, "the nanny never brought a worker back"
        time.sleep(0.1)  # the scheduler may know the new worker before its plugins are set up
    (new,) = set(cluster.nthreads()) - {survivor}
    assert new != victim
    assert cluster.run(shuffle_limits, workers=[new])[new]["host"] == 1024
    halves = [
        cluster.persist(dd.from_pandas(half, npartitions=2), workers=[w])
        for half, w in ((pdf.iloc[:1000], new), (pdf.iloc[1000:], survivor))
    ]
    clear_ledgers(cluster)
    out = dg.shuffle(dd.concat(halves), "k", client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)
    assert set(shuffle_records(cluster)["worker"]) == {new, survivor}


# --- client.restart() mid-shuffle ----------------------------------------------------------------


def hold_in_task(started: str, release: str):
    """A function of one partition that sets the Event ``started`` and holds its worker's
    thread until ``release`` is set (an input's map_partitions, or a then=)."""

    def hold(part):
        Event(started).set()
        Event(release).wait(HANG_GUARD)
        return part

    return hold


def hold_receive(dask_worker, started: str, release: str) -> None:
    """Make this worker set the Event ``started`` on each shuffle message it is sent and hold
    the message until ``release`` is set: the exchange stays in flight. The wait runs in a
    thread, so the worker's event loop goes on (heartbeats, the restart's close)."""
    service = shuffle_service(dask_worker)

    def hold() -> None:
        client = dask_worker._get_client()  # the worker's own: no task, so no get_client()
        Event(started, client=client).set()
        Event(release, client=client).wait(HANG_GUARD)

    async def receive(**msg):
        await asyncio.to_thread(hold)
        return await service.receive(**msg)

    dask_worker.handlers[RECEIVE] = receive


def spill_directories(directory: str) -> list[str]:
    """The shuffle spill directories left in ``directory`` (a worker's, maybe gone)."""
    return glob.glob(os.path.join(directory, "gpudirect-shuffle-*"))


@pytest.mark.parametrize("moment", ["inputs", "exchange", "outputs"])
def test_a_restart_mid_shuffle_cancels_it(moment):
    """``client.restart()`` while a shuffle is in flight cancels it as it cancels every task:
    the call raises Distributed's CancelledError, as its P2P shuffle does, no worker (nor the
    scheduler) keeps anything of it, and the next shuffle runs on the restarted workers. Held
    (by Events) while its inputs are still computed, mid-exchange (each message held by its
    receiver), and while the stages build their outputs (in then=). On a cluster of its own,
    with the module's spilling limits: the restart gives the workers new addresses."""
    limits = {
        "gpudirect.shuffle.host-limit": HOST_LIMIT,
        "gpudirect.shuffle.disk-limit": DISK_LIMIT,
    }
    with (
        start_cluster("tcp", threads=1, config=limits) as lc,
        Client(lc, set_as_default=False) as client,
    ):
        client.wait_for_workers(2)
        ensure_plugins(client)
        plugin = lc.scheduler.plugins["gpudirect-shuffle"]
        started, release = Event(client=client), Event(client=client)
        hold = hold_in_task(started.name, release.name)
        pdf = frame(2000, keys=97, seed=23)
        kwargs = {}
        if moment == "inputs":  # every input waits for release
            df = dd.from_pandas(pdf, npartitions=4).map_partitions(hold, meta=pdf.iloc[:0])
        else:
            df = client.persist(dd.from_pandas(pdf, npartitions=4))
            with client.as_current():
                wait(df)
        if moment == "exchange":
            client.run(hold_receive, started=started.name, release=release.name)
        elif moment == "outputs":
            kwargs = {"then": hold, "meta": pdf.iloc[:0]}
        pids = set(client.run(os.getpid).values())
        directories = client.run(lambda dask_worker: dask_worker.local_directory)

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(dg.shuffle, df, "k", npartitions=4, client=client, **kwargs)
            try:
                deadline = time.monotonic() + HANG_GUARD
                while not started.wait(timeout=1):
                    assert not running.done(), running.exception()
                    assert time.monotonic() < deadline, f"the shuffle never reached its {moment}"
                # the stages start once the inputs are computed; then a run (and its spill
                # directory) on each worker
                assert len(plugin.active) == (0 if moment == "inputs" else 1), plugin.active
                if moment != "inputs":
                    assert all(map(spill_directories, directories.values()))
                client.restart(timeout=HANG_GUARD)  # a loaded machine's workers come back late
                # distributed.CancelledError is concurrent.futures'; the call raises its
                # FuturesCancelledError
                with pytest.raises(CancelledError):
                    running.result(timeout=HANG_GUARD)
            finally:
                release.set()

        assert pids.isdisjoint(client.run(os.getpid).values())  # new worker processes
        assert not plugin.active and not plugin.reports and not plugin.op_ids
        assert not [key for key in lc.scheduler.tasks if "gpudirect-shuffle" in str(key)]
        wait_until_clean(client)
        assert not any(client.run(outputs_kept).values())
        assert not [d for d in directories.values() if spill_directories(d)]
        df = client.persist(dd.from_pandas(pdf, npartitions=4))
        out = dg.shuffle(df, "k", npartitions=4, client=client)
        assert_hash_partitions(partitions(client, out), pdf, "k", 4)


# --- options that are refused ------------------------------------------------------------------


def gate_inputs(part: pd.DataFrame, partition_info=None) -> pd.DataFrame:
    """Input 1 waits for the event "go"; input 0, computed again once "killed" is set, for
    "again" (distributed Events: the test drives the order)."""
    from distributed import Event

    if partition_info["number"] == 1:
        Event("go").wait()
    elif Event("killed").is_set():
        Event("again").wait()
    return part


def test_an_input_lost_while_others_are_computed_is_waited_for_again():
    """An input partition that finished, then was lost with its worker while dg.shuffle waited
    for the others: Dask computes it again, and the shuffle waits for it (it raised
    AttributeError: 'NoneType' object has no attribute 'with_traceback')."""
    from distributed import Event

    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        client.register_plugin(dg.GPUDirectPlugin())
        pdf = frame(2000, keys=97, seed=3)
        df = dd.from_pandas(pdf, npartitions=2).map_partitions(gate_inputs, meta=pdf.iloc[:0])
        pids = client.run(os.getpid)

        def states() -> dict[int, tuple[str, list[str]]]:
            return client.run_on_scheduler(
                lambda dask_scheduler: {
                    ts.key[1]: (ts.state, [w.address for w in ts.who_has or ()])
                    for ts in dask_scheduler.tasks.values()
                    if isinstance(ts.key, tuple) and str(ts.key[0]).startswith("gate_inputs")
                }
            )

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(dg.shuffle, df, "k", npartitions=4, client=client)
            deadline = time.monotonic() + HANG_GUARD
            while (now := states()).get(0, ("",))[0] != "memory" or now[1][0] != "processing":
                assert not running.done(), running.exception()
                assert time.monotonic() < deadline, f"inputs never got there: {now}"
                time.sleep(0.05)
            Event("killed", client=client).set()
            (victim,) = now[0][1]
            os.kill(pids[victim], signal.SIGKILL)
            while states()[0][0] == "memory":  # until the scheduler has found the loss
                assert time.monotonic() < deadline, "the loss was never found"
                time.sleep(0.05)
            Event("go", client=client).set()
            Event("again", client=client).set()
            out = running.result(timeout=HANG_GUARD)
        assert_hash_partitions(partitions(client, out), pdf, "k", 4)


def test_worker_lost_after_the_shuffle_fails_what_needs_its_outputs():
    """A worker that held outputs dies after dg.shuffle returned: what needs them fails at once
    with a ShuffleError naming it (no wait in no-worker), outputs elsewhere are still there, and
    the shuffle runs again on the cluster that is left (its inputs recomputed)."""
    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        client.register_plugin(dg.GPUDirectPlugin())
        pdf = frame(2000, keys=97, seed=7)
        df = client.persist(dd.from_pandas(pdf, npartitions=4))
        out = dg.shuffle(df, "k", client=client)
        victim, survivor = sorted(client.nthreads())
        holders = client.who_has(futures_of(out))
        assert {w for ws in holders.values() for w in ws} == {victim, survivor}
        kept = sorted(key[1] for key, ws in holders.items() if tuple(ws) == (survivor,))
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)

        with pytest.raises(dg.ShuffleError, match="lost with worker") as info:
            client.compute(out.k.sum(), workers=[survivor]).result(timeout=HANG_GUARD)
        assert victim in str(info.value)
        # The worker that ran the erred tasks sends their metrics with a later heartbeat, which
        # the scheduler must take and keep the worker (the lost outputs' tasks have a span, as
        # update_graph gives one, for that). Its own heartbeats, not one called beside them (two
        # at once trip Distributed's metrics bookkeeping and close the worker): the third heard
        # after the error follows one that carried them.
        assert heartbeats_heard(client, survivor, 3)
        assert survivor in client.nthreads()
        got = client.gather([f for f in futures_of(out) if f.key[1] in kept])  # still held
        expected = pdf[np.isin(owner_of_rows(pdf, "k", 4), kept)].index
        assert sorted(pd.concat(got).index) == sorted(expected)

        again = dg.shuffle(df, "k", client=client)  # on the worker(s) left
        assert_hash_partitions(partitions(client, again), pdf, "k", 4)


def test_worker_lost_while_only_its_stage_is_left():
    """A worker killed while it builds its outputs, after every peer's stage has finished: the
    scheduler plugin fails the shuffle naming it (no participant is left to notice), in
    bounded time, and the shuffle runs again on the worker that is left."""
    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        ensure_plugins(client)
        victim, survivor = sorted(client.nthreads())
        flag = os.path.join(client.run(lambda dask_worker: dask_worker.local_directory)[victim])
        flag = os.path.join(flag, "building-outputs")
        client.run(stall_outputs, flag=flag, workers=[victim])
        pdf = frame(2000, keys=97, seed=11)
        df = client.persist(dd.from_pandas(pdf, npartitions=4))
        with client.as_current():
            wait(df)

        def shuffle():
            with client.as_current():
                return dg.shuffle(df, "k", client=client)

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(shuffle)
            deadline = time.monotonic() + HANG_GUARD
            while (
                not os.path.exists(flag)
                or client.run(shuffle_state, workers=[survivor])[survivor]["runs"]
            ):
                assert not running.done(), running.exception()
                assert time.monotonic() < deadline, "the victim never built its outputs"
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            with pytest.raises(dg.ShuffleError, match="left the cluster") as info:
                running.result(timeout=HANG_GUARD)
        assert victim in str(info.value)
        again = dg.shuffle(df, "k", client=client)
        assert_hash_partitions(partitions(client, again), pdf, "k", 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on": "nope"}, r"columns \['nope'\] are not in \['k', 'v'\] or the index 'row'"),
        ({"on": "row", "ignore_index": True}, "cannot shuffle on the index 'row' with ignore_"),
        ({"on": ["k", "nope"]}, r"columns \['nope'\] are not in"),
        ({"on": []}, "name at least one column"),
        ({"on": {"k": 1}}, "cannot shuffle on a dict: on= takes column names"),
        ({"on": [["k"]]}, "cannot shuffle on a list: on= takes column names"),
        ({"on": "k", "npartitions": 0}, "bad npartitions 0"),
        ({"on": "k", "npartitions": -2}, "bad npartitions -2"),
        ({"on": "k", "npartitions": 2.5}, "bad npartitions 2.5"),
        ({"on": "k", "npartitions": "3"}, "bad npartitions '3'"),
        ({"on": "k", "then": "sum"}, "then must be a function of one partition, not 'sum'"),
        ({"on": "k", "then": len}, "then=len must return a frame or a series, not int"),
        (
            {"on": "k", "then": lambda p: p["nope"]},
            "then=lambda failed on a made-up partition: KeyError",
        ),
    ],
    ids=str,
)
def test_bad_shuffle_options(tcp, kwargs, match):
    clear_ledgers(tcp)
    df = dd.from_pandas(frame(100, keys=5).rename_axis("row"), npartitions=2)
    with pytest.raises(dg.InputError, match=match):
        dg.shuffle(df, client=tcp, **kwargs)
    assert ledger_report.records(tcp).empty


@pytest.mark.parametrize("names", [pd.Index(["k"]), np.array(["k"])], ids=["Index", "ndarray"])
def test_on_takes_names_as_an_index_or_an_array(tcp, names):
    """``on=df.columns[:1]`` and the like: the names it holds (it raised ``TypeError:
    unhashable type``)."""
    pdf = frame(200, keys=7).rename_axis("row")
    df = dd.from_pandas(pdf, npartitions=2)
    out = dg.shuffle(df, names, npartitions=3, client=tcp)
    assert_hash_partitions(partitions(tcp, out), pdf, "k", 3)


@pytest.mark.parametrize(
    ("key", "value", "wanted"),
    [
        ("chunk-size", "10 XB", "a positive size"),
        ("chunk-size", 0, "a positive size"),
        ("max-in-flight", "abc", "a positive size"),
        ("host-limit", -1, "a fraction from 0 to 1, or a size"),
        ("device-limit", "lots", "a fraction from 0 to 1, or a size"),
        ("disk-limit", -1, "a size like"),
        ("timeout", -1, "a positive duration"),
        ("timeout", "soon", "a positive duration"),
        ("progress", "false", "true or false"),  # bool("false") showed the bar
    ],
)
def test_a_bad_shuffle_setting_is_named_before_the_shuffle_starts(tcp, key, value, wanted):
    """Not a worker that "did not answer" with a parser's error inside: the key, the value
    and what it takes, in the caller's process; nothing moved, and the next shuffle runs."""
    clear_ledgers(tcp)
    df = dd.from_pandas(frame(100, keys=5), npartitions=2)
    with dask.config.set({f"gpudirect.shuffle.{key}": value}):
        with pytest.raises(dg.ConfigError, match=rf"gpudirect.shuffle.{key}=.*: use {wanted}"):
            dg.shuffle(df, "k", client=tcp)
    assert ledger_report.records(tcp).empty
    assert_hash_partitions(
        partitions(tcp, dg.shuffle(df, "k", client=tcp)), frame(100, keys=5), "k", 2
    )


def test_a_bad_setting_on_a_worker_is_named_not_taken_for_silence(tcp):
    """A worker whose own gpudirect.shuffle.chunk-size cannot be used answered with the
    ConfigError, which the shuffle reported as a worker that "did not answer" and should be
    run again."""
    df = dd.from_pandas(frame(100, keys=5), npartitions=2)
    with worker_config(tcp, {"gpudirect.shuffle.chunk-size": 0}):
        with pytest.raises(dg.ShuffleError, match="gpudirect.shuffle.chunk-size=0") as info:
            dg.shuffle(df, "k", client=tcp)
    assert "did not answer" not in str(info.value) and "run the shuffle again" not in str(
        info.value
    )


def test_shuffle_on_a_series_names_what_it_takes(tcp):
    """Dask's shuffle also takes a Series to hash; ``dg.shuffle`` says to make it a column."""
    df = dd.from_pandas(frame(100, keys=5), npartitions=2)
    with pytest.raises(dg.InputError, match=r"on a Series: .*df.assign\(key=...\)"):
        dg.shuffle(df, df["k"] % 3, client=tcp)


@pytest.mark.parametrize(
    ("make", "seed", "match"),
    [
        (lambda: da.arange(10, chunks=5), -1, "bad seed -1"),
        (lambda: da.arange(10, chunks=5), 1.5, "bad seed 1.5"),
        (lambda: da.arange(10, chunks=5), "1", "bad seed '1'"),
        (lambda: da.from_array(np.array(3.0)), 1, "0-d array"),
        (lambda: (x := da.arange(10, chunks=5))[x > 3], 1, "chunk sizes along axis 0 are unknown"),
        (  # its pieces would lose the mask: refused rather than the masked values shown
            lambda: da.ma.masked_array(da.arange(10, chunks=5), mask=da.arange(10, chunks=5) % 2),
            1,
            "cannot shuffle a masked array",
        ),
    ],
    ids=["negative-seed", "float-seed", "str-seed", "0-d", "unknown-chunks", "masked"],
)
def test_bad_shuffle_array_options(tcp, make, seed, match):
    clear_ledgers(tcp)
    with pytest.raises(dg.InputError, match=match):
        dg.shuffle_array(make(), seed=seed, client=tcp)
    assert ledger_report.records(tcp).empty


@pytest.mark.parametrize("records", [13, 7], ids=["longer", "shorter"])
def test_shuffle_array_chunk_unlike_the_arrays_chunks(tcp, records):
    """A chunk whose length is not the one the array's chunks say (a ``map_blocks`` that drops
    or repeats records without ``chunks=``) fails the shuffle, naming the chunk: the table of
    counts follows the chunks the array says, so a longer chunk lost its extra records in
    silence and a shorter one failed with an IndexError. The cluster still shuffles."""

    def lie(block):
        return np.arange(10, 10 + records) if block[0] == 10 else block

    x = da.arange(40, chunks=10).map_blocks(lie, dtype=np.int64, meta=np.empty(0, np.int64))
    with pytest.raises(
        dg.ShuffleError, match=rf"input chunk 1 has shape \({records},\) where the array's chunks"
    ):
        dg.shuffle_array(x, seed=1, client=tcp)
    y = dg.shuffle_array(da.arange(40, chunks=10), seed=1, client=tcp)
    np.testing.assert_array_equal(np.sort(compute(tcp, y)), np.arange(40))


def test_not_a_dask_collection(tcp):
    """A pandas frame or a NumPy array by mistake: an InputError that says what is needed."""
    with pytest.raises(dg.InputError, match="needs a Dask DataFrame, not DataFrame"):
        dg.shuffle(frame(10, keys=2), "k", client=tcp)
    with pytest.raises(dg.InputError, match="needs a Dask Array, not ndarray"):
        dg.shuffle_array(np.arange(10), seed=1, client=tcp)


def test_an_input_that_fails_raises_its_own_error(tcp):
    """A partition that cannot be computed raises its error; no stage starts, nothing moves."""

    def boom(part):
        if part.index[0] > 100:
            raise ValueError("partition 1 is broken")
        return part

    pdf = frame(100, keys=5)
    df = dd.from_pandas(pdf, npartitions=2).map_partitions(boom, meta=pdf.iloc[:0])
    clear_ledgers(tcp)
    with pytest.raises(ValueError, match="partition 1 is broken"):
        dg.shuffle(df, "k", client=tcp)
    assert ledger_report.records(tcp).empty
    assert not any(s["runs"] for s in tcp.run(shuffle_state).values())


@pytest.mark.parametrize("failing", ["an input", "then"])
def test_a_failed_shuffle_lets_go_of_its_inputs_while_its_error_is_kept(tcp, failing):
    """The error of a failed shuffle kept (a notebook's last exception, a log) held every
    computed input on the workers through its traceback's frames: 7 of 8 partitions where an
    input failed, 8 of 8 where ``then`` did; Dask's P2P holds none."""

    def boom(part, partition_info=None):
        if partition_info["number"] == 5:
            raise ValueError("partition 5 is broken")
        return part

    def then(part):
        raise ValueError("then is broken")

    pdf = frame(4000, keys=50)
    baseline = sum(tcp.run(held_keys).values())
    df = dd.from_pandas(pdf, npartitions=8)
    with pytest.raises((ValueError, dg.ShuffleError), match="is broken") as kept:
        if failing == "an input":
            dg.shuffle(df.map_partitions(boom, meta=pdf.iloc[:0]), "k", client=tcp)
        else:
            dg.shuffle(df, "k", then=then, meta=pdf.iloc[:0], client=tcp)
    wait_released(tcp, baseline)  # an error after 30 s while the partitions stay
    assert kept.value is not None


def _take_inputs(keys):
    return shuffle_service().take_inputs(keys)


def test_an_input_gone_from_its_worker_is_fetched_from_the_cluster(tcp):
    """A stage takes its inputs from its worker's memory; where Distributed dropped that copy
    (one of two), it fetches the input from the worker that still holds it."""
    ensure_plugins(tcp)
    a, b = sorted(tcp.nthreads())[:2]
    part = tcp.submit(pd.DataFrame, {"k": [1, 2, 3]}, workers=[a], pure=False)
    own = tcp.submit(pd.DataFrame, {"k": [4]}, workers=[b], pure=False)
    wait([part, own])
    # the keys, not the futures: b does not fetch the input before the task runs
    keys = [part.key, own.key]
    got = tcp.submit(_take_inputs, keys, workers=[b], allow_other_workers=False, pure=False)
    fetched, held = got.result(timeout=120)  # it used to hang
    pd.testing.assert_frame_equal(fetched, part.result())
    pd.testing.assert_frame_equal(held, own.result())
    assert a in tcp.who_has([part])[part.key]  # fetched, not moved


def test_an_interrupt_as_the_plugins_are_set_up_lets_go_of_the_inputs():
    """Ctrl-C while the first shuffle of a cluster sets its plugins up on the workers (a stopped
    worker holds that up, for gpudirect.shuffle.timeout): the error kept (a notebook's last
    one) held every input partition on the workers through its traceback's frames, as a failed
    shuffle's once did. On a cluster of its own: its plugins are not set up yet."""
    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        client.wait_for_workers(2)
        scheduler = lc.scheduler
        real = scheduler.handlers["register_worker_plugin"]

        async def interrupted(comm=None, **msg):  # the caller's Ctrl-C as the set-up starts
            ctrl_c()
            return await real(comm=comm, **msg)

        pdf = frame(2000, keys=97, seed=22)
        df = dd.from_pandas(pdf, npartitions=8)  # computed by the shuffle: held by nothing else
        scheduler.handlers["register_worker_plugin"] = interrupted
        sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt) as kept:
                dg.shuffle(df, "k", client=client)
        finally:
            scheduler.handlers["register_worker_plugin"] = real
            signal.signal(signal.SIGINT, sigint)
        deadline = time.monotonic() + 30  # the inputs, wanted by this client while kept
        while scheduler.tasks:
            assert time.monotonic() < deadline, f"still held: {sorted(map(str, scheduler.tasks))}"
            time.sleep(0.05)
        wait_released(client)
        assert kept.value is not None
        out = dg.shuffle(df, "k", npartitions=4, client=client)
        assert_hash_partitions(partitions(client, out), pdf, "k", 4)


def test_an_interrupt_as_the_rapidsmpf_communicator_starts_gives_its_op_id_back(
    cluster, monkeypatch
):
    """Ctrl-C while the ``rapidsmpf`` engine's communicator starts (seconds, on the first such
    shuffle): the op id the scheduler reserved for the shuffle is given back (it was kept for
    good: RapidsMPF has a fixed number of them). The communicator's start is stood in for:
    RapidsMPF runs on GPU workers only."""
    from dask_gpudirect.shuffle import coordinator, rapidsmpf_engine
    from dask_gpudirect.shuffle.split import HashSplit
    from dask_gpudirect.shuffle.worker import Exchange

    plugin = cluster.cluster.scheduler.plugins["gpudirect-shuffle"]
    started = threading.Event()

    def starting(client, participants, known):  # the two client.run calls of the real one
        started.set()
        ctrl_c()
        client.sync(asyncio.sleep, 30)  # until the interrupt

    monkeypatch.setattr(rapidsmpf_engine, "op_id_limit", lambda: 8)
    monkeypatch.setattr(rapidsmpf_engine, "ensure_ranks", starting)
    meta = frame(0, keys=1)
    workers = tuple(sorted(cluster.nthreads()))
    splitter = HashSplit(["k"], 2, "host", meta, True, True)
    plan = Exchange("interrupted", workers, workers, splitter, "host", ("a", "b"), 1, "rapidsmpf")
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            coordinator._on_rapidsmpf(cluster, plan, {})
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert started.is_set()
    assert "interrupted" not in plugin.op_ids
