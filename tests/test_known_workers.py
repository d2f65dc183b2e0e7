"""A read on workers that see the client's own files asks none of them what they see
(:mod:`dask_gpudirect.known_workers`): after one survey, the client lists the paths itself while
the scheduler has the same worker processes and reader plugin. Any change asks the workers again.

Workers in mount namespaces of their own (tests/test_node_local.py) and workers that keep
allowed roots (tests/test_allowed_roots.py) are asked on every read: there the client's own view
would be wrong, and those tests read more than once from one client.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from distributed import Client
from util import assert_same_frame, compute, expected_parquet, plugin_options, start_cluster

import dask_gpudirect as dg
from dask_gpudirect import access, discovery, known_workers
from dask_gpudirect import cluster as dg_cluster


def write(path, start: int, n: int = 500) -> str:
    pd.DataFrame({"x": np.arange(start, start + n), "y": np.ones(n)}).to_parquet(path)
    return os.fspath(path)


# --- run on the workers -------------------------------------------------------------------


def count_surveys() -> None:
    """Count the surveys this worker answers: ``client.run`` finds the function it is sent by
    its module and name here, so it runs this wrapper of the real one."""
    real = getattr(dg_cluster._describe, "__wrapped__", dg_cluster._describe)

    async def _describe(dask_worker, entries, listing):
        _describe.calls += 1
        return await real(dask_worker, entries, listing)

    _describe.calls = 0
    _describe.__wrapped__ = real
    dg_cluster._describe = _describe


def surveys_answered() -> int:
    return getattr(dg_cluster._describe, "calls", 0)


def stop_counting() -> None:
    dg_cluster._describe = getattr(dg_cluster._describe, "__wrapped__", dg_cluster._describe)


# --- tests --------------------------------------------------------------------------------


@pytest.fixture
def counted(tcp):
    """The session's tcp client, its workers counting the surveys they answer."""
    tcp.run(count_surveys)
    yield lambda: sum(tcp.run(surveys_answered).values())
    tcp.run(stop_counting)


def test_a_read_on_workers_that_see_the_clients_files_asks_only_the_scheduler(
    tcp, counted, tmp_path
):
    paths = [write(tmp_path / f"part-{k}.parquet", 500 * k) for k in range(3)]
    dg.read_parquet(tmp_path, client=tcp)  # registers the reader plugin if it is missing
    first = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    asked = counted()
    again = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    paths.append(write(tmp_path / "part-3.parquet", 1500))  # listed by the client, as it is now
    grown = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    assert_same_frame(grown, expected_parquet(paths))
    os.remove(paths[0])
    shrunk = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    assert counted() == asked
    assert_same_frame(again, first)
    assert_same_frame(shrunk, expected_parquet(paths[1:]))
    with pytest.raises(dg.InputError, match=r"part-0\.parquet: no such file"):
        dg.read_parquet(paths[0], client=tcp)


def test_the_survey_without_the_workers_is_what_they_would_answer(tcp, tmp_path):
    paths = [write(tmp_path / f"part-{k}.parquet", 500 * k) for k in range(2)]
    listing = discovery.Listing((".parquet",), recursive=True)
    entries = [os.fspath(tmp_path), paths[0], os.fspath(tmp_path / "*.parquet")]
    for _ in range(2):  # the first may register the reader plugin; the second is remembered
        dg_cluster.survey(tcp, entries, listing)
    assert known_workers.recall(tcp) is not None
    listed = dg_cluster.survey(tcp, entries, listing)
    assert listed == tcp.run(dg_cluster._describe, entries=entries, listing=listing)


def test_the_clients_own_roots_are_not_the_workers(tcp, tmp_path, monkeypatch):
    """Roots in the client's environment (its workers have none) refuse nothing: the client
    lists for the workers as they would (the third read of one file was refused)."""
    path = write(tmp_path / "d.parquet", 0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv(access.ENV, os.fspath(elsewhere))
    for _ in range(3):  # the first may register the reader plugin; the last is remembered
        got = compute(tcp, dg.read_parquet(path, client=tcp))
    assert known_workers.recall(tcp) is not None
    assert_same_frame(got, expected_parquet(path))


def test_a_new_worker_a_restart_or_a_new_reader_plugin_asks_the_workers(tmp_path):
    path = write(tmp_path / "d.parquet", 0)
    entries = [path]
    with start_cluster("tcp", n_workers=1, threads=1) as cluster, Client(cluster) as client:
        dg.read_parquet(path, client=client)  # registers the reader plugin
        dg.read_parquet(path, client=client)
        assert known_workers.recall(client) is not None  # what the changes below must undo
        cluster.scale(2)
        client.wait_for_workers(2)
        assert set(dg_cluster.survey(client, entries)) == set(client.nthreads())

        client.register_plugin(dg.GPUDirectPlugin(threads=3))
        described = dg_cluster.survey(client, entries)
        assert [info["options"]["threads"] for info in described.values()] == [3, 3]
        assert [o["threads"] for o in client.run(plugin_options).values()] == [3, 3]

        client.restart()
        described = dg_cluster.survey(client, entries)
        assert set(described) == set(client.nthreads())
        assert_same_frame(
            compute(client, dg.read_parquet(path, client=client)), expected_parquet(path)
        )
