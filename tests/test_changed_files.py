"""Files that change between planning and reading fail loudly, never give other rows.

A plan is made from a file's size, footer or header and statistics; each shard carries that
stamp and every read checks it on the file it opened. The changes here are the ones a user
meets: a Parquet file rewritten with the same size (where old statistics would prune the new
rows away), a ``.npy`` replaced by a bigger array, a raw file rewritten in place, a Parquet file
grown or retyped, and a persisted result recomputed after a worker loss.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, wait
from util import assert_same_frame, compute, expected_parquet, later, shards_of, start_cluster

import dask_gpudirect as dg

CHANGED = "changed since it was planned"


def write_fixed(path, values, **kwargs) -> None:
    """Plain int64 pages, no compression or dictionary: the same row count, the same size."""
    table = pa.table({"x": np.asarray(values, dtype=np.int64), "y": np.arange(len(values))})
    pq.write_table(
        table, path, compression="none", use_dictionary=False, row_group_size=12_500, **kwargs
    )


def raises_changed(path):
    return pytest.raises(dg.InputError, match=f"{path}: {CHANGED}")


def test_parquet_rewritten_with_the_same_size(tcp, tmp_path):
    """Planned when every x was <= 5, so every row group was pruned; rewritten with x > 5.
    Without the check, 0 rows would come back where the file now has 50,000."""
    path = tmp_path / "same-size.parquet"
    write_fixed(path, np.arange(50_000) % 6)
    size = os.path.getsize(path)
    pruned = dg.read_parquet(path, filters=[("x", ">", 5)], client=tcp)
    kept = dg.read_parquet(path, filters=[("x", ">", 2)], blocksize=1, client=tcp)
    write_fixed(path, 6 + np.arange(50_000) % 6)
    assert os.path.getsize(path) == size
    with raises_changed(path):
        compute(tcp, pruned)
    with raises_changed(path):
        compute(tcp, kept)
    # planned again, the new rows are there
    got = compute(tcp, dg.read_parquet(path, filters=[("x", ">", 5)], client=tcp))
    assert len(got) == 50_000


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_planned_again(tcp, tmp_path):
    """``cp -p`` and ``rsync -t`` keep a file's modification time: a read after such a rewrite
    plans the new version (its status-change time is new), so ``len`` answered from the footers
    and the rows are the new file's, and the error's advice to read again holds."""
    path = tmp_path / "kept-mtime.parquet"
    write_fixed(path, np.arange(50_000) % 6)
    before = os.stat(path)
    assert len(dg.read_parquet(path, filters=[("x", ">", 5)], client=tcp)) == 0
    write_fixed(path, 6 + np.arange(50_000) % 6)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size
    again = dg.read_parquet(path, filters=[("x", ">", 5)], client=tcp)
    assert len(again) == 50_000 == len(compute(tcp, again))


def test_parquet_grown_or_retyped(tcp, tmp_path):
    """Not "magic bytes not found ... corrupted": the file changed, and the error says so."""
    grown, retyped = tmp_path / "grown.parquet", tmp_path / "retyped.parquet"
    write_fixed(grown, np.arange(1000))
    write_fixed(retyped, np.arange(1000))
    dfs = {p: dg.read_parquet(p, client=tcp) for p in (grown, retyped)}
    write_fixed(grown, np.arange(3000))
    pq.write_table(pa.table({"x": np.arange(1000.0), "y": np.arange(1000.0)}), retyped)
    for path, df in dfs.items():
        with raises_changed(path):
            compute(tcp, df)


@pytest.mark.parametrize(
    "replacement",
    [
        np.arange(5000, dtype=np.int64) + 10_000,  # a bigger array
        np.arange(1000, dtype=np.float64),  # same size, another dtype: the header's checksum tells
    ],
    ids=["bigger", "same-size-retyped"],
)
def test_npy_replaced(tcp, tmp_path, replacement):
    path = tmp_path / "replaced.npy"
    np.save(path, np.arange(1000, dtype=np.int64))
    arr = dg.read_binary(path, client=tcp)
    np.save(path, replacement)
    with raises_changed(path):
        compute(tcp, arr)


def test_raw_file_rewritten_in_place(tcp, tmp_path):
    path = tmp_path / "records.raw"
    np.arange(1000, dtype=np.int64).tofile(path)
    arr = dg.read_binary(path, dtype="i8", client=tcp)
    np.full(1000, -1, dtype=np.int64).tofile(path)
    later(path)
    with pytest.raises(dg.InputError, match=f"{path}: {CHANGED} \\(modified at .* now at"):
        compute(tcp, arr)


def test_unchanged_files_still_read_after_a_touch_free_copy(tcp, tmp_path):
    """The stamp is no false alarm: reading the same file twice, and after reading it with
    another program, gives its rows."""
    path = tmp_path / "steady.parquet"
    write_fixed(path, np.arange(5000))
    df = dg.read_parquet(path, blocksize=1, client=tcp)
    for _ in range(2):
        assert_same_frame(compute(tcp, df), expected_parquet(path))


def test_a_persisted_result_is_never_two_versions(tmp_path):
    """Persisted, then the file is rewritten and a worker holding half of it dies: the lost
    half is recomputed from the new file only if nothing changed. Here it changed, so the
    result is an error naming the file, not 25,000 old rows beside 25,000 new ones."""
    path = tmp_path / "persisted.parquet"
    write_fixed(path, np.arange(50_000))
    with start_cluster("tcp", n_workers=2, threads=1) as cluster, Client(cluster) as client:
        df = dg.read_parquet(path, blocksize=1, client=client)  # 4 row groups, 4 partitions
        workers = {s.worker for s in shards_of(df).values()}
        assert len(workers) == 2  # both workers hold part of it
        df = client.persist(df)
        wait(df)
        write_fixed(path, np.arange(50_000) + 1_000_000)
        later(path)
        victim = sorted(workers)[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        with raises_changed(path):
            client.compute(df).result(timeout=300)
        client.wait_for_workers(2, timeout=300)  # the nanny's restart, before the cluster closes
