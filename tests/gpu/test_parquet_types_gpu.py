"""Issue 15 on the device target: nested columns and float16, as ``cudf.read_parquet`` reads
them (the files of ``util.write_nested_parquet``, which the host target reads as pyarrow does,
``tests/test_parquet_types.py``). Uses ``test_device_tcp``'s kind of cluster, one of its own."""

from __future__ import annotations

import dask
import gpu_helpers as h
import numpy as np
import pyarrow as pa
import pytest
from util import write_nested_parquet

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu

NESTED = ["id", "map", "list_of_struct", "struct_of_list", "deep"]


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    return write_nested_parquet(tmp_path_factory.mktemp("nested"))


def _on_workers(client, df) -> pa.Table:
    """``df``'s rows as one Arrow table, each partition converted where it lives (see
    ``gpu_helpers.described``: cuDF cannot move these frames between processes)."""
    parts = client.gather(client.compute([dask.delayed(h.described)(p) for p in df.to_delayed()]))
    return pa.concat_tables([table for _, table in parts])


def test_nested_columns_match_cudf(cuda_tcp, nested):
    import cudf

    df = dg.read_parquet(nested, columns=NESTED, target="device", client=cuda_tcp)
    expected = cudf.read_parquet(nested, columns=NESTED)
    h.assert_same_table(_on_workers(cuda_tcp, df), h.cudf_to_arrow(expected))
    # and the frames themselves travel (cudf_compat: structs holding strings serialize)
    gathered = cuda_tcp.compute(df).result().reset_index(drop=True)
    h.assert_same_table(h.cudf_to_arrow(gathered), h.cudf_to_arrow(expected))


def test_nested_columns_through_the_shuffle(cuda_tcp, nested):
    import cudf

    df = dg.read_parquet(nested, columns=NESTED, blocksize=1, target="device", client=cuda_tcp)
    out = dg.shuffle(df, "id", npartitions=4, client=cuda_tcp)
    got = _on_workers(cuda_tcp, out).sort_by("id")
    expected = cudf.read_parquet(nested, columns=NESTED)
    h.assert_same_table(got, h.cudf_to_arrow(expected))


def test_float16_is_float32_values_with_nulls_and_nans_kept(cuda_tcp, nested, tmp_path):
    """libcudf has no float16 and gives its two bytes: dg gives the file's values as float32,
    in meta and in the partitions, nulls and NaN where the file has them; never the bytes."""
    import pyarrow.parquet as pq

    odd = tmp_path / "half.parquet"
    values = [1.5, None, float("nan"), -0.0, 65504.0, 2**-24]
    pq.write_table(pa.table({"half": pa.array(values, pa.float16())}), odd)
    for paths in (nested, [str(odd)]):
        df = dg.read_parquet(paths, columns=["half"], target="device", client=cuda_tcp)
        assert str(df.dtypes["half"]) == "float32"
        got = cuda_tcp.compute(df).result()
        assert str(got["half"].dtype) == "float32"
        expected = pa.concat_arrays(
            [pq.read_table(p)["half"].combine_chunks().cast(pa.float32()) for p in paths]
        )
        column = got["half"].to_arrow()
        assert column.is_null().to_pylist() == expected.is_null().to_pylist()
        np.testing.assert_array_equal(  # NaN where NaN (nulls filled alike)
            column.fill_null(0).to_numpy(), expected.fill_null(0).to_numpy()
        )
