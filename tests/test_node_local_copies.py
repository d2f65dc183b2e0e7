"""Node-local copies: one file on the own disks of some hosts (not all), as scratch that a job
staged onto a few nodes. Three worker "hosts" in network namespaces (see netns.py), each with a
fresh tmpfs at ``LOCAL`` of its own; hosts ``a`` and ``b`` hold copies of the same files, ``c``
holds none.

- a host killed while it loads its shards: they are read by the host that holds the copies
  (``b``), never sent to one that sees no such file (``c``).

Needs root, iproute2 and unshare; skipped with the reason where ``ip netns add`` fails.
"""

from __future__ import annotations

import os
import secrets
import sys

import cloudpickle
import netns
import numpy as np
import pytest
from distributed import WorkerPlugin
from util import compute, shards_of

import dask_gpudirect as dg
from dask_gpudirect import ledger_report

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = {"a": 1, "b": 1, "c": 1}
LOCAL = f"/tmp/gd-copies-{secrets.token_hex(4)}"  # every host's own disk, at one path
ROWS = 500  # per file
FILES = 6


@pytest.fixture(scope="module")
def hosts():
    with netns.private_disks(HOSTS, LOCAL) as both:
        yield both


def on_host(cluster, client, host: str) -> str:
    (worker,) = (w for w in client.nthreads() if cluster.host_of(w) == host)
    return worker


def write_copies(directory: str) -> list[str]:
    """``FILES`` .npy files; file k holds ids k*ROWS ... (run on a host: its own copies)."""
    written = []
    for k in range(FILES):
        np.save(f"{directory}/part-{k}.npy", np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64))
        written.append(f"{directory}/part-{k}.npy")
    return written


class KillHostWhenLoading(WorkerPlugin):
    """Kills this worker's whole host (worker and nanny) as it starts loading a shard."""

    name = "kill-host-when-loading"

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and "gpudirect-read" in str(key):
            os.killpg(os.getpgid(0), 9)


def test_shards_of_a_dead_host_are_read_by_a_host_that_holds_copies(hosts):
    """Host a dies as it starts reading. Its shards' files lie also on b's disk, not on c's: b
    reads them. (Placement's restriction was dropped when a left, so the scheduler gave them to
    idle c, whose read failed with "no such file" while b, which holds them, was alive.)

    Last in the module: host a stays dead.
    """
    cluster, client = hosts
    a, b, c = (on_host(cluster, client, h) for h in "abc")
    for worker in (a, b):
        client.run(write_copies, LOCAL, workers=[worker])
    arr = dg.read_binary(f"{LOCAL}/*.npy", blocksize=ROWS * 8, client=client)  # a chunk a file
    placed = {s.worker for s in shards_of(arr).values()}
    assert placed == {a, b}  # c sees none of the files
    client.run(
        lambda dask_worker: dask_worker.plugins.update(kill=KillHostWhenLoading()), workers=[a]
    )
    np.testing.assert_array_equal(compute(client, arr), np.arange(FILES * ROWS))
    assert a not in client.nthreads()  # it did die
    reads = ledger_report.records(client)
    readers = set(reads[reads["op"] == "read"]["worker"])
    assert readers == {b}, readers  # a's shards, read again by the host with the copies
