"""A client process killed (SIGKILL: a Jupyter kernel that dies, a script killed, its machine
gone) during its shuffle.

The client tells the scheduler of its shuffle (``gpudirect-shuffle-start``) on its batched stream,
before the stages' graphs. Told after them on a comm of its own, as it was, a client lost in
between (after its stages had run, before its start arrived) left a shuffle the scheduler never
knew: the workers kept every output, which no one publishes or frees, for as long as they live.

The client is a real process, killed with SIGKILL while its stages run on both workers (one
worker's receive is delayed to keep the exchange in flight), or once they have finished and
every comm of its own to the scheduler is cut (it holds back each shuffle call after the plan,
so the stages' outputs wait unpublished).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import sys
import textwrap
import time

import cloudpickle
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, SchedulerPlugin, wait
from util import (
    HANG_GUARD,
    RECEIVE,
    assert_hash_partitions,
    delay_receive,
    partitions,
    start_cluster,
)

import dask_gpudirect as dg
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.shuffle.plugin import service as shuffle_service

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Seconds the workers get to end a shuffle whose client was killed (it takes milliseconds).
CLEANUP = 60
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(dg.__file__)))

CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np, pandas as pd
    import dask.dataframe as dd
    from distributed import Client, wait
    from distributed.core import PooledRPCCall
    import dask_gpudirect as dg

    address, cut = sys.argv[1], sys.argv[2] == "cut"
    if cut:  # its comms to the scheduler, not its stream, never deliver once the shuffle is planned
        real = PooledRPCCall.__getattr__

        def rpc(self, name):
            if not name.startswith("gpudirect_shuffle_") or name == "gpudirect_shuffle_prepare":
                return real(self, name)

            async def never(**msg):
                await asyncio.sleep(3600)

            return never

        PooledRPCCall.__getattr__ = rpc
    client = Client(address)
    rng = np.random.default_rng(21)
    pdf = pd.DataFrame({"k": rng.integers(0, 97, 4000), "v": rng.random(4000)})
    df = client.persist(dd.from_pandas(pdf, npartitions=4))
    wait(df)
    print("READY", client.id, flush=True)
    dg.shuffle(df, "k")
    print("SHUFFLED", flush=True)
    """
)


#: A client that reserves a RapidsMPF op id for a shuffle, then hangs as the engine's
#: communicator starts (seconds, on the first such shuffle; stood in for: RapidsMPF runs on GPU
#: workers only), its start not yet sent.
RESERVING_CLIENT = textwrap.dedent(
    """
    import sys, time
    from distributed import Client
    from dask_gpudirect.shuffle import coordinator, rapidsmpf_engine
    from dask_gpudirect.shuffle.worker import Exchange

    def starting(client, participants, known):
        print("RESERVED", plan.id, flush=True)
        time.sleep(3600)

    rapidsmpf_engine.op_id_limit = lambda: 8
    rapidsmpf_engine.ensure_ranks = starting
    client = Client(sys.argv[1])
    workers = tuple(sorted(client.nthreads()))
    plan = Exchange("reservedlost", workers, workers, None, "host", ("a", "b"), 1, "rapidsmpf")
    coordinator._on_rapidsmpf(client, plan, {})
    """
)


@pytest.fixture(scope="module")
def cluster():
    """Two one-thread tcp workers (the scheduler in this process), made current."""
    cluster = start_cluster("tcp", threads=1)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(2)
    ensure_plugins(client)
    with client.as_current():
        yield client
    client.close()
    cluster.close()


def restore_receive(dask_worker) -> None:
    dask_worker.handlers[RECEIVE] = shuffle_service(dask_worker).receive


def shuffle_state(dask_worker) -> dict:
    """The worker's live runs, the outputs its stages kept unpublished, its spill directories,
    and the keys of its data."""
    service = shuffle_service(dask_worker)
    spills = [d for d in os.listdir(dask_worker.local_directory) if d.startswith("gpudirect-")]
    return {
        "runs": sorted(service.runs),
        "built": {k: len(v) for k, v in service.built.items()},
        "spills": spills,
        "data": list(dask_worker.data),
    }


def spawn_client(cluster, tmp_path, mode: str, code: str = CLIENT) -> subprocess.Popen:
    script = tmp_path / "client.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-u", str(script), cluster.scheduler.address, mode],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "client.log", "w"),
        text=True,
        env=env,
    )


def said(proc: subprocess.Popen, marker: str) -> str:
    """The client's next line that starts with ``marker`` (it fails if the client ends first)."""
    for line in proc.stdout:
        if line.startswith(marker):
            return line.split()[1]
    raise AssertionError(f"the client ended before it said {marker}: rc {proc.wait()}")


def until(condition, what: str, timeout: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def assert_left_nothing(cluster, shuffle_id: str) -> None:
    """Every worker ends the shuffle's run and keeps none of its outputs (no data the scheduler
    does not know), and the scheduler watches it no more; the cluster then shuffles right."""
    scheduler = cluster.cluster.scheduler

    def clean() -> bool:
        state = cluster.run(shuffle_state)
        unknown = [k for s in state.values() for k in s["data"] if k not in scheduler.tasks]
        return not unknown and all(
            not s["runs"] and not s["built"] and not s["spills"] for s in state.values()
        )

    with contextlib.suppress(AssertionError):
        until(clean, "", timeout=CLEANUP)
    state = cluster.run(shuffle_state)
    unknown = {w: [k for k in s["data"] if k not in scheduler.tasks] for w, s in state.items()}
    assert clean(), f"left on the workers: {state}; data the scheduler does not know: {unknown}"
    plugin = scheduler.plugins["gpudirect-shuffle"]
    assert shuffle_id not in plugin.active, "the scheduler watches the shuffle for ever"
    assert shuffle_id not in plugin.reports
    rng = np.random.default_rng(22)
    pdf = pd.DataFrame({"k": rng.integers(0, 53, 3000), "v": rng.random(3000)})
    df = cluster.persist(dd.from_pandas(pdf, npartitions=3))
    wait(df)
    out = dg.shuffle(df, "k", npartitions=5, client=cluster)
    assert_hash_partitions(partitions(cluster, out), pdf, "k", 5)


@contextlib.contextmanager
def exchange_in_flight(cluster):
    """One worker's receive delayed: the stages stay in flight while the test kills the client."""
    slow = sorted(cluster.nthreads())[0]
    cluster.run(delay_receive, seconds=1, workers=[slow])
    try:
        yield
    finally:
        cluster.run(restore_receive)


def the_shuffle(cluster, kept: str) -> str:
    """The one shuffle whose ``kept`` (runs, built) every worker holds, once they all do."""
    held: list[set[str]] = []

    def one() -> bool:
        held[:] = [set(s[kept]) for s in cluster.run(shuffle_state).values()]
        return len(set.union(*held)) == 1 and all(held)

    until(one, f"the workers never all held one shuffle's {kept}: {held}")
    (shuffle_id,) = held[0]
    return shuffle_id


@contextlib.contextmanager
def slow_calls(scheduler, seconds: float):
    """Each shuffle call of the client's own to ``scheduler`` after the plan handled
    ``seconds`` late (a busy network): only its stream keeps messages in order."""
    real = dict(scheduler.handlers)

    def slowed(handler):
        async def late(**msg):
            await asyncio.sleep(seconds)
            result = handler(**msg)
            return await result if inspect.isawaitable(result) else result

        return late

    for name, handler in real.items():
        if name.startswith("gpudirect_shuffle_") and name != "gpudirect_shuffle_prepare":
            scheduler.handlers[name] = slowed(handler)
    try:
        yield
    finally:
        scheduler.handlers.update(real)


def test_the_scheduler_hears_of_a_shuffle_before_its_stages(cluster):
    """Each stage reaches the scheduler after its shuffle's start, however late the client's
    other calls: a client lost at any point after its stages were submitted has them ended by
    the scheduler."""
    scheduler = cluster.cluster.scheduler
    shuffles = scheduler.plugins["gpudirect-shuffle"]
    stages: dict[str, bool] = {}  # stage key -> whether its shuffle was known as it arrived

    class Arrivals(SchedulerPlugin):
        def transition(self, key, start, finish, *args, **kwargs):
            if isinstance(key, str) and key.startswith("gpudirect-shuffle-"):
                shuffle_id = key.removeprefix("gpudirect-shuffle-").rsplit("-", 1)[0]
                stages.setdefault(key, shuffle_id in shuffles.active)  # its first transition

    scheduler.add_plugin(Arrivals(), name="arrivals")
    try:
        pdf = pd.DataFrame({"k": np.arange(400) % 31, "v": np.arange(400.0)})
        df = cluster.persist(dd.from_pandas(pdf, npartitions=4))
        wait(df)
        with slow_calls(scheduler, seconds=0.5):
            out = dg.shuffle(df, "k", client=cluster)
        assert_hash_partitions(partitions(cluster, out), pdf, "k", 4)
    finally:
        scheduler.remove_plugin(name="arrivals")
    assert stages and all(stages.values()), stages


def shuffle_of_a_killed_client(cluster, tmp_path, mode: str, state: str) -> str:
    """The id of the shuffle of a client process (``mode``: see CLIENT) killed once every
    worker holds the shuffle's ``state`` (:func:`the_shuffle`)."""
    proc = spawn_client(cluster, tmp_path, mode)
    try:
        said(proc, "READY")
        return the_shuffle(cluster, state)
    finally:
        proc.kill()
        proc.wait()


def test_a_client_killed_while_its_stages_run(cluster, tmp_path):
    """The client dies with its stages exchanging: the shuffle ends on every worker, which
    keeps nothing, and the scheduler does not watch it."""
    with exchange_in_flight(cluster):
        shuffle_id = shuffle_of_a_killed_client(cluster, tmp_path, "send", "runs")
    assert_left_nothing(cluster, shuffle_id)


def test_a_client_lost_after_its_stages_finished(cluster, tmp_path):
    """The client dies once its stages have finished, every call of its own to the scheduler
    after the plan lost on the way (the start, when it was one; the publish): the workers let
    go of the outputs they kept, which the scheduler knew nothing of when the start was lost."""
    shuffle_id = shuffle_of_a_killed_client(cluster, tmp_path, "cut", "built")
    assert_left_nothing(cluster, shuffle_id)


def start_of_a_closed_client(dask_scheduler, shuffle_id: str, workers: list[str]) -> bool:
    """The start of a shuffle of a client already removed, handled (on the scheduler); whether
    the scheduler watches it."""
    plugin = dask_scheduler.plugins["gpudirect-shuffle"]
    stages = {w: f"gpudirect-shuffle-{shuffle_id}-{i}" for i, w in enumerate(workers)}
    plugin.shuffle_started(shuffle_id, "a-closed-client", workers, stages)
    return shuffle_id in plugin.active


def has_ended(dask_worker, shuffle_id: str) -> bool:
    return shuffle_id in shuffle_service(dask_worker).closed


def test_a_start_after_its_client_closed_ends_the_shuffle(cluster):
    """A start handled after its client's removal (another thread's ``client.close()``, whose
    close-client came first on the stream): every participant hears the shuffle end, and the
    scheduler does not watch it (``adapt`` would never retire its workers)."""
    workers = sorted(cluster.nthreads())
    shuffle_id = "closedclient"
    assert not cluster.run_on_scheduler(
        start_of_a_closed_client, shuffle_id=shuffle_id, workers=workers
    )
    until(
        lambda: all(cluster.run(has_ended, shuffle_id=shuffle_id).values()),
        "a participant never heard the shuffle end",
    )


def test_a_client_killed_with_a_rapidsmpf_op_id_reserved_gives_it_back(cluster, tmp_path):
    """The client dies after the scheduler reserved its shuffle's RapidsMPF op id, before its
    start: the op id is free again (there are a fixed number of them: a few such clients and
    no RapidsMPF shuffle could run until the scheduler restarted)."""
    plugin = cluster.cluster.scheduler.plugins["gpudirect-shuffle"]
    proc = spawn_client(cluster, tmp_path, "", RESERVING_CLIENT)
    try:
        shuffle_id = said(proc, "RESERVED")
        assert shuffle_id in plugin.op_ids
    finally:
        proc.kill()
        proc.wait()
    until(
        lambda: shuffle_id not in plugin.op_ids,
        f"the op id is kept for ever: {plugin.op_ids}",
        timeout=CLEANUP,
    )
