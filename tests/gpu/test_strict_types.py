"""Strict type checks on the device target, kept last: the round trips above compare values.

- the collection's ``meta`` (what Dask plans with) has the dtypes the partitions really have;
- partitions have the dtypes ``cudf.read_parquet`` gives for the same file;
- ``.npy`` files in non-native byte order load (the issue asks for every fixed-size dtype).
"""

from __future__ import annotations

import gpu_helpers as h
import numpy as np
import pytest

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu


def _dtypes(frame) -> dict[str, str]:
    return {name: str(dtype) for name, dtype in frame.dtypes.items()}


def test_meta_dtypes_match_partitions(cuda_tcp, parquet_dir):
    directory, _ = parquet_dir
    ddf = dg.read_parquet(directory, target="device", client=cuda_tcp)
    part = cuda_tcp.compute(ddf.partitions[0]).result()
    assert _dtypes(part) == _dtypes(ddf._meta)


def test_partition_dtypes_match_cudf_read_parquet(cuda_tcp, parquet_dir):
    import cudf

    directory, paths = parquet_dir
    ddf = dg.read_parquet(directory, target="device", client=cuda_tcp)
    part = cuda_tcp.compute(ddf.partitions[0]).result()
    reference = _dtypes(cudf.read_parquet(paths[0]))
    # dictionary columns become categories by design (as pyarrow does); cuDF gives strings
    reference["cat"] = "category"
    assert _dtypes(part) == reference


@pytest.mark.parametrize("dtype", [">i4", ">f8"])
def test_npy_non_native_byte_order(cuda_tcp, tmp_path, dtype):
    expected = h.npy_array((100, 3), dtype, seed=6)
    assert expected.dtype == np.dtype(dtype)
    np.save(tmp_path / "be.npy", expected)
    arr = dg.read_binary(str(tmp_path / "be.npy"), target="device", client=cuda_tcp)
    got = cuda_tcp.compute(arr).result()
    np.testing.assert_array_equal(got.get(), expected)
