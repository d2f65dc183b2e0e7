"""A client process killed (SIGKILL: a Jupyter kernel that dies, a script killed) as its shuffle's
stages start, before the scheduler has heard of the shuffle.

The client submits the stages on its batched stream, then tells the scheduler of the shuffle
(``gpudirect_shuffle_start``) on a comm of its own. Killed in between, the scheduler releases
the stages (its client left) but cannot end the shuffle on the workers: it knows of none. The
stages, cancelled but still running, finished the exchange and kept every output, which no one
publishes or frees, for as long as the workers live; a start handled after the client's removal
was watched for ever (its workers never retired by ``adapt``).

The client is a real process, killed with SIGKILL once its stages run on both workers (one
worker's receive is delayed to keep the exchange in flight). Which of the two comms the scheduler
reads first is a race; each test makes one order happen: the start held on the scheduler until
the client's removal is handled, or never sent (the client process holds it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import cloudpickle
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, wait
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

    address, hold_start = sys.argv[1], sys.argv[2] == "hold"
    if hold_start:  # killed before the start leaves: it never does
        real = PooledRPCCall.__getattr__

        def rpc(self, name):
            if name != "gpudirect_shuffle_start":
                return real(self, name)

            async def never(**msg):
                print("STAGES", msg["shuffle_id"], flush=True)
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


def spawn_client(cluster, tmp_path, mode: str) -> subprocess.Popen:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
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


def test_a_client_killed_before_the_scheduler_hears_of_its_shuffle(cluster, tmp_path):
    """The start reaches the scheduler after the client's removal was handled: the shuffle ends
    on every worker, which keeps nothing, and the scheduler does not watch it."""
    scheduler = cluster.cluster.scheduler
    real = scheduler.handlers["gpudirect_shuffle_start"]
    arrived, killed, handled = threading.Event(), threading.Event(), threading.Event()
    started: list[str] = []

    async def start_after_the_removal(**msg):
        started.append(msg["shuffle_id"])
        arrived.set()
        while not killed.is_set() or msg["client"] in scheduler.clients:
            await asyncio.sleep(0.01)
        try:
            return real(**msg)
        finally:
            handled.set()

    scheduler.handlers["gpudirect_shuffle_start"] = start_after_the_removal
    try:
        with exchange_in_flight(cluster):
            proc = spawn_client(cluster, tmp_path, "send")
            try:
                said(proc, "READY")
                until(arrived.is_set, "the shuffle's start never reached the scheduler")
                until(
                    lambda: all(s["runs"] for s in cluster.run(shuffle_state).values()),
                    "the stages never ran on both workers",
                )
            finally:
                proc.kill()
                proc.wait()
            killed.set()
            until(handled.is_set, "the start was never handled")
    finally:
        scheduler.handlers["gpudirect_shuffle_start"] = real
    assert_left_nothing(cluster, started[0])


def test_a_client_killed_before_it_tells_the_scheduler_of_its_shuffle(cluster, tmp_path):
    """The client dies with its stages running and the start never sent: the stages, cancelled,
    end the shuffle on their workers, which keep nothing."""
    with exchange_in_flight(cluster):
        proc = spawn_client(cluster, tmp_path, "hold")
        try:
            said(proc, "READY")
            shuffle_id = said(proc, "STAGES")
            until(
                lambda: all(shuffle_id in s["runs"] for s in cluster.run(shuffle_state).values()),
                "the stages never ran on both workers",
            )
        finally:
            proc.kill()
            proc.wait()
    assert_left_nothing(cluster, shuffle_id)
