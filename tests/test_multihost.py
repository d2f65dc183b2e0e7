"""Across hosts: a scheduler and three worker "hosts" in network namespaces (see netns.py).

Each host has its own data directory, made node-local by setting ``gpudirect.allowed-roots`` to
it in that host's workers (through ``DASK_GPUDIRECT__ALLOWED_ROOTS``): all namespaces share one
filesystem, so the roots stand in for disks that only one host can see. Host ``a`` runs two
worker processes, ``b`` and ``c`` one each. The test process is the client, in the root
namespace, on the same subnet; it always talks to the scheduler over tcp (a ucxx scheduler
listens on tcp too), since its UCX may have started before the test subnet existed.

- loads: every file is read by a worker of the host that holds it, and the array is whole;
- shuffles over tcp and over ucxx (UCX on TCP sockets) are exact, and the ledger shows which
  transfers crossed hosts (the host part of ``worker`` and ``peer`` differ);
- a host cut off mid-shuffle (its link set down inside its namespace) fails the shuffle with a
  ShuffleError naming it, within a bounded time, and the same shuffle then runs on the others;
  over tcp and over ucxx.

The scheduler drops a silent worker after ``distributed.scheduler.worker-ttl`` (30 s here, not
5 minutes: short enough for the cut-off test, long enough that a worker starved of CPU on a
loaded machine is not restarted under a test) and a failed attempt to restart it through its
(also cut off) nanny; connects time out after 30 s. Work stealing is off, so each input stays on
the worker ``spread`` put it on and every host takes part in the shuffle. Needs root and
iproute2; skipped with the reason where ``ip netns add`` fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import dask.dataframe as dd
import netns
import numpy as np
import pandas as pd
import pytest
from distributed import futures_of, wait
from util import (
    UCX_CPU_ENV,
    UCX_PROGRESS_ENV,
    assert_hash_partitions,
    clear_ledgers,
    compute,
    delay_receive,
    partitions,
)

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.shuffle.plugin import service as shuffle_service

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = {"a": 2, "b": 1, "c": 1}  # host -> worker processes
FILES = {"a": 4, "b": 2, "c": 2}  # host -> .npy files in its data directory
ROWS = 1000  # per file
TTL = "30s"  # distributed.scheduler.worker-ttl: how long a silent worker stays in the cluster


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, list[str]]:
    """host -> its files; file k holds the int64 records k * ROWS ... (k + 1) * ROWS - 1."""
    base = tmp_path_factory.mktemp("hosts")
    files: dict[str, list[str]] = {}
    k = 0
    for host, n in FILES.items():
        (base / host).mkdir()
        files[host] = []
        for _ in range(n):
            path = base / host / f"part-{k}.npy"
            np.save(path, np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64))
            files[host].append(str(path))
            k += 1
    return files


def start(protocol: str, data: dict[str, list[str]]):
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces: {reason}")
    # Dask's default: 10 s was not enough for a ucxx connect with another suite beside this one
    common = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "30s"}
    if protocol == "ucxx":
        pytest.importorskip("distributed_ucxx")
        common.update(UCX_CPU_ENV, **UCX_PROGRESS_ENV)
    roots = {
        host: {"DASK_GPUDIRECT__ALLOWED_ROOTS": json.dumps([os.path.dirname(files[0])])}
        for host, files in data.items()
    }
    cluster = netns.NetnsCluster(
        HOSTS,
        protocol=protocol,
        env=roots,
        common_env=common,
        scheduler_env={
            "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": TTL,
            "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
        },
    ).start()
    return cluster, cluster.connect()


@pytest.fixture(scope="module")
def tcp_cluster(data):
    cluster, client = start("tcp", data)
    yield cluster, client
    client.close(timeout=10)
    cluster.close()


@pytest.fixture(scope="module")
def ucxx_cluster(data):
    cluster, client = start("ucxx", data)
    yield cluster, client
    client.close(timeout=10)
    cluster.close()


@pytest.fixture
def tcp_hosts(tcp_cluster):
    """The tcp cluster and its client, made current for the test."""
    ensure_plugins(tcp_cluster[1])  # the shuffle's too, which the tests reach into
    with tcp_cluster[1].as_current():
        yield tcp_cluster


@pytest.fixture
def ucxx_hosts(ucxx_cluster):
    ensure_plugins(ucxx_cluster[1])
    with ucxx_cluster[1].as_current():
        yield ucxx_cluster


# --- run on the workers ------------------------------------------------------------------------


def allowed_roots() -> list[str] | None:
    import dask.config

    return dask.config.get("gpudirect.allowed-roots")


def live_runs(dask_worker) -> list[str]:
    return sorted(shuffle_service(dask_worker).runs)


# --- helpers -----------------------------------------------------------------------------------


def workers_by_host(cluster, client) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for worker in sorted(client.nthreads()):
        found.setdefault(cluster.host_of(worker), []).append(worker)
    return found


def frame(n: int, keys: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"k": rng.integers(0, keys, n), "v": rng.random(n)}, index=np.arange(n) * 2 + 1
    )


def spread(cluster, client, pdf: pd.DataFrame, workers: list[str]):
    """``pdf`` as a Dask DataFrame with one persisted partition on each of ``workers`` (any
    other worker may recompute a lost one). Made of the placed futures themselves: a concat
    would add a task per partition, which the scheduler may run elsewhere (on a loaded
    machine it did), and then a worker could end up with no input and no part in the shuffle."""
    chunks = np.array_split(np.arange(len(pdf)), len(workers))
    parts = [
        client.persist(
            dd.from_pandas(pdf.iloc[rows], npartitions=1), workers=[w], allow_other_workers=True
        )
        for rows, w in zip(chunks, workers, strict=True)
    ]
    futures = [future for part in parts for future in futures_of(part)]
    wait(futures)
    who_has = client.who_has(futures)
    placed = [sorted(who_has[f.key]) for f in futures]
    # no input was moved; if one was, the scheduler's log says which worker left and why
    assert placed == [[w] for w in workers], (placed, cluster.log("sched")[-4000:])
    keys = [f.key for f in futures]
    return dd.from_graph(
        dict(zip(keys, futures, strict=True)),
        pdf.iloc[:0],
        (None,) * (len(keys) + 1),
        keys,
        "spread",
    )


def moved(cluster, client) -> pd.DataFrame:
    """Shuffle records of pieces that went to another worker, with the hosts at both ends."""
    records = ledger_report.records(client)
    records = records[(records["op"] == "shuffle") & (records["path"] != "local")].copy()
    records["src"] = records["worker"].map(cluster.host_of)
    records["dst"] = records["peer"].map(cluster.host_of)
    return records


# --- tests -------------------------------------------------------------------------------------


def test_each_host_reads_its_own_files(tcp_hosts, data):
    """Placement sends every file to a worker of the host whose directory holds it."""
    cluster, client = tcp_hosts
    hosts = workers_by_host(cluster, client)
    assert {h: len(ws) for h, ws in hosts.items()} == HOSTS
    roots = client.run(allowed_roots)
    for worker, root in roots.items():  # the env var reached every worker process
        assert root == [os.path.dirname(data[cluster.host_of(worker)][0])]

    clear_ledgers(client)
    paths = [p for files in data.values() for p in files]
    arr = dg.read_binary(paths, client=client)
    got = compute(client, arr)
    np.testing.assert_array_equal(got, np.arange(len(paths) * ROWS))

    reads = ledger_report.records(client)
    reads = reads[reads["op"] == "read"]
    assert set(reads["file"]) == set(paths)
    for worker, path in zip(reads["worker"], reads["file"], strict=True):
        assert path in data[cluster.host_of(worker)], f"{worker} read {path} of another host"
    assert set(reads["worker"]) == set(client.nthreads())  # host a's two workers share its files
    assert reads["bytes"].sum() >= len(paths) * ROWS * 8


@pytest.mark.parametrize("protocol", ["tcp", "ucxx"])
def test_shuffle_across_hosts(protocol, request):
    cluster, client = request.getfixturevalue(f"{protocol}_hosts")
    workers = sorted(client.nthreads())
    assert all(w.startswith(f"{protocol}://") for w in workers)
    pdf = frame(4000, keys=97, seed=1)
    df = spread(cluster, client, pdf, workers)
    clear_ledgers(client)
    out = dg.shuffle(df, "k", npartitions=8, client=client)
    assert_hash_partitions(partitions(client, out), pdf, "k", 8)

    records = moved(cluster, client)
    assert set(records["path"]) == {"ucx-host" if protocol == "ucxx" else "tcp-host"}
    across = records[records["src"] != records["dst"]]
    within = records[records["src"] == records["dst"]]
    assert (across["bytes"] > 0).all() and across["bytes"].sum() > 0
    # every host sent to every other, and host a's two workers to each other (not across)
    pairs = set(zip(across["src"], across["dst"], strict=True))
    assert pairs == {(s, d) for s in HOSTS for d in HOSTS if s != d}
    assert set(within["src"]) == {"a"} and len(within) > 0


@pytest.mark.parametrize("protocol", ["tcp", "ucxx"])
def test_host_cut_off_mid_shuffle(protocol, request, data):
    """Host a's link goes down while its workers hold up the shuffle: a ShuffleError naming a's
    workers within a bounded time; then the same shuffle runs on b and c.

    Last in the module: host a stays cut off.
    """
    cluster, client = request.getfixturevalue(f"{protocol}_hosts")
    hosts = workers_by_host(cluster, client)
    victims, survivors = hosts["a"], hosts["b"] + hosts["c"]
    pdf = frame(4000, keys=97, seed=2)
    df = spread(cluster, client, pdf, sorted(client.nthreads()))
    client.run(delay_receive, seconds=60, workers=victims)  # keep the exchange in flight

    def shuffle():
        with client.as_current():  # another thread: another context
            return dg.shuffle(df, "k", npartitions=8, client=client)

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(shuffle)
        deadline = time.monotonic() + 30
        while not all(client.run(live_runs, workers=victims).values()):
            assert not running.done(), running.exception()
            assert time.monotonic() < deadline, "the shuffle never started on host a"
            time.sleep(0.05)
        cluster.cut("a")
        cut = time.monotonic()
        with pytest.raises(dg.ShuffleError, match="no output was returned") as info:
            running.result(timeout=300)
    elapsed = time.monotonic() - cut
    assert elapsed < 180, f"the shuffle took {elapsed:.0f} s to fail"  # TTL + grace, or a hang
    assert any(v in str(info.value) for v in victims), str(info.value)

    # the scheduler drops host a's workers; b and c carry on
    deadline = time.monotonic() + 120
    while set(client.nthreads()) & set(victims):
        assert time.monotonic() < deadline, f"{victims} still in the cluster"
        time.sleep(0.2)
    assert sorted(client.nthreads()) == survivors
    deadline = time.monotonic() + 20
    while any(client.run(live_runs, workers=survivors).values()):  # the failed run is gone
        assert time.monotonic() < deadline, client.run(live_runs, workers=survivors)
        time.sleep(0.1)

    clear_ledgers(client)
    out = dg.shuffle(df, "k", npartitions=8, client=client)  # a's inputs recomputed on b, c
    assert_hash_partitions(partitions(client, out), pdf, "k", 8)
    records = moved(cluster, client)
    assert set(records["src"]) | set(records["dst"]) == {"b", "c"}
    assert records["bytes"].sum() > 0
    # loads still work where the data can be read; host a's files now have no reader
    arr = dg.read_binary(data["b"] + data["c"], client=client)
    np.testing.assert_array_equal(
        compute(client, arr), np.arange(FILES["a"] * ROWS, sum(FILES.values()) * ROWS)
    )
    with pytest.raises(dg.InputError, match="outside gpudirect.allowed-roots"):
        dg.read_binary(data["a"], client=client)
