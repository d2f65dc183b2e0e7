"""``target``: None picks host on this GPU-less cluster; "device" is a clear error."""

from __future__ import annotations

import threading

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import compute, partitions

import dask_gpudirect as dg


@pytest.fixture
def files(tmp_path):
    pq_path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"i": np.arange(100), "s": list("ab") * 50}), pq_path, row_group_size=25
    )
    npy_path = tmp_path / "a.npy"
    np.save(npy_path, np.arange(40.0).reshape(20, 2))
    return pq_path, npy_path


@pytest.mark.parametrize("target", [None, "host"])
def test_host_partitions_are_pandas_and_numpy(client, files, target):
    pq_path, npy_path = files
    df = dg.read_parquet(pq_path, blocksize=1, target=target, client=client)
    assert isinstance(df._meta, pd.DataFrame)
    parts = partitions(client, df)
    assert len(parts) == 4 and all(type(p) is pd.DataFrame for p in parts)

    x = dg.read_binary(npy_path, blocksize=80, target=target, client=client)
    assert type(x._meta) is np.ndarray
    blocks = client.gather(client.compute(list(x.to_delayed().ravel())))
    assert len(blocks) == 4 and all(type(b) is np.ndarray for b in blocks)
    np.testing.assert_array_equal(compute(client, x), np.load(npy_path))


def test_device_target_without_gpu(tcp, files):
    pq_path, npy_path = files
    workers = sorted(tcp.nthreads())
    with pytest.raises(dg.InputError, match="target='device'.*no GPU") as info:
        dg.read_parquet(pq_path, target="device", client=tcp)
    assert all(w in str(info.value) for w in workers)
    with pytest.raises(dg.InputError, match="no GPU"):
        dg.read_binary(npy_path, target="device", client=tcp)


def test_device_target_from_config(tcp, files):
    """``gpudirect.target`` in Dask config is checked the same way as the keyword."""
    with dask.config.set({"gpudirect.target": "device"}):
        with pytest.raises(dg.InputError, match="no GPU"):
            dg.read_parquet(files[0], client=tcp)
    with dask.config.set({"gpudirect.target": "host"}):
        assert len(compute(tcp, dg.read_parquet(files[0], client=tcp))) == 100


def test_host_cut_gives_each_output_memory_of_its_own_strings_too():
    """A worker spills shuffle outputs one by one, so each must hold only its own bytes:
    pandas' copy of a slice shares an Arrow column's buffers (``str`` is one in pandas 3), and
    one output of four kept all of the frame's strings."""
    from dask_gpudirect.targets import host

    start = pa.total_allocated_bytes()
    frame = pd.DataFrame({"s": [f"value-{i:08d}" for i in range(200_000)], "x": range(200_000)})
    frame["l"] = pd.array([[i] for i in range(200_000)], dtype=pd.ArrowDtype(pa.list_(pa.int64())))
    whole = pa.total_allocated_bytes() - start
    parts = host.cut_frame(frame, np.array([0, 50_000, 100_000, 150_000, 200_000]))
    kept = parts[1]
    del frame, parts
    assert pa.total_allocated_bytes() - start < whole / 3
    assert kept["s"].tolist() == [f"value-{i:08d}" for i in range(50_000, 100_000)]
    assert kept["l"].tolist() == [[i] for i in range(50_000, 100_000)]
    assert str(kept["s"].dtype) == "str"


def test_an_empty_output_holds_none_of_its_chunks_memory():
    """An output that gets no rows is made like a worker's split chunk (its categories and
    types), and lives as long as the output: a zero-row slice's copy held all of the chunk's
    Arrow buffers."""
    from dask_gpudirect.shuffle.split import HashSplit

    start = pa.total_allocated_bytes()
    chunk = pd.DataFrame({"s": [f"value-{i:08d}" for i in range(200_000)], "k": range(200_000)})
    meta = pd.DataFrame({"s": pd.Series([], dtype="str"), "k": pd.Series([], dtype="int64")})
    splitter = HashSplit(["k"], 4, "host", meta)
    empty = splitter.owned(splitter.rows(chunk, 0, 0))
    del chunk
    assert pa.total_allocated_bytes() - start < 1024
    assert empty.empty and str(empty["s"].dtype) == "str" and list(empty) == ["s", "k"]


def test_host_permutations_shuffle_each_run_by_its_own_seed():
    """``dg.shuffle_array``'s permutations on the host: each run a permutation of its own rows,
    drawn from its seed alone (the same run among other runs, or alone, in the same order)."""
    from dask_gpudirect.targets import host

    lengths = np.array([0, 5, 1000, 1, 300], dtype=np.int64)
    seeds = np.arange(len(lengths), dtype=np.uint64) + 7
    got = host.permutations(lengths, seeds)
    starts = np.cumsum(lengths) - lengths
    for start, n in zip(starts, lengths, strict=True):
        assert sorted(got[start : start + n] - start) == list(range(n))
    np.testing.assert_array_equal(host.permutations(lengths[2:3], seeds[2:3]), got[5:1005] - 5)
    assert (got[5:1005] - 5 != np.arange(1000)).mean() > 0.9
    assert host.permutations(lengths[:0], seeds[:0]).tolist() == []


def test_a_file_missing_from_a_joined_chunk_fails_after_the_reads_before_it(tmp_path, monkeypatch):
    """The second file of a chunk is gone by read time: its InputError is raised once the
    reads of the first file have ended, not while they still write into the chunk's buffer
    (on the GPU, kvikio's reads into a device buffer then freed). A slow disk, which cannot be
    made here, stands in as the first file's reads waiting until the error was met."""
    from dask_gpudirect.config import resolve_options
    from dask_gpudirect.errors import InputError
    from dask_gpudirect.formats import binary
    from dask_gpudirect.ledger import Ledger
    from dask_gpudirect.targets import host

    paths = [str(tmp_path / f"{i}.npy") for i in range(2)]
    for path in paths:
        np.save(path, np.arange(1 << 16, dtype="<i8"))
    plan = binary.plan(paths, None, None, 1 << 40, "host")
    (tmp_path / "1.npy").unlink()
    missing, ended = threading.Event(), []
    pread = host._pread_into

    def slow_pread(fd: int, view: memoryview, offset: int) -> int:
        missing.wait(timeout=30)  # the disk answers once the second file was found missing
        try:
            return pread(fd, view, offset)
        finally:
            ended.append(offset)

    monkeypatch.setattr(host, "_pread_into", slow_pread)
    target = host.HostTarget(resolve_options({"threads": 2, "task_size": 1 << 14}), Ledger("w", 10))
    checked = target.checked

    def checked_then_said(shard):
        if shard.path == paths[1]:
            missing.set()
        return checked(shard)

    monkeypatch.setattr(target, "checked", checked_then_said)
    reads = len(range(0, plan.shards[0].nbytes, 1 << 14))
    with pytest.raises(InputError, match=r"1\.npy"):
        try:
            target.read_run(plan.shards)
        finally:
            assert len(ended) == reads  # every read of 0.npy had ended when the error came
    target.close()


def test_a_parquet_shard_is_read_into_a_buffer_of_its_ranges_alone(client, tmp_path):
    """One row group's column of a file of many: the worker's buffer holds its bytes, not the
    file's. A buffer of the file's size for every shard made k shards of a file cost k times
    its size, and a file larger than memory unreadable; the decode still gives its rows."""
    from dask_gpudirect.formats import parquet
    from dask_gpudirect.plugin import current_plugin

    path = tmp_path / "wide.parquet"
    table = pa.table({f"c{i}": np.arange(200_000, dtype="float64") + i for i in range(8)})
    pq.write_table(table, path, row_group_size=25_000)
    shard = parquet.plan([str(path)], None, None, 1, "host").shards[3]  # row group 3
    shard = parquet.projected(shard, ["c5"])

    def read(shard):
        with current_plugin().target("host").used() as target:
            return len(target.read(shard)), target.decode_run([shard])

    nbytes, frame = client.submit(read, shard, pure=False).result()
    assert nbytes == shard.nbytes < path.stat().st_size / 30
    expected = table.slice(75_000, 25_000).select(["c5"]).to_pandas()
    pd.testing.assert_frame_equal(frame, expected)


def test_a_parquet_shard_s_raw_bytes_go_once_decoded(tmp_path, monkeypatch):
    """A run of Parquet files decodes one shard at a time: each shard's raw bytes are let go
    once pyarrow has decoded them, not held through the next shard's read or the conversion
    to pandas (which raised a worker's peak by the raw bytes of a row group).

    pyarrow's decoding threads drop their last views of the pages just after the table is
    handed back (seen in 1 of 3 runs with the GC off), so each check waits for a buffer's
    finalizer: it never comes where this thread holds the buffer while it waits."""
    import threading
    import weakref

    from dask_gpudirect.config import resolve_options
    from dask_gpudirect.formats import parquet
    from dask_gpudirect.ledger import Ledger
    from dask_gpudirect.targets import host

    paths = [str(tmp_path / f"{i}.parquet") for i in range(3)]
    for i, path in enumerate(paths):
        pq.write_table(pa.table({"x": np.arange(10_000) + i, "y": np.ones(10_000)}), path)
    shards = parquet.plan(paths, None, None, 1 << 30, "host").shards
    target = host.HostTarget(resolve_options({"threads": 2}), Ledger("w", 10))
    freed: list[threading.Event] = []
    alive: list[int] = []
    read, to_pandas = target.read, host._to_pandas

    def held() -> int:
        return sum(not event.wait(timeout=10) for event in freed)

    def tracked(shard, *args, **kwargs):
        alive.append(held())
        buffer = read(shard, *args, **kwargs)
        freed.append(threading.Event())
        weakref.finalize(buffer, freed[-1].set)
        return buffer

    def converted(table, *args):
        alive.append(held())
        return to_pandas(table, *args)

    monkeypatch.setattr(target, "read", tracked)
    monkeypatch.setattr(host, "_to_pandas", converted)
    try:
        frame = target.decode_run(shards)
    finally:
        target.close()
    assert alive == [0, 0, 0, 0]
    assert frame["x"].sum() == sum(np.arange(10_000).sum() + 10_000 * i for i in range(3))
