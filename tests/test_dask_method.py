"""Dask's own shuffles with ``shuffle_method="gpudirect"``: group-bys, merges, ``set_index``,
``sort_values`` and ``df.shuffle`` run this package's exchange between the worker processes of
the session clusters, and give what Dask's task shuffle gives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.dataframe.dask_expr._merge import BroadcastJoin
from distributed import Client
from pandas.testing import assert_frame_equal, assert_series_equal
from util import (
    HANG_GUARD,
    assert_released,
    clear_ledgers,
    compute,
    delay_receive,
    partitions,
    sample_frame,
    start_cluster,
)

import dask_gpudirect as dg
from dask_gpudirect import ShuffleError
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.shuffle.api import Computed
from dask_gpudirect.shuffle.plugin import service as shuffle_service

METHOD = {"dataframe.shuffle.method": "gpudirect"}


def lowered(collection) -> dd.DataFrame:
    """``collection`` lowered, which runs its gpudirect shuffles; checked that it did: the
    shuffles' outputs are in the expression, computed."""
    lowered = collection.optimize()
    assert any(isinstance(e, Computed) for e in lowered.expr.walk())
    return lowered


@pytest.mark.parametrize(
    "on,npartitions,ignore_index",
    [("k", 11, False), ("k", 3, True), (["s", "k"], 8, False), ("row", 5, False)],
    ids=str,
)
def test_the_task_shuffles_partitions(client, on, npartitions, ignore_index):
    """``df.shuffle(..., shuffle_method="gpudirect")`` gives, partition by partition, the frames
    Dask's task shuffle gives: the same rows, in the same order, with the same index (with
    ``ignore_index``, the task shuffle drops the index, named ``row`` here, where the meta
    Dask gives this method keeps it: so do we, as P2P does). On columns (hashed on the
    workers as Dask hashes them, numbers as float64) and on the index's name (by the column of
    each row's output Dask adds)."""
    df = dd.from_pandas(sample_frame(3000, keys=40), npartitions=8)
    asked = {"npartitions": npartitions, "ignore_index": ignore_index}
    ours = lowered(df.shuffle(on, shuffle_method="gpudirect", **asked))
    tasks = df.shuffle(on, shuffle_method="tasks", **asked)
    got, expected = partitions(client, ours), partitions(client, tasks)
    assert len(got) == npartitions
    for mine, dasks in zip(got, expected, strict=True):
        assert mine.index.name == ours._meta.index.name == "row"
        if ignore_index:
            mine, dasks = mine.reset_index(drop=True), dasks.reset_index(drop=True)
        assert_frame_equal(mine, dasks)


@pytest.mark.parametrize("index", ["unnamed int", "named", "strings"])
def test_ignore_index_keeps_the_partitions_as_the_meta_says(client, index):
    """With ``ignore_index``, computed partitions match the collection's meta, which Dask
    keeps the index in for every method but its task shuffle: an unnamed integer index is
    labelled 0, 1, 2... (its labels need not move), any other kept (``reset_index()`` gave an
    ``index`` column where the meta said ``ix``)."""
    pdf = sample_frame(600, keys=20).reset_index(drop=True)
    pdf.index = {
        "unnamed int": pdf.index * 3,
        "named": pd.Index(pdf.index * 3, name="ix"),
        "strings": pdf.index.map(lambda i: f"r{i}"),
    }[index]
    df = dd.from_pandas(pdf, npartitions=4)
    out = df.shuffle("k", npartitions=3, ignore_index=True, shuffle_method="gpudirect")
    got = partitions(client, lowered(out))
    for part in got:
        assert part.index.name == out._meta.index.name
        assert part.index.dtype == out._meta.index.dtype
        if index == "unnamed int":
            assert list(part.index) == list(range(len(part)))
    both = pd.concat(got)
    if index != "unnamed int":
        assert sorted(both.index) == sorted(pdf.index)
    reset = out.reset_index()
    assert list(compute(client, reset).columns) == list(reset._meta.columns)


def test_a_series_and_an_expression_as_the_task_shuffle_cuts_them(tcp):
    """What Dask shuffles by the column it adds (a Series on its index, a frame on an
    expression of its columns) gives the task shuffle's partitions too."""
    df = dd.from_pandas(sample_frame(2000, keys=30, seed=4), npartitions=5)
    for make in (
        lambda method: df.v.shuffle(on_index=True, npartitions=3, shuffle_method=method),
        lambda method: df.shuffle(df.k % 7, shuffle_method=method),
    ):
        got = partitions(tcp, lowered(make("gpudirect")))
        for mine, dasks in zip(got, partitions(tcp, make("tasks")), strict=True):
            assert mine.equals(dasks)


def _span(group: pd.DataFrame) -> float:
    return group["v"].max() - group["v"].min()


def test_group_by_merge_and_sort_through_the_config(tcp):
    """With ``dataframe.shuffle.method: gpudirect`` Dask's group-by with ``split_out``, merge,
    ``set_index``, ``sort_values``, ``drop_duplicates`` and a group-by's ``apply`` shuffle through
    the package and give pandas' results."""
    pdf = sample_frame(4000, keys=300, seed=1)
    right = pd.DataFrame({"k": np.arange(0, 300, 2), "w": np.arange(150) * 0.5})
    df = dd.from_pandas(pdf, npartitions=6)
    with dask.config.set(METHOD):
        sums = lowered(df.groupby("k").v.sum(split_out=4))
        merged = lowered(df.merge(dd.from_pandas(right, npartitions=3), on="k"))
        indexed = lowered(df.set_index("v"))
        ordered = lowered(df.sort_values("v"))
        firsts = lowered(df.drop_duplicates(subset="k", split_out=3))
        spans = lowered(df.groupby("k").apply(_span, meta=("v", "f8")))
    assert_series_equal(compute(tcp, sums).sort_index(), pdf.groupby("k").v.sum(), rtol=1e-12)
    expected = pdf.merge(right, on="k").sort_values("v").reset_index(drop=True)
    assert_frame_equal(compute(tcp, merged).sort_values("v").reset_index(drop=True), expected)
    assert_frame_equal(compute(tcp, indexed), pdf.set_index("v").sort_index())
    assert indexed.known_divisions
    assert_frame_equal(compute(tcp, ordered), pdf.sort_values("v"))
    assert_frame_equal(compute(tcp, firsts).sort_index(), pdf.drop_duplicates(subset="k"))
    expected_spans = pdf.groupby("k").apply(_span).rename("v")
    assert_series_equal(compute(tcp, spans).sort_index(), expected_spans)


def test_a_merge_broadcasts_where_asked(tcp):
    """A merge shuffles both sides through the package by default, even with a frame of few
    partitions (where Dask's own methods broadcast it), and takes Dask's broadcast join where
    asked (``broadcast=True``), nothing shuffled. Both give pandas' join."""
    pdf = sample_frame(4000, keys=100, seed=8)
    small = pd.DataFrame({"k": np.arange(100), "w": np.arange(100) * 0.5})
    big, few = dd.from_pandas(pdf, npartitions=64), dd.from_pandas(small, npartitions=2)
    dasks = big.merge(few, on="k", shuffle_method="tasks").optimize()
    assert any(isinstance(e, BroadcastJoin) for e in dasks.expr.walk())  # Dask's would broadcast
    expected = pdf.merge(small, on="k").sort_values("v").reset_index(drop=True)
    for broadcast, joins in ((None, Computed), (True, BroadcastJoin)):
        merged = big.merge(few, on="k", shuffle_method="gpudirect", broadcast=broadcast)
        plan = merged.optimize()
        assert any(isinstance(e, joins) for e in plan.expr.walk()), broadcast
        assert any(isinstance(e, Computed) for e in plan.expr.walk()) == (joins is Computed)
        got = compute(tcp, plan).sort_values("v").reset_index(drop=True)
        assert_frame_equal(got, expected)


def _shuffle_keys_held(dask_worker) -> list:
    return [k for k in dask_worker.data if "gpudirect-shuffle" in str(k)]


def test_outputs_are_let_go_of_once_the_result_is_computed(tcp):
    """The shuffle's outputs live as long as the graph that uses them: computing a group-by
    leaves nothing of the shuffle on the workers."""
    df = dd.from_pandas(sample_frame(2000, keys=50, seed=2), npartitions=5)
    sums = compute(tcp, df.groupby("k").v.sum(split_out=3, shuffle_method="gpudirect"))
    assert len(sums) == 50
    assert_released(tcp, _shuffle_keys_held)


def _breaks_on_big(part: pd.DataFrame) -> pd.DataFrame:
    if part.index.max() > 3000:
        raise ValueError(f"partition with rows up to {part.index.max()} is corrupt")
    return part


def test_a_failed_input_raises_its_own_error(tcp):
    """A partition that fails before the shuffle raises its own error in the user's process,
    and the cluster shuffles again."""
    pdf = sample_frame(2000, keys=50, seed=3)
    df = dd.from_pandas(pdf, npartitions=4)
    broken = df.map_partitions(_breaks_on_big, meta=df._meta)
    with pytest.raises(ValueError, match="partition with rows up to .* is corrupt"):
        compute(tcp, broken.groupby("k").v.sum(split_out=2, shuffle_method="gpudirect"))
    again = compute(tcp, df.groupby("k").v.sum(split_out=2, shuffle_method="gpudirect"))
    assert_series_equal(again.sort_index(), pdf.groupby("k").v.sum(), rtol=1e-12)


def test_without_a_client_the_error_says_to_start_one():
    """The method needs a Dask cluster: without a client it says so, not Dask's 'gpudirect not
    supported'. In a fresh process, where no test's client can be the default one."""
    code = (
        "import dask.dataframe as dd, pandas as pd, dask_gpudirect as dg\n"
        "df = dd.from_pandas(pd.DataFrame({'k': range(10)}), npartitions=2)\n"
        "try:\n"
        "    df.shuffle('k', shuffle_method='gpudirect').compute(scheduler='sync')\n"
        "except dg.ClusterError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no distributed Client is connected: start one" in done.stdout


def _runs(dask_worker) -> list:
    return sorted(shuffle_service(dask_worker).runs)


def test_a_worker_killed_mid_shuffle_fails_the_compute_naming_it():
    """SIGKILL a worker while a Dask group-by's gpudirect shuffle waits on it: the user's
    ``compute()`` raises a ShuffleError naming that worker, soon, and the same group-by then
    runs on the cluster that is left."""
    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        victim, _ = sorted(client.nthreads())
        pid = client.run(os.getpid, workers=[victim])[victim]
        ensure_plugins(client)
        client.run(delay_receive, seconds=60, workers=[victim])
        pdf = sample_frame(2000, keys=97, seed=6)
        df = client.persist(dd.from_pandas(pdf, npartitions=4))
        sums = df.groupby("k").v.sum(split_out=4, shuffle_method="gpudirect")

        def run():
            with client.as_current():
                return compute(client, sums)

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(run)
            deadline = time.monotonic() + HANG_GUARD
            while not client.run(_runs, workers=[victim])[victim]:
                assert not running.done(), running.exception()
                assert time.monotonic() < deadline, "the shuffle never started on the victim"
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(ShuffleError, match="no output was returned") as info:
                running.result(timeout=HANG_GUARD)
        assert time.monotonic() - killed < 30  # the loss is found, not waited out
        assert victim in str(info.value)
        with client.as_current():
            again = compute(client, sums)
        assert_series_equal(again.sort_index(), pdf.groupby("k").v.sum(), rtol=1e-12)


def test_the_cluster_of_the_client_that_computes_runs_the_shuffle(tcp_client):
    """With two clients, ``client.compute(x)``, ``x.compute(scheduler=client)`` and a
    ``scheduler`` config run the exchange on that client's cluster, not on the current
    client's (whose outputs this one then lost as dependencies); Dask's local schedulers are
    refused before any worker runs it."""
    pdf = sample_frame(600, keys=13, seed=8)
    df = dd.from_pandas(pdf, npartitions=3)
    sums = df.groupby("k").v.sum(split_out=2, shuffle_method="gpudirect")
    want = pdf.groupby("k").v.sum()
    with (
        start_cluster("tcp", n_workers=1, threads=1) as lc,
        Client(lc, set_as_default=False) as other,
        other.as_current(),  # the current client is the other one
    ):
        got = tcp_client.compute(sums).result(timeout=HANG_GUARD)
        assert_series_equal(got.sort_index(), want, rtol=1e-12)
        assert_series_equal(sums.compute(scheduler=tcp_client).sort_index(), want, rtol=1e-12)
        with dask.config.set(scheduler=tcp_client):
            assert_series_equal(sums.compute().sort_index(), want, rtol=1e-12)
        for scheduler in ("sync", "threads"):
            with pytest.raises(dg.ClusterError, match=f"local scheduler '{scheduler}'"):
                sums.compute(scheduler=scheduler)
        assert dg.report(other).empty  # nothing ran on the other cluster


def test_dasks_local_scheduler_on_an_executor_is_refused_before_any_worker_runs_it(tcp):
    """``scheduler=ThreadPoolExecutor()`` (in the call, to ``persist`` or in the config) is
    Dask's local scheduler as ``'threads'`` is: refused, not run on the current client's
    cluster and then a "Missing dependency" to the executor."""
    df = dd.from_pandas(sample_frame(600, keys=13, seed=8), npartitions=3)
    sums = df.groupby("k").v.sum(split_out=2, shuffle_method="gpudirect")
    clear_ledgers(tcp)
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(dg.ClusterError, match="local scheduler ThreadPoolExecutor"):
            sums.compute(scheduler=pool)
        with pytest.raises(dg.ClusterError, match="local scheduler ThreadPoolExecutor"):
            sums.persist(scheduler=pool)
        with (
            dask.config.set(scheduler=pool),
            pytest.raises(dg.ClusterError, match="local scheduler ThreadPoolExecutor"),
        ):
            sums.compute()
    assert dg.report(tcp).empty  # nothing ran
