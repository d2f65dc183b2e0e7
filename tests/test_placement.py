"""Placement: each shard is read by the worker placement chose, bytes balanced, stable.

The chosen worker travels inside each shard (``Shard.worker``); the tests recover the shards
from the collection's graph and check ``client.who_has`` after ``persist``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, Event, futures_of, wait
from util import (
    HANG_GUARD,
    assert_same_frame,
    compute,
    expected_parquet,
    shards_of,
    start_cluster,
)

import dask_gpudirect as dg
from dask_gpudirect import compat
from dask_gpudirect.errors import InputError
from dask_gpudirect.formats import binary, parquet
from dask_gpudirect.placement import assign, join_small
from dask_gpudirect.shards import Shard


def placement_after_persist(client, collection) -> dict[int, tuple[str, ...]]:
    """Partition/chunk index -> the workers holding it once persisted."""
    persisted = client.persist(collection)
    wait(persisted)
    return {key[1]: tuple(sorted(ws)) for key, ws in client.who_has(persisted).items()}


def workers_of(client) -> list[str]:
    return sorted(client.nthreads())


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    """Four files of uneven size, many row groups each."""
    root = tmp_path_factory.mktemp("placed")
    rng = np.random.default_rng(0)
    for k, n in enumerate([40_000, 10_000, 25_000, 5_000]):
        t = pa.table({"id": np.arange(n) + 100_000 * k, "v": rng.random(n)})
        pq.write_table(t, root / f"f{k}.parquet", row_group_size=5_000)
    return root


def test_parquet_partitions_live_where_placed(client, parquet_dir):
    df = dg.read_parquet(parquet_dir, blocksize=1, client=client)
    shards = shards_of(df)
    assert sorted(shards) == list(range(df.npartitions)) and df.npartitions == 16
    workers = workers_of(client)
    assert {s.worker for s in shards.values()} == set(workers)  # both workers get work
    where = placement_after_persist(client, df)
    assert where == {i: (s.worker,) for i, s in shards.items()}


def test_parquet_placement_matches_replanning(tcp, parquet_dir):
    """The collection's shards are exactly plan + assign over the workers."""
    files = sorted(os.fspath(p) for p in parquet_dir.iterdir())
    df = dg.read_parquet(parquet_dir, blocksize="1MiB", client=tcp)
    conversion = compat.conversion(None, "host")  # the client's, as dg.read_parquet's
    planned = parquet.plan(files, None, None, 2**20, "host", conversion=conversion).shards
    readable = {w: set(files) for w in workers_of(tcp)}
    expected = assign(join_small(planned, 2**20, readable), readable)
    got = shards_of(df)
    assert [got[i] for i in range(len(expected))] == [p[0] for p in expected]
    assert df.npartitions == len(expected) < len(planned)  # small files were joined
    assert_same_frame(compute(tcp, df), expected_parquet(files))


def test_parquet_placement_is_stable(tcp, parquet_dir):
    first = placement_after_persist(tcp, dg.read_parquet(parquet_dir, blocksize=1, client=tcp))
    again = dg.read_parquet(parquet_dir, blocksize=1, client=tcp)
    assert {i: s.worker for i, s in shards_of(again).items()} == {
        i: ws[0] for i, ws in first.items()
    }
    assert placement_after_persist(tcp, again) == first


def test_parquet_bytes_balanced(tcp, parquet_dir):
    df = dg.read_parquet(parquet_dir, blocksize=1, client=tcp)
    shards = list(shards_of(df).values())
    per_worker = {w: 0 for w in workers_of(tcp)}
    for s in shards:
        per_worker[s.worker] += s.nbytes
    assert max(per_worker.values()) - min(per_worker.values()) <= max(s.nbytes for s in shards)
    assert len(compute(tcp, df)) == len(expected_parquet(sorted(parquet_dir.iterdir())))


def test_binary_chunks_live_where_placed(client, tmp_path):
    files = []
    for k, n in enumerate([3000, 1000, 2000]):
        path = tmp_path / f"a{k}.npy"
        np.save(path, np.arange(n * 4, dtype="<f8").reshape(n, 4))
        files.append(os.fspath(path))
    x = dg.read_binary(files, blocksize=32 * 250, client=client)  # 250 records a chunk
    shards = shards_of(x)
    assert len(shards) == x.numblocks[0] == 24
    per_worker = {w: 0 for w in workers_of(client)}
    for s in shards.values():
        per_worker[s.worker] += s.nbytes
    assert max(per_worker.values()) - min(per_worker.values()) <= 32 * 250
    where = placement_after_persist(client, x)
    assert where == {i: (s.worker,) for i, s in shards.items()}
    again = dg.read_binary(files, blocksize=32 * 250, client=client)
    assert placement_after_persist(client, again) == where

    planned = binary.plan(files, None, None, 32 * 250, "host").shards
    readable = {w: set(files) for w in workers_of(client)}
    assert [shards[i] for i in range(len(planned))] == place(planned, readable)


# --- placement.assign as a unit -------------------------------------------------------


def shard(path: str, nbytes: int) -> Shard:
    return Shard(path=path, ranges=((0, nbytes),), part=None)


def place(shards: list[Shard], readable) -> list[Shard]:
    """``assign`` of one shard per partition, as read_binary places its chunks."""
    return [s for (s,) in assign([(s,) for s in shards], readable)]


def test_assign_only_to_workers_that_can_read():
    shards = [shard("/a/x", 10), shard("/b/y", 10), shard("/a/z", 5), shard("/b/w", 7)]
    readable = {"w1": {"/a/x", "/a/z"}, "w2": {"/a/x", "/a/z", "/b/y", "/b/w"}}
    placed = place(shards, readable)
    assert [s.worker for s in placed] == ["w1", "w2", "w1", "w2"]
    # the workers that may read it where its own leaves: every one that found the file, none
    # named where every worker did (any may)
    assert [s.readers for s in placed] == [(), ("w2",), (), ("w2",)]
    assert [dataclasses.replace(s, worker=None, readers=()) for s in placed] == shards


def test_a_shard_every_worker_can_read_names_no_readers():
    """A shared file system: every worker found every file. The shards name none of them (any
    worker may read one whose own left): named, each task's pickle (and its token) carried the
    address of every worker, 25 KB a task on 1,000 workers where it was 1 KB."""
    shards = [shard(f"/shared/f{i}", 10 + i) for i in range(40)]
    sizes = {}
    for count in (2, 100):
        workers = [f"tcp://10.0.{i // 250}.{i % 250}:40{i:03d}" for i in range(count)]
        placed = place(shards, {w: {s.path for s in shards} for w in workers})
        assert {s.readers for s in placed} == {()}
        sizes[count] = max(len(pickle.dumps(s)) for s in placed)
    assert sizes[100] <= sizes[2] + 8  # the worker's own address, a digit or two longer


def test_assign_balances_and_is_deterministic():
    shards = [shard(f"/d/f{i}", n) for i, n in enumerate([9, 1, 8, 2, 7, 3, 6, 4, 5, 5])]
    readable = {w: {s.path for s in shards} for w in ("w3", "w1", "w2")}
    placed = place(shards, readable)
    assert placed == place(list(shards), dict(reversed(readable.items())))
    load = {w: sum(s.nbytes for s in placed if s.worker == w) for w in readable}
    assert max(load.values()) - min(load.values()) <= 9
    assert sum(load.values()) == 50


def test_assign_no_worker_can_read():
    shards = [shard("/a/x", 10), shard("/hidden/y", 10)]
    with pytest.raises(InputError, match="/hidden/y.*no worker can read"):
        place(shards, {"w1": {"/a/x"}, "w2": {"/a/x", "/b/y"}})
    with pytest.raises(InputError, match="/a/x.*no worker can read"):
        place(shards[:1], {"w1": set()})


def test_small_shards_are_joined_in_order_to_about_the_blocksize():
    shards = [shard(f"/d/f{i}", n) for i, n in enumerate([4, 3, 3, 9, 2, 2, 11, 1])]
    readable = {"w1": {s.path for s in shards}}
    joined = join_small(shards, 10, readable)  # 35 bytes: four spans of 8.75
    assert [[s.path[-1] for s in p] for p in joined] == [
        ["0", "1", "2"],
        ["3"],
        ["4", "5"],
        ["6", "7"],
    ]
    assert [s for p in joined for s in p] == shards  # every shard once, in file order
    assert join_small(shards, 1, readable) == [(s,) for s in shards]
    # at least six partitions (as "auto" asks for two per worker of three)
    assert len(join_small(shards, 100, readable, at_least=6)) >= 5


def test_auto_partitions_give_each_worker_as_many_bytes():
    """Five partitions' worth of equal files on two workers: four partitions, two a worker,
    where five (of two and three files) leave one worker reading 70 bytes while the other,
    done at 50, waits. The count moves to the nearest multiple of the workers (halves down,
    up where nearer), and never past the shards."""
    shards = [shard(f"/d/f{i:02d}", 10) for i in range(12)]
    readable = {w: {s.path for s in shards} for w in ("w1", "w2", "w3", "w4")}
    two = {w: readable[w] for w in ("w1", "w2")}

    def bytes_per_worker(joined: list) -> list[int]:
        load: dict[str, int] = {}
        for s in (s for p in assign(joined, two) for s in p):
            load[s.worker] = load.get(s.worker, 0) + s.nbytes
        return sorted(load.values())

    assert bytes_per_worker(join_small(shards, 25, two)) == [50, 70]  # 120 bytes: five spans
    spread = join_small(shards, 25, two, spread=2)
    assert [len(p) for p in spread] == [3] * 4
    assert [s for p in spread for s in p] == shards  # every shard once, in file order
    assert bytes_per_worker(spread) == [60, 60]
    assert len(join_small(shards, 18, readable, spread=4)) == 8  # seven spans: 1.75 x 4 -> 8
    assert len(join_small(shards, 1000, readable, at_least=4, spread=4)) == 4
    assert len(join_small(shards[:3], 1, readable, spread=4)) == 3


def test_files_of_about_one_size_make_partitions_of_about_one_size():
    """Eight files of 100 +- 1 bytes into four partitions of two, not three, two, two, one."""
    sizes = [100, 101, 100, 99, 101, 100, 99, 100]
    shards = [shard(f"/d/f{i}", n) for i, n in enumerate(sizes)]
    joined = join_small(shards, 1000, {"w1": {s.path for s in shards}}, at_least=4)
    assert [len(p) for p in joined] == [2, 2, 2, 2]


def test_a_partition_joins_only_files_one_worker_can_read():
    """Node-local files: a partition never needs two hosts' disks."""
    shards = [shard("/a/x", 1), shard("/a/y", 1), shard("/b/z", 1), shard("/b/w", 1)]
    readable = {"w1": {"/a/x", "/a/y"}, "w2": {"/b/z", "/b/w"}}
    joined = assign(join_small(shards, 100, readable), readable)
    assert [[(s.path, s.worker) for s in p] for p in joined] == [
        [("/a/x", "w1"), ("/a/y", "w1")],
        [("/b/z", "w2"), ("/b/w", "w2")],
    ]
    # each file readable with the first by some worker, but no worker reads all three
    chain = [shard("/x", 1), shard("/y", 1), shard("/z", 1)]
    overlap = {"w1": {"/x", "/y"}, "w2": {"/x", "/z"}}
    assert [len(p) for p in assign(join_small(chain, 100, overlap), overlap)] == [2, 1]


def test_a_partition_of_small_files_carries_their_common_parts_once(tcp, tmp_path):
    """Each worker plans its files apart, so their columns and layout arrive as copies: the
    read's graph, which the client pickles for the scheduler and the scheduler for each worker,
    carries them once a partition, not once a file."""
    for k in range(64):
        table = pa.table({"id": np.arange(10) + 10 * k, "v": np.ones(10)})
        pq.write_table(table, tmp_path / f"f{k:02}.parquet")
    df = dg.read_parquet(tmp_path, client=tcp)
    graph = dict(df.__dask_graph__())
    partitions = [task.args[0] for task in graph.values()]
    shards = [shard for partition in partitions for shard in partition]
    assert len(shards) == 64 and 1 < len(partitions) < 64  # small files joined
    assert len({id(shard.part.layout) for shard in shards}) == 1
    assert len(pickle.dumps(graph)) < 0.7 * sum(len(pickle.dumps(s)) for s in shards)
    files = sorted(tmp_path.iterdir())
    assert_same_frame(compute(tcp, df), expected_parquet(files))


def _held_by(client, collection) -> set[str]:
    """The workers that hold ``collection``'s pieces once it is computed (waits at most 120 s:
    a read pinned to a worker it cannot run on waits in ``no-worker`` for ever)."""
    futures = futures_of(collection)
    wait(futures, timeout=120)
    return {w for holders in client.who_has(futures).values() for w in holders}


def _small_files(tmp_path) -> tuple[list[str], pd.DataFrame, list[str], np.ndarray]:
    """Six Parquet files and six ``.npy`` files, and what each holds end to end."""
    frames = [pd.DataFrame({"v": np.arange(k * 1000, (k + 1) * 1000)}) for k in range(6)]
    parquets = [str(tmp_path / f"p{k}.parquet") for k in range(6)]
    arrays = [f.v.to_numpy() for f in frames]
    npys = [str(tmp_path / f"a{k}.npy") for k in range(6)]
    for frame, path, array, npy in zip(frames, parquets, arrays, npys, strict=True):
        frame.to_parquet(path, index=False)
        np.save(npy, array)
    return parquets, pd.concat(frames), npys, np.concatenate(arrays)


@pytest.mark.timeout(HANG_GUARD)
def test_reads_under_resources_only_some_workers_have_run_on_those(tmp_path):
    """``dask.annotate(resources={"GPU": 1})`` where one of two workers has a GPU: Dask's own
    readers run on it. Placement pinned half the reads (and chunks) to the other worker, where
    they waited in ``no-worker`` for ever; the shuffle of them too."""
    parquets, frame, npys, array = _small_files(tmp_path)
    with start_cluster("tcp", n_workers=0, threads=1) as cluster, Client(cluster) as client:
        (spec,) = cluster.new_worker_spec().values()
        with_gpu = {**spec["options"], "resources": {"GPU": 1}}
        cluster.worker_spec.update(gpu={**spec, "options": with_gpu}, cpu=spec)
        cluster.sync(cluster._correct_state)
        client.wait_for_workers(2)
        (gpu,) = (w for w, i in client.scheduler_info()["workers"].items() if i["resources"])
        with dask.annotate(resources={"GPU": 1}):
            df = client.persist(dg.read_parquet(parquets, blocksize=1, client=client))
            arr = client.persist(dg.read_binary(npys, blocksize=1, client=client))
            assert _held_by(client, df) == _held_by(client, arr) == {gpu}  # before: TimeoutError
            out = dg.shuffle(df, "v", npartitions=3, client=client)
            shuffled = dg.shuffle_array(arr, seed=1, client=client)
        assert_same_frame(df.compute(), frame)
        assert (arr.compute() == array).all()
        got = out.compute().sort_values("v").reset_index(drop=True)
        assert_same_frame(got, frame.reset_index(drop=True))
        assert (np.sort(shuffled.compute()) == array).all()


def test_reads_the_caller_restricts_to_a_worker_run_on_it(tcp, tmp_path):
    """``client.persist(df, workers=[a])`` and ``dask.annotate(workers=[a])``: Dask's own
    readers run on ``a``, and so do these (the files are on a disk every worker sees).
    Placement pinned half of them to the other worker instead. With ``allow_other_workers``
    ``a`` is only preferred (Dask's work stealing may move such a task): the data is checked.
    Each case reads files of its own: the same read again would reuse the tasks (keys) of
    the one before, restrictions and all, until the scheduler forgets them."""
    a = workers_of(tcp)[0]
    for case in ("persist", "annotate", "loose"):
        (tmp_path / case).mkdir()
        parquets, frame, npys, array = _small_files(tmp_path / case)
        reads = [
            dg.read_parquet(parquets, blocksize=1, client=tcp),
            dg.read_binary(npys, blocksize=1, client=tcp),
        ]
        if case == "persist":
            df, arr = tcp.persist(reads, workers=[a])
        else:
            with dask.annotate(workers=[a], allow_other_workers=case == "loose"):
                df, arr = tcp.persist(reads)
        held = [_held_by(tcp, df), _held_by(tcp, arr)]
        if case != "loose":
            assert held == [{a}, {a}], case  # before: both workers
        assert_same_frame(df.compute(), frame)
        assert (arr.compute() == array).all()


def _gated(part):
    assert Event("gpudirect-test-placement-go").wait(timeout=HANG_GUARD)
    return part


@pytest.mark.timeout(HANG_GUARD)
def test_reads_restricted_by_worker_names_run_on_when_one_of_those_leaves(tmp_path):
    """``workers=[0, 1]``: LocalCluster's worker names, which Distributed takes as aliases.
    Worker 1 retires while reads pinned to it wait: placement looked the caller's names up
    again, 1 no longer an alias (Distributed drops it first) nor a string, and the TypeError
    ended its ``remove_worker``: the reads stayed restricted to the worker gone, for ever."""
    parquets, frame, _, _ = _small_files(tmp_path)
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        by_name = {i["name"]: w for w, i in client.scheduler_info()["workers"].items()}
        go = Event("gpudirect-test-placement-go", client=client)
        df = dg.read_parquet(parquets, blocksize=1, client=client)
        df = df.map_partitions(_gated, meta=df._meta)  # fused into the read: held as it runs
        placed = {shard.worker for shard in shards_of(df.optimize()).values()}
        assert placed == set(by_name.values())  # some on worker 1
        df = client.persist(df, workers=[0, 1])
        deadline = time.monotonic() + 120
        while not client.processing([by_name[1]])[by_name[1]]:  # its graph came, 1 reads
            assert time.monotonic() < deadline
            time.sleep(0.05)
        client.retire_workers([by_name[1]], close_workers=True)
        go.set()
        wait(futures_of(df), timeout=120)  # before the fix: TimeoutError
        assert_same_frame(df.compute(), frame)
