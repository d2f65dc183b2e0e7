"""Issue 15 on the device target: nested columns and float16, as ``cudf.read_parquet`` reads
them (the files of ``util.write_nested_parquet``, which the host target reads as pyarrow does,
``tests/test_parquet_types.py``). Uses ``test_device_tcp``'s kind of cluster, one of its own."""

from __future__ import annotations

import dask
import gpu_helpers as h
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


def test_nested_columns_through_the_shuffle(cuda_tcp, nested):
    import cudf

    df = dg.read_parquet(nested, columns=NESTED, blocksize=1, target="device", client=cuda_tcp)
    out = dg.shuffle(df, "id", npartitions=4, client=cuda_tcp)
    got = _on_workers(cuda_tcp, out).sort_by("id")
    expected = cudf.read_parquet(nested, columns=NESTED)
    h.assert_same_table(got, h.cudf_to_arrow(expected))


def test_float16_is_numbers_or_an_error_naming_file_and_column(cuda_tcp, nested):
    """libcudf has no float16: float32 values equal to the file's, or an InputError that names
    the file and the column; never the raw bytes."""
    import pyarrow.parquet as pq

    df = dg.read_parquet(nested, columns=["id", "half"], target="device", client=cuda_tcp)
    try:
        got = cuda_tcp.compute(df).result()
    except dg.InputError as exc:
        assert exc.path in nested and "half" in str(exc), str(exc)
        return
    assert str(got["half"].dtype) == "float32"
    expected = [float(v) for p in nested for v in pq.read_table(p)["half"].to_pylist()]
    assert got["half"].to_arrow().to_pylist() == expected
