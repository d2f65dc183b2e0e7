"""Node-local data: files that only one host's workers can see, at one path on every host.

Two worker "hosts" in network namespaces (see netns.py), each with a mount namespace of its own
that puts a fresh tmpfs over the same directory: every host has its own empty "local NVMe" at
``LOCAL``, and the test process, the client, sees none of what the hosts write there. Files are
written by the hosts' own workers. Host ``a`` runs two worker processes (they share a's disk),
``b`` one.

- planning happens on the workers, so files the client cannot see are planned and loaded, each
  by a worker of the host that holds it;
- one name on two hosts with different sizes is two different files: a clear error;
- a host killed while it loads its files: nobody else can read them, and the error names them.

Needs root, iproute2 and unshare; skipped with the reason where ``ip netns add`` fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys

import cloudpickle
import netns
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import WorkerPlugin
from util import clear_ledgers, compute, shards_of

import dask_gpudirect as dg
from dask_gpudirect import ledger_report

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = {"a": 2, "b": 1}
LOCAL = f"/tmp/gd-local-{secrets.token_hex(4)}"  # every host's own disk, at one path
ROWS = 500  # per file


@pytest.fixture(scope="module")
def hosts():
    # Distributed's own connect timeout (30 s): a shorter one lost a worker of host a on a
    # loaded machine, where a connect can take longer than 10 s.
    with netns.private_disks(HOSTS, LOCAL) as both:
        yield both


def on_host(cluster, client, host: str) -> list[str]:
    return sorted(w for w in client.nthreads() if cluster.host_of(w) == host)


# --- run on the workers ------------------------------------------------------------------------


def write_files(directory: str, host: str, first: int, n: int) -> list[str]:
    """``n`` Parquet and ``n`` .npy files of this host; file k holds ids k*ROWS ... in both."""
    written = []
    for k in range(first, first + n):
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        table = pa.table({"id": ids, "host": [host] * ROWS})
        pq.write_table(table, f"{directory}/{host}-{k}.parquet", row_group_size=100)
        np.save(f"{directory}/{host}-{k}.npy", ids)
        written += [f"{directory}/{host}-{k}.parquet", f"{directory}/{host}-{k}.npy"]
    return written


def remove(paths: list[str]) -> None:
    """Remove ``paths`` where they are; run on every worker, so host a's two workers, which
    share its disk, race for each file: the one that finds it gone has nothing to do."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def save(path: str, array: np.ndarray) -> None:
    np.save(path, array)


class KillHostWhenLoading(WorkerPlugin):
    """Kills this worker's whole host (its process group: the nanny too, so nothing restarts)
    the moment the worker starts loading a shard."""

    name = "kill-host-when-loading"

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and "gpudirect-read" in str(key):
            os.killpg(os.getpgid(0), 9)


# --- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(hosts):
    """host -> the files its first worker wrote on its own disk (host a: 3 of each, b: 2)."""
    cluster, client = hosts
    written = {}
    for first, (host, n) in zip((0, 3), (("a", 3), ("b", 2)), strict=True):
        (worker, *_) = on_host(cluster, client, host)
        written[host] = client.run(write_files, LOCAL, host, first, n, workers=[worker])[worker]
    return written


def test_files_only_the_workers_see_are_planned_and_read_on_their_host(hosts, files):
    cluster, client = hosts
    assert os.listdir(LOCAL) == []  # the client sees none of them
    clear_ledgers(client)

    df = dg.read_parquet(f"{LOCAL}/*.parquet", blocksize=1, client=client)  # a row group each
    got = compute(client, df)
    expected = pd.concat(
        pd.DataFrame({"id": np.arange(k * ROWS, (k + 1) * ROWS), "host": h})
        for h, k in [("a", 0), ("a", 1), ("a", 2), ("b", 3), ("b", 4)]
    ).astype({"host": pd.StringDtype("pyarrow")})  # as dd.read_parquet gives strings
    pd.testing.assert_frame_equal(
        got.sort_values("id").reset_index(drop=True), expected.reset_index(drop=True)
    )
    for shard in shards_of(df).values():  # placed on the host whose disk holds the file
        assert cluster.host_of(shard.worker) == os.path.basename(shard.path)[0]

    arr = dg.read_binary(f"{LOCAL}/*.npy", client=client)
    np.testing.assert_array_equal(compute(client, arr), np.arange(5 * ROWS))

    reads = ledger_report.records(client)
    reads = reads[reads["op"] == "read"]
    assert set(reads["file"]) == {p for ps in files.values() for p in ps}
    for worker, path in zip(reads["worker"], reads["file"], strict=True):
        assert os.path.basename(path)[0] == cluster.host_of(worker), f"{worker} read {path}"
    assert set(reads["worker"]) == set(client.nthreads())  # a's two workers share its disk


def test_one_name_with_different_files_on_two_hosts_is_an_error(hosts, files):
    cluster, client = hosts
    clash = f"{LOCAL}/clash.npy"
    a, b = on_host(cluster, client, "a")[0], on_host(cluster, client, "b")[0]
    client.run(save, clash, np.arange(10), workers=[a])
    client.run(save, clash, np.arange(20), workers=[b])
    try:
        with pytest.raises(dg.InputError, match=r"clash\.npy: differs between workers"):
            dg.read_binary(clash, client=client)
    finally:
        client.run(remove, [clash])
    with pytest.raises(dg.InputError, match=r"nowhere\.npy: no such file or directory on any"):
        dg.read_binary(f"{LOCAL}/nowhere.npy", client=client)


def test_a_read_the_caller_sends_away_from_its_files_says_so(hosts, files):
    """``persist(workers=[a])`` of reads of b's files: no worker the caller allows can see them,
    so they run on a and fail naming a file; the error said b "left the cluster" (b is alive,
    and the next read of its files works)."""
    cluster, client = hosts
    (a, _), (b,) = on_host(cluster, client, "a"), on_host(cluster, client, "b")
    arr = dg.read_binary(f"{LOCAL}/b-*.npy", client=client)
    with pytest.raises(dg.InputError) as info:
        compute(client, client.persist(arr, workers=[a]))
    message = str(info.value)
    assert info.value.path in files["b"], message
    assert f"read on {a}, not on {b} where placement put it" in message
    assert "the restrictions the read was computed with (workers=, resources=)" in message
    assert b in client.nthreads()  # and reads there (of other keys than the failed ones) work
    got = compute(client, dg.read_parquet(f"{LOCAL}/b-*.parquet", client=client))
    assert sorted(got["id"]) == list(range(3 * ROWS, 5 * ROWS))


def test_host_killed_while_loading_its_files_names_them(hosts, files):
    """Host b dies (worker and nanny) as it starts reading: its files are on no other disk, so
    the load fails with an InputError naming one of them, and host a keeps working.

    Last in the module: host b stays dead.
    """
    cluster, client = hosts
    (b,) = on_host(cluster, client, "b")
    arr = dg.read_binary(f"{LOCAL}/*.npy", client=client)  # planned while b is alive
    client.run(
        lambda dask_worker: dask_worker.plugins.update(kill=KillHostWhenLoading()), workers=[b]
    )
    with pytest.raises(dg.InputError) as info:
        compute(client, arr)
    message = str(info.value)
    assert info.value.path in files["b"], message
    assert f"not on {b} where placement put it: that worker left the cluster" in message
    assert "no such file" in message.lower()
    assert b not in client.nthreads()
    again = dg.read_binary(f"{LOCAL}/a-*.npy", client=client)
    np.testing.assert_array_equal(compute(client, again), np.arange(3 * ROWS))
