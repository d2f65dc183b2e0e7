"""A worker plans an unchanged file once (``gpudirect.planning.cache-files``): reading the same
files again reads no footer, and any change to a file, or to the read's options, plans anew. The
client keeps whole reads' plans (``gpudirect.planning.cache-reads``): reading unchanged files
again asks the workers for no plan, and a rewritten file or other options plan anew."""

from __future__ import annotations

import os

import dask
import numpy as np
import pandas as pd
import pytest
from util import assert_same_frame, compute, expected_parquet

import dask_gpudirect as dg
from dask_gpudirect.discovery import Found
from dask_gpudirect.formats import parquet
from dask_gpudirect.plan_cache import PlanCache
from dask_gpudirect.read_plans import ReadPlans, reads

ARGS = (None, None, 2**20, "host")  # columns, filters, blocksize, target


def write(path, start: int, n: int = 1000) -> str:
    pd.DataFrame({"x": np.arange(start, start + n), "y": np.ones(n)}).to_parquet(path)
    return str(path)


class Counting:
    """A planner that counts its calls, around the real Parquet one."""

    def __init__(self):
        self.calls = 0

    def __call__(self, files, *args):
        self.calls += 1
        return parquet.plan(files, *args)


def test_an_unchanged_file_is_planned_once(tmp_path):
    path, cache, planner = write(tmp_path / "a.parquet", 0), PlanCache(), Counting()
    first = cache.plan(path, planner, ARGS)
    assert cache.plan(path, planner, ARGS) is first
    assert (planner.calls, cache.hits) == (1, 1)


def test_a_rewritten_file_is_planned_again(tmp_path):
    path, cache, planner = write(tmp_path / "a.parquet", 0), PlanCache(), Counting()
    first = cache.plan(path, planner, ARGS)
    info = os.stat(path)
    write(path, 1000)  # the same size; the modification time put back as it was
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    again = cache.plan(path, planner, ARGS)
    assert planner.calls == 2 and again.shards[0].stamp.crc != first.shards[0].stamp.crc


def test_other_options_are_planned_again(tmp_path):
    path, cache, planner = write(tmp_path / "a.parquet", 0), PlanCache(), Counting()
    cache.plan(path, planner, ARGS)
    cache.plan(path, planner, (["x"], None, 2**20, "host"))
    cache.plan(path, planner, (None, [("x", ">", 5)], 2**20, "host"))
    assert planner.calls == 3


def test_errors_are_not_kept(tmp_path):
    path, cache, planner = tmp_path / "bad.parquet", PlanCache(), Counting()
    path.write_bytes(b"not parquet at all")
    for _ in range(2):
        with pytest.raises(dg.InputError, match="not a valid Parquet file"):
            cache.plan(str(path), planner, ARGS)
    assert planner.calls == 2 and len(cache) == 0


def test_the_least_recently_used_go_first_and_zero_keeps_none(tmp_path):
    paths = [write(tmp_path / f"{k}.parquet", k) for k in range(3)]
    cache, planner = PlanCache(), Counting()
    with dask.config.set({"gpudirect.planning.cache-files": 2}):
        for path in [*paths, paths[2], paths[0]]:  # 0 was dropped for 2; 2 was kept
            cache.plan(path, planner, ARGS)
    assert (planner.calls, len(cache)) == (4, 2)
    with dask.config.set({"gpudirect.planning.cache-files": 0}):
        cache.clear()
        cache.plan(paths[0], planner, ARGS)
        cache.plan(paths[0], planner, ARGS)
    assert (planner.calls, len(cache)) == (6, 0)


@pytest.mark.parametrize("value", ["abc", -1, 2.5, True])
def test_a_bad_cache_size_is_named(tmp_path, value):
    path = write(tmp_path / "0.parquet", 0)
    with dask.config.set({"gpudirect.planning.cache-files": value}):
        with pytest.raises(dg.ConfigError, match="gpudirect.planning.cache-files=.*: use a whole"):
            PlanCache().plan(path, Counting(), ARGS)


def _hits(dask_worker) -> int:
    from dask_gpudirect.plan_cache import plans

    return plans.hits


def test_a_second_read_plans_from_the_workers_cache(tcp, tmp_path):
    paths = [write(tmp_path / f"part-{k}.parquet", 1000 * k) for k in range(4)]
    before = sum(tcp.run(_hits).values())
    with dask.config.set({"gpudirect.planning.cache-reads": 0}):  # the workers are asked
        first = compute(tcp, dg.read_parquet(paths, client=tcp))
        again = compute(tcp, dg.read_parquet(paths, client=tcp))
    assert sum(tcp.run(_hits).values()) - before == len(paths)
    assert_same_frame(again, first)
    assert_same_frame(again, expected_parquet(paths))


def test_a_second_read_of_unchanged_files_asks_the_workers_for_no_plan(tcp, tmp_path):
    paths = [write(tmp_path / f"part-{k}.parquet", 1000 * k) for k in range(4)]
    workers_before, client_before = sum(tcp.run(_hits).values()), reads.hits
    first = compute(tcp, dg.read_parquet(paths, columns=["x"], client=tcp))
    again = compute(tcp, dg.read_parquet(paths, columns=["x"], client=tcp))
    assert (sum(tcp.run(_hits).values()), reads.hits) == (workers_before, client_before + 1)
    assert_same_frame(again, first)
    assert_same_frame(again, expected_parquet(paths, columns=["x"]))


def test_a_second_read_of_unchanged_files_is_the_same_collection_not_the_same_object(tcp, tmp_path):
    """The kept read's partitions, placement and name come back with its plan (one expression),
    each read a collection of its own: changing the first in place leaves the second alone."""
    paths = [write(tmp_path / f"part-{k}.parquet", 1000 * k) for k in range(4)]
    first = dg.read_parquet(paths, client=tcp)
    hits = reads.collections.hits
    again = dg.read_parquet(paths, client=tcp)
    assert reads.collections.hits == hits + 1
    assert again is not first and again._name == first._name
    first["z"] = first["x"] * 2
    assert list(again.columns) == ["x", "y"] and list(first.columns) == ["x", "y", "z"]
    assert_same_frame(compute(tcp, again), expected_parquet(paths))
    joined = dg.read_parquet(paths, blocksize="1GiB", client=tcp)  # cut otherwise
    assert (joined.npartitions, again.npartitions) == (1, 4)
    assert_same_frame(compute(tcp, joined), expected_parquet(paths))


def test_a_read_after_a_file_changed_or_with_other_options_is_planned_again(tcp, tmp_path):
    paths = [write(tmp_path / f"part-{k}.parquet", 1000 * k) for k in range(3)]
    compute(tcp, dg.read_parquet(paths, client=tcp))
    hits = reads.hits
    write(paths[1], 5000, n=1500)  # another size and modification time: the survey sees both
    changed = compute(tcp, dg.read_parquet(paths, client=tcp))
    assert_same_frame(changed, expected_parquet(paths))
    compute(tcp, dg.read_parquet(paths, filters=[("x", ">", 10)], client=tcp))
    compute(tcp, dg.read_parquet(paths[:2], client=tcp))
    assert reads.hits == hits


def test_the_clients_plans_drop_the_least_recently_used_and_zero_keeps_none(tmp_path):
    found = Found(files=[write(tmp_path / "a.parquet", 0)], readable={"w": set()})
    cache, made = ReadPlans(), []

    def make():
        made.append(object())
        return made[-1]

    with dask.config.set({"gpudirect.planning.cache-reads": 1}):
        first = cache.plan(found, parquet.plan, ARGS, make)
        assert cache.plan(found, parquet.plan, ARGS, make) is first
        cache.plan(found, parquet.plan, (["x"], None, 2**20, "host"), make)
        cache.plan(found, parquet.plan, ARGS, make)  # dropped for the other options
    assert (len(made), len(cache)) == (3, 1)
    with dask.config.set({"gpudirect.planning.cache-reads": 0}):
        cache.clear()
        cache.plan(found, parquet.plan, ARGS, make)
        cache.plan(found, parquet.plan, ARGS, make)
    assert (len(made), len(cache)) == (5, 0)
