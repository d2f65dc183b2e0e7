"""Binary round trips against NumPy: ``.npy`` (C and Fortran order) and raw record files."""

from __future__ import annotations

import os
import resource
from collections import Counter

import numpy as np
import pytest
from distributed import Client
from util import clear_ledgers, compute, shards_of, start_cluster

import dask_gpudirect as dg
from dask_gpudirect import collections as dg_collections
from dask_gpudirect import ledger_report
from dask_gpudirect.placement import _shards_of

STRUCT = np.dtype([("id", "<i4"), ("pos", "<f8", (3,)), ("tag", "S2"), ("ok", "?")])

DTYPES = [
    "i1",
    "<u2",
    "<i4",
    "<i8",
    "<f2",
    "<f4",
    "<f8",
    "<c8",
    "<c16",
    "?",
    "<M8[ns]",
    "<m8[s]",
    "S3",
    "<U5",
    ">i4",
    ">f8",
    ">c16",
    STRUCT,
]


def sample(dtype, shape, seed=0) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` with varied, dtype-appropriate values."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype.fields:
        out = np.zeros(n, dtype)
        out["id"] = np.arange(n)
        out["pos"] = rng.random((n, 3))
        out["tag"] = [f"{i % 100:02d}".encode() for i in range(n)]
        out["ok"] = np.arange(n) % 3 == 0
        return out.reshape(shape)
    if dtype.kind in "SU":
        return np.array([str(i * 7)[: dtype.itemsize] for i in range(n)], dtype).reshape(shape)
    if dtype.kind == "b":
        return (rng.random(n) > 0.5).reshape(shape)
    if dtype.kind in "Mm":
        return (np.arange(n) * 3).astype(dtype).reshape(shape)
    if dtype.kind == "c":
        return (rng.random(n) + 1j * rng.random(n)).astype(dtype).reshape(shape)
    if dtype.kind == "f":
        return (rng.random(n) * 100).astype(dtype).reshape(shape)
    return (np.arange(n) % 120).astype(dtype).reshape(shape)


def assert_same_array(got: np.ndarray, expected: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def chunk_shapes(client, x) -> list[tuple[int, ...]]:
    """Shapes of the chunks the workers actually made, in order along axis 0."""
    blocks = client.gather(client.compute(list(x.to_delayed().ravel())))
    return [b.shape for b in blocks]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_npy_dtypes(client, tmp_path, dtype):
    expected = sample(dtype, (257, 3))
    path = tmp_path / "a.npy"
    np.save(path, expected)
    x = dg.read_binary(path, client=client, blocksize=1000)
    assert x.dtype == expected.dtype
    assert x.shape == expected.shape
    assert_same_array(compute(client, x), expected)


@pytest.mark.parametrize("shape", [(100,), (40, 7), (30, 4, 5)], ids=str)
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_order_and_records(client, tmp_path, shape, order):
    """Multi-dimensional records in C and Fortran order; Fortran files are one chunk."""
    expected = np.asarray(sample("<f8", shape), order=order)
    assert expected.flags.f_contiguous == (order == "F" or len(shape) == 1)
    path = tmp_path / "o.npy"
    np.save(path, expected)
    x = dg.read_binary(path, client=client, blocksize=64 * 8)
    got = compute(client, x)
    assert_same_array(got, expected)
    if order == "F" and len(shape) > 1:
        assert x.numblocks[0] == 1
    else:
        assert x.numblocks[0] == -(-shape[0] // max(1, 64 // int(np.prod(shape[1:]))))
    assert chunk_shapes(client, x) == [(n, *shape[1:]) for n in x.chunks[0]]


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_header_versions(tcp, tmp_path, version):
    expected = sample(STRUCT, (50,))
    if version == (3, 0):  # the version for utf-8 field names
        expected = expected.astype(
            [("idé", "<i4"), ("pos", "<f8", (3,)), ("tag", "S2"), ("ok", "?")]
        )
    path = tmp_path / "v.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, expected, version=version)
    assert_same_array(compute(tcp, dg.read_binary(path, client=tcp)), expected)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_of_a_header_over_numpy_s_default_limit(tcp, tmp_path, version):
    """A structured dtype of 600 fields has a header of about 14 KB, which np.save writes and
    np.load reads with max_header_size=; it was refused as a bad header."""
    expected = np.arange(5 * 600, dtype="<f4").view([(f"f{i}", "<f4") for i in range(600)])
    path = tmp_path / "wide.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, expected, version=version)
    assert_same_array(compute(tcp, dg.read_binary(path, client=tcp)), expected)


def test_npy_zero_records(tcp, tmp_path):
    """A valid ``.npy`` with no records loads as an empty array."""
    path = tmp_path / "zero.npy"
    np.save(path, np.zeros((0, 4), "<i2"))
    x = dg.read_binary(path, client=tcp)
    assert x.shape == (0, 4)
    assert_same_array(compute(tcp, x), np.zeros((0, 4), "<i2"))


@pytest.mark.parametrize("shape", [(0, 2), (5, 0)], ids=["no records", "records of no bytes"])
def test_npy_files_of_no_bytes(tcp, tmp_path, shape):
    """More such files than workers, however they are cut into chunks, load as NumPy
    concatenates them (there are no bytes to share out)."""
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.zeros(shape, "<f8"))
    expected = np.zeros((3 * shape[0], shape[1]), "<f8")
    for options in [{}, {"blocksize": "1MiB"}, {"join_files": False}]:
        x = dg.read_binary(tmp_path, client=tcp, **options)
        assert_same_array(compute(tcp, x), expected)


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("<f4", None), ("<i8", 3), (">u2", (2, 5)), ("<c8", ()), (STRUCT, (2,))],
    ids=str,
)
def test_raw_round_trip(client, tmp_path, dtype, shape):
    record = () if shape is None else ((shape,) if isinstance(shape, int) else shape)
    expected = sample(dtype, (123, *record))
    path = tmp_path / "records.bin"
    expected.tofile(path)
    x = dg.read_binary(path, dtype=dtype, shape=shape, client=client, blocksize=200)
    assert x.shape == expected.shape
    assert_same_array(compute(client, x), expected)


@pytest.mark.parametrize("shape", [None, 2], ids=str)
def test_a_subarray_dtype_adds_its_shape_to_each_record_as_numpy(tcp, tmp_path, shape):
    """``dtype=("<f4", (3, 4))``: records of 3 x 4 float32 (after ``shape``'s axes), as
    ``np.fromfile`` gives them; not float32 records of 48 bytes."""
    dtype = np.dtype(("<f4", (3, 4)))
    path = tmp_path / "records.bin"
    np.arange(30 * 24, dtype="<f4").tofile(path)
    expected = np.fromfile(path, np.dtype(("<f4", (*((shape,) if shape else ()), 3, 4))))
    x = dg.read_binary(path, dtype=dtype, shape=shape, client=tcp, blocksize=500)
    assert (x.shape, x.dtype) == (expected.shape, np.dtype("<f4"))
    assert_same_array(compute(tcp, x), expected)


def test_blocksize_splits_into_records(client, tmp_path):
    """Chunks are runs of whole records of about ``blocksize`` bytes, reported exactly."""
    expected = np.arange(1000 * 4, dtype="<i8").reshape(1000, 4)  # 32-byte records
    path = tmp_path / "r.raw"
    expected.tofile(path)

    x = dg.read_binary(path, dtype="<i8", shape=(4,), blocksize=3200, client=client)
    assert x.chunks == ((100,) * 10, (4,))

    x = dg.read_binary(path, dtype="<i8", shape=(4,), blocksize=3300, client=client)
    assert x.chunks == ((103,) * 9 + (73,), (4,))  # 3300 // 32 = 103 records per chunk
    assert chunk_shapes(client, x) == [(n, 4) for n in x.chunks[0]]
    assert_same_array(compute(client, x), expected)

    x = dg.read_binary(path, dtype="<i8", shape=(4,), blocksize=1, client=client)
    assert x.chunks[0] == (1,) * 1000  # never less than one record
    x = dg.read_binary(path, dtype="<i8", shape=(4,), blocksize="1GiB", client=client)
    assert x.chunks[0] == (1000,)
    assert_same_array(compute(client, x[500:510]), expected[500:510])


def test_several_files(client, tmp_path):
    """A list, a directory and a glob: files larger than ``blocksize`` cut into chunks of whole
    records, in file order."""
    parts = [sample("<f4", (n, 2), seed=n) for n in (10, 25, 7)]
    root = tmp_path / "arrays"
    root.mkdir()
    for k, part in enumerate(parts):
        np.save(root / f"p{k}.npy", part)
    expected = np.concatenate(parts)
    files = [os.fspath(root / f"p{k}.npy") for k in range(3)]
    for paths in (files, root, os.path.join(root, "p*.npy")):
        x = dg.read_binary(paths, client=client, blocksize=80)  # 10 records a chunk
        assert x.chunks[0] == (10, 10, 10, 5, 7)
        assert chunk_shapes(client, x) == [(n, 2) for n in x.chunks[0]]
        assert_same_array(compute(client, x), expected)
    reversed_ = dg.read_binary(files[::-1], client=client)
    assert_same_array(compute(client, reversed_), np.concatenate(parts[::-1]))
    # a file two entries name is read twice, as Dask reads it: none silently dropped
    twice = dg.read_binary([os.path.join(root, "p*.npy"), files[1]], client=client)
    assert_same_array(compute(client, twice), np.concatenate([*parts, parts[1]]))


def test_numbered_files_in_number_order(tcp, tmp_path):
    """``shard-2.npy`` before ``shard-10.npy``: a folder's or a glob's files in the natural
    order of their names, as Dask orders a dataset's."""
    parts = [np.full((3, 2), k, dtype="<i8") for k in range(12)]
    for k, part in enumerate(parts):
        np.save(tmp_path / f"shard-{k}.npy", part)
    for paths in (tmp_path, os.path.join(tmp_path, "shard-*.npy")):
        got = compute(tcp, dg.read_binary(paths, client=tcp))
        assert_same_array(got, np.concatenate(parts))


def small_files(root, counts=(50, 20, 30, 40, 10, 50)) -> tuple[list[str], list[np.ndarray]]:
    """``.npy`` files of 24-byte records, as many records in each as ``counts`` says."""
    root.mkdir(exist_ok=True)
    parts = [sample("<i8", (n, 3), seed=k) for k, n in enumerate(counts)]
    paths = [os.fspath(root / f"s{k}.npy") for k in range(len(parts))]
    for path, part in zip(paths, parts, strict=True):
        np.save(path, part)
    return paths, parts


def files_of_chunks(x) -> list[list[str]]:
    """The files each chunk's task reads, in order along axis 0."""
    graph = dict(x.__dask_graph__())
    return [[s.path for s in _shards_of(graph[key])] for key in sorted(graph, key=lambda k: k[1])]


def test_small_files_are_joined_into_chunks(client, tmp_path):
    """Small files are read as chunks of about ``blocksize`` (one task and one buffer each,
    every file of it in flight at once), their records in file order, and never fewer chunks
    than workers."""
    paths, parts = small_files(tmp_path / "small")  # 200 records, 4800 bytes
    expected = np.concatenate(parts)
    for blocksize, chunks, files in [
        (2400, (100, 100), [paths[:3], paths[3:]]),
        (1200, (50, 50, 50, 50), [paths[:1], paths[1:3], paths[3:5], paths[5:]]),
        ("256MiB", (100, 100), [paths[:3], paths[3:]]),  # one chunk a worker
    ]:
        x = dg.read_binary(paths, client=client, blocksize=blocksize)
        assert x.chunks == (chunks, (3,))
        assert files_of_chunks(x) == files
        assert chunk_shapes(client, x) == [(n, 3) for n in chunks]
        assert_same_array(compute(client, x), expected)
        assert_same_array(compute(client, x[45:155]), expected[45:155])


def test_auto_blocksize_gives_each_worker_as_many_chunks(tcp, tmp_path, monkeypatch):
    """Seven chunks' worth of equal files on two workers: "auto" joins them into six chunks of
    two files, three a worker, where seven would leave one worker reading four while the other
    waits. (The host's auto size is set to a seventh of these files.)"""
    paths = [str(tmp_path / f"{k:02d}.npy") for k in range(12)]
    for k, path in enumerate(paths):
        np.save(path, np.arange(100) + 100 * k)
    total = sum(os.path.getsize(path) - 128 for path in paths)  # the records, not the headers
    monkeypatch.setattr(dg_collections, "AUTO_HOST", total // 7 + 1)
    x = dg.read_binary(paths, client=tcp)
    assert x.chunks == ((200,) * 6,)
    assert files_of_chunks(x) == [paths[k : k + 2] for k in range(0, 12, 2)]
    assert sorted(Counter(s.worker for s in shards_of(x).values()).values()) == [3, 3]
    assert_same_array(compute(tcp, x), np.arange(1200))


def test_each_file_of_a_joined_chunk_is_in_the_ledger(tcp, tmp_path):
    paths, parts = small_files(tmp_path / "small")
    x = dg.read_binary(paths, client=tcp, blocksize=2400)
    clear_ledgers(tcp)
    compute(tcp, x)
    records = ledger_report.records(tcp)
    assert sorted(records["file"]) == sorted(paths)
    assert set(records["path"]) == {"posix-host"}
    assert records["bytes"].sum() == sum(part.nbytes for part in parts)


def test_fortran_files_are_never_joined(tcp, tmp_path):
    """A Fortran-order file's records are not contiguous: it stays a chunk of its own, its
    C-order neighbours joined only around it."""
    parts = [sample("<f8", (10, 3), seed=k) for k in range(4)]
    parts[1] = np.asfortranarray(parts[1])
    paths = []
    for k, part in enumerate(parts):
        paths.append(os.fspath(tmp_path / f"m{k}.npy"))
        np.save(paths[-1], part)
    x = dg.read_binary(paths, client=tcp, blocksize=720)  # 30 records a chunk
    assert files_of_chunks(x) == [paths[:1], paths[1:2], paths[2:]]
    assert_same_array(compute(tcp, x), np.concatenate(parts))


def test_a_file_truncated_in_a_joined_chunk_is_named(tcp, tmp_path):
    """The error names the file at fault, not its chunk's first; the other chunk still reads."""
    paths, parts = small_files(tmp_path / "small")
    x = dg.read_binary(paths, client=tcp, blocksize=2400)
    with open(paths[4], "r+b") as f:
        f.truncate(os.path.getsize(paths[4]) - 24)
    with pytest.raises(dg.InputError, match=f"^{paths[4]}: .*changed since it was planned"):
        compute(tcp, x)
    assert_same_array(compute(tcp, x.blocks[0]), np.concatenate(parts[:3]))


def test_a_chunk_of_many_files_keeps_few_open(tmp_path):
    """A chunk may join thousands of small files; the worker keeps only so many open at once
    (``FILES_AT_ONCE``): here its descriptor limit allows 100 more than it holds, and one chunk
    joins 300 files."""
    paths, parts = small_files(tmp_path / "many", counts=(3,) * 300)
    with start_cluster("tcp", n_workers=1, threads=1) as cluster, Client(cluster) as client:
        x = dg.read_binary(paths, client=client)
        assert files_of_chunks(x) == [paths]
        client.run(_allow_descriptors, 100)
        assert_same_array(client.compute(x).result(), np.concatenate(parts))


def _allow_descriptors(more: int) -> None:
    """Lower this process's descriptor limit to ``more`` past the highest one open."""
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + more, hard))


def test_npy_dtype_and_shape_may_be_given(tcp, tmp_path):
    """Matching ``dtype``/``shape`` for a ``.npy`` are accepted (and checked)."""
    expected = sample("<i4", (20, 3))
    path = tmp_path / "m.npy"
    np.save(path, expected)
    x = dg.read_binary(path, dtype="<i4", shape=(3,), client=tcp)
    assert_same_array(compute(tcp, x), expected)
    with pytest.raises(dg.InputError, match="m.npy"):
        dg.read_binary(path, dtype="<f4", client=tcp)
    with pytest.raises(dg.InputError, match="m.npy"):
        dg.read_binary(path, shape=(4,), client=tcp)


def test_npy_recognised_by_magic_not_name(tcp, tmp_path):
    """A ``.npy`` file under another name is still read by its header."""
    expected = sample("<i2", (30, 2))
    path = tmp_path / "array.dat"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, expected)
    assert_same_array(compute(tcp, dg.read_binary(path, client=tcp)), expected)


def test_dtype_given_reads_a_file_of_another_name_raw(tcp, tmp_path):
    """With ``dtype=``, a file not named ``.npy`` is raw records, as ``np.fromfile`` reads it,
    even where its bytes start as a ``.npy`` header does (it failed as a bad header)."""
    records = np.zeros((8, 16), dtype="u1")
    records[0, :8] = np.frombuffer(b"\x93NUMPY\x01\x00", "u1")
    path = tmp_path / "records.bin"
    records.tofile(path)
    got = compute(tcp, dg.read_binary(path, dtype="u1", shape=16, client=tcp))
    assert_same_array(got, records)


def test_a_name_with_brackets_is_that_file(tcp, tmp_path):
    """``a[1].npy`` that exists is that file, not a pattern matching ``a1.npy`` (as ``np.load``
    reads it); a folder so named is that folder; a pattern that names no file is still one."""
    np.save(tmp_path / "a[1].npy", np.arange(3))
    np.save(tmp_path / "a1.npy", np.arange(10, 13))
    assert_same_array(compute(tcp, dg.read_binary(tmp_path / "a[1].npy", client=tcp)), np.arange(3))
    folder = tmp_path / "run[2]"
    folder.mkdir()
    np.save(folder / "0.npy", np.arange(5))
    assert_same_array(compute(tcp, dg.read_binary(folder, client=tcp)), np.arange(5))
    globbed = compute(tcp, dg.read_binary(tmp_path / "a[0-9].npy", client=tcp))
    assert_same_array(globbed, np.arange(10, 13))


def test_a_shape_of_numpy_integers(tcp, tmp_path):
    """``shape=np.int64(3)``, as NumPy's ``reshape`` takes it."""
    path = tmp_path / "r.raw"
    path.write_bytes(np.arange(12, dtype="<i4").tobytes())
    x = dg.read_binary(path, dtype="<i4", shape=np.int64(3), client=tcp)
    assert_same_array(compute(tcp, x), np.arange(12, dtype="<i4").reshape(4, 3))
