"""Binary round trips against NumPy: ``.npy`` (C and Fortran order) and raw record files."""

from __future__ import annotations

import os

import numpy as np
import pytest
from util import compute

import dask_gpudirect as dg

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


def test_npy_zero_records(tcp, tmp_path):
    """A valid ``.npy`` with no records loads as an empty array."""
    path = tmp_path / "zero.npy"
    np.save(path, np.zeros((0, 4), "<i2"))
    x = dg.read_binary(path, client=tcp)
    assert x.shape == (0, 4)
    assert_same_array(compute(tcp, x), np.zeros((0, 4), "<i2"))


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
    """A list, a directory and a glob: chunks follow files, never span two."""
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
