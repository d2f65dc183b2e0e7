"""``target``: None picks host on this GPU-less cluster; "device" is a clear error."""

from __future__ import annotations

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
