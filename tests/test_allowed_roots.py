"""``gpudirect.allowed-roots``: workers read only inside the configured directories.

One cluster whose workers get ``allowed-roots = [<tmp>/data]`` through the nanny's config.
Paths outside (directly, through ``..``, or through a symlink that leads out) are refused with
an InputError that names the file, raised in this process, at planning, and again by the worker
right before it reads; paths inside load as usual.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from distributed import Client
from util import shards_of, start_cluster

import dask_gpudirect as dg
from dask_gpudirect.shards import load


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("roots")
    data, outside = base / "data", base / "outside"
    data.mkdir()
    outside.mkdir()
    np.save(data / "in.npy", np.arange(100, dtype=np.int64))
    np.save(outside / "out.npy", np.arange(50, dtype=np.int64))
    (data / "link").mkdir()
    os.symlink(outside / "out.npy", data / "link" / "out.npy")
    return data, outside


@pytest.fixture(scope="module")
def client(roots):
    data, _ = roots
    config = {"gpudirect.allowed-roots": [str(data)]}
    with start_cluster("tcp", config=config) as cluster, Client(cluster) as c:
        yield c


def test_inside_the_roots_loads(client, roots):
    data, _ = roots
    arr = dg.read_binary(data / "in.npy", client=client)
    np.testing.assert_array_equal(client.compute(arr).result(), np.arange(100))


def test_outside_the_roots_is_refused_at_planning(client, roots):
    _, outside = roots
    with pytest.raises(
        dg.InputError, match=r"out\.npy: no worker can read this file.*allowed-roots"
    ):
        dg.read_binary(outside / "out.npy", client=client)


def test_dot_dot_out_of_the_roots_is_refused(client, roots):
    data, _ = roots
    sneaky = data / ".." / "outside" / "out.npy"
    with pytest.raises(dg.InputError, match="no worker can read this file"):
        dg.read_binary(sneaky, client=client)


def test_symlink_out_of_the_roots_is_refused_at_planning(client, roots):
    """The link lies inside the roots; the worker resolves it and finds its target outside."""
    data, _ = roots
    with pytest.raises(dg.InputError, match=r"link/out\.npy: no worker can read this file"):
        dg.read_binary(data / "link" / "out.npy", client=client)


def test_a_read_outside_the_roots_is_refused_by_the_worker(client, roots):
    """The worker checks again before it reads: a shard planned elsewhere is not trusted."""
    data, outside = roots
    planned = dg.read_binary(data / "in.npy", client=client)
    (shard,) = shards_of(planned).values()
    elsewhere = dataclasses.replace(shard, path=str(data / "link" / "out.npy"))
    with pytest.raises(dg.InputError, match=r"out\.npy: outside gpudirect\.allowed-roots") as info:
        client.submit(load, elsewhere, workers=[shard.worker]).result()
    assert str(outside / "out.npy") in str(info.value)
    # the cluster keeps working
    np.testing.assert_array_equal(client.compute(planned).result(), np.arange(100))
