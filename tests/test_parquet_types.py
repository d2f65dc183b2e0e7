"""Every kind of column a Parquet writer makes, read by ``dg.read_parquet`` on the host target
as pyarrow reads it (issue 15): nested types (maps, lists of structs, structs of lists, deeper),
float16, INT96 timestamps; nested columns also through ``dg.shuffle``. Several files each, so
partitions are joined and the frame's types checked against every partition's."""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import compute, write_nested_parquet

import dask_gpudirect as dg


def _plain(value):
    """A cell as plain Python, whichever container pandas put it in."""
    if isinstance(value, np.ndarray | list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and np.isnan(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    return write_nested_parquet(tmp_path_factory.mktemp("nested"))


def _expected(paths, columns=None) -> pd.DataFrame:
    return pa.concat_tables(pq.read_table(p, columns=columns) for p in paths).to_pandas()


def _assert_same(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected)
    for name in expected.columns:
        a = [_plain(v) for v in got[name]]
        b = [_plain(v) for v in expected[name]]
        assert a == b, f"column {name!r} differs"


def test_nested_columns_and_float16_as_pyarrow_reads_them(tcp, nested):
    df = dg.read_parquet(nested, target="host", client=tcp)
    got = compute(tcp, df)
    _assert_same(got.reset_index(drop=True), _expected(nested))
    assert got["half"].dtype == np.float16  # numbers, not bytes
    assert dict(df.dtypes) == dict(got.dtypes)  # meta says what the partitions hold


@pytest.mark.parametrize("column", ["map", "list_of_struct", "struct_of_list", "deep", "half"])
def test_one_nested_column_alone(tcp, nested, column):
    got = compute(tcp, dg.read_parquet(nested, columns=["id", column], target="host", client=tcp))
    _assert_same(got.reset_index(drop=True), _expected(nested, ["id", column]))


def test_nested_columns_through_the_shuffle(tcp, nested):
    df = dg.read_parquet(nested, blocksize=1, target="host", client=tcp)
    assert df.npartitions == 6  # a row group each
    out = dg.shuffle(df, "id", npartitions=4, client=tcp)
    got = compute(tcp, out).sort_values("id").reset_index(drop=True)
    _assert_same(got, _expected(nested))


def test_int96_timestamps_as_pyarrow_reads_them(tcp, tmp_path):
    """Spark's INT96 timestamps, a date past the nanosecond range (2262) included: pyarrow
    reads INT96 as timestamp[ns] by default; dg gives what pyarrow gives, row for row."""
    start = datetime.datetime(2024, 5, 1, 12, 0, 0, 123456)
    when = [start + datetime.timedelta(days=i) for i in range(9)] + [datetime.datetime(2500, 1, 1)]
    times = pa.array(when, pa.timestamp("us"))
    table = pa.table({"id": pa.array(range(10), pa.int64()), "t": times})
    path = str(tmp_path / "int96.parquet")
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)
    got = compute(tcp, dg.read_parquet(path, target="host", client=tcp))
    expected = pq.read_table(path).to_pandas()
    assert got["t"].dtype == expected["t"].dtype
    assert got["t"].astype("int64").tolist() == expected["t"].astype("int64").tolist()
    assert got["t"].tolist()[:9] == [pd.Timestamp(w) for w in when[:9]]
