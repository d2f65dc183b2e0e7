"""Every kind of column a Parquet writer makes, read by ``dg.read_parquet`` on the host target
as pyarrow reads it (issue 15): nested types (maps, lists of structs, structs of lists, deeper),
float16, INT96 timestamps; nested columns also through ``dg.shuffle``. Several files each, so
partitions are joined and the frame's types checked against every partition's."""

from __future__ import annotations

import datetime
import decimal

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import EVOLVED_TYPES, compute, write_evolved_parquet, write_nested_parquet

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


def test_a_value_pandas_cannot_hold_is_an_error_naming_the_file(tcp, tmp_path):
    """A time64[ns] with nanoseconds, which pandas' ``datetime.time`` cannot hold (pyarrow's
    conversion refuses it, and Dask's read fails so, naming no file), is an InputError naming
    the file, from the read and from a shuffle of it (it was pyarrow's ArrowInvalid alone);
    ``dtype_backend="pyarrow"`` reads it."""
    times = pa.array([0, 7000, 7], pa.time64("ns"))  # whole microseconds in a.parquet
    pq.write_table(pa.table({"id": [0, 1], "t": times.slice(0, 2)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3], "t": times.slice(2)}), tmp_path / "b.parquet")
    df = dg.read_parquet(tmp_path, blocksize=1, target="host", client=tcp)
    with pytest.raises(dg.InputError, match=r"b\.parquet.*non-zero nanoseconds"):
        compute(tcp, df)
    with pytest.raises(dg.InputError, match=r"b\.parquet.*non-zero nanoseconds"):
        dg.shuffle(df, "id", npartitions=2, client=tcp)
    kept = dg.read_parquet(tmp_path, dtype_backend="pyarrow", target="host", client=tcp)
    assert compute(tcp, kept)["t"].tolist() == times.to_pylist()


@pytest.mark.parametrize(
    ("first", "second", "read_as"),
    [e[1:] for e in EVOLVED_TYPES],
    ids=[e[0] for e in EVOLVED_TYPES],
)
def test_files_storing_a_column_in_other_types_read_as_one(tcp, tmp_path, first, second, read_as):
    """Files that store a column in types pyarrow unifies read as one type, in every partition
    and in meta (Dask types meta by the first file and leaves each partition its file's type):
    each file's values cast to it, safely, before filters test them. Whole files in one
    partition, row groups in many, a selection and a filter on the column give the same."""
    data, one = write_evolved_parquet(tmp_path, first, second, read_as)
    expected = dd.read_parquet(one).compute().reset_index(drop=True)  # Dask's, of one file
    for blocksize in ("1GiB", 1):
        df = dg.read_parquet(data, blocksize=blocksize, target="host", client=tcp)
        assert df.v.dtype == expected.v.dtype
        parts = tcp.gather(tcp.compute(df.to_delayed()))
        assert all(p.v.dtype == expected.v.dtype for p in parts)
        _assert_same(pd.concat(parts, ignore_index=True), expected)
    _assert_same(
        compute(tcp, dg.read_parquet(data, client=tcp, target="host").v.to_frame()),
        expected[["v"]],
    )
    if not pa.types.is_null(first):
        lowest = expected.v.dropna().sort_values().iloc[20]
        filtered = dg.read_parquet(data, filters=[("v", "<=", lowest)], target="host", client=tcp)
        _assert_same(
            compute(tcp, filtered).reset_index(drop=True),
            expected[expected.v <= lowest].reset_index(drop=True),
        )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (pa.uint64(), pa.int64()),  # int64 holds no uint64 past 2**63
        (pa.list_(pa.int32()), pa.list_(pa.int64())),
        (pa.timestamp("us", "UTC"), pa.timestamp("us")),
        (pa.int64(), pa.string()),
        (pa.int64(), pa.decimal128(5, 1)),  # unified as decimal128(19, 1): too narrow
        (pa.decimal128(20, 0), pa.float64()),  # unified as double: 2**53 + 1 rounds
        (pa.string(), pa.binary()),  # unified as binary: the strings come back as bytes
    ],
    ids=[
        "uint64-and-int64",
        "nested",
        "time-zones",
        "int-and-string",
        "int-and-decimal",
        "decimal-and-float",
        "string-and-binary",
    ],
)
def test_files_of_types_that_read_as_no_one_type_are_refused(tcp, tmp_path, first, second):
    """Other pairs are still refused at planning, naming the file and both types."""
    for i, kind in enumerate([first, second]):
        if pa.types.is_list(kind):
            values = [[1]] * 3
        elif kind in (pa.string(), pa.binary()):
            values = ["a"] * 3
        else:
            values = [1] * 3 if not pa.types.is_decimal(kind) else [decimal.Decimal(1)] * 3
        pq.write_table(pa.table({"v": pa.array(values, kind)}), tmp_path / f"part.{i}.parquet")
    with pytest.raises(dg.InputError, match=r"part\.1\.parquet.*schema differs .*\(v: "):
        dg.read_parquet(tmp_path, target="host", client=tcp)


def test_pandas_nullable_ints_of_two_widths_read_as_the_wider(tcp, tmp_path):
    """pandas stores its dtype (``Int32``, ``Int64``) in each file, and pyarrow gives a column
    the stored one: a file's ``Int32`` cast to int64 is ``Int64`` here, in meta and every
    partition, whichever file comes first; a stored index too."""
    small = pd.DataFrame({"k": pd.array([1, 2], "Int32"), "v": pd.array([1, None], "Int32")})
    large = pd.DataFrame({"k": pd.array([3, 4], "Int64"), "v": pd.array([2**40, 5], "Int64")})
    for order, frames in (("narrow-first", [small, large]), ("wide-first", [large, small])):
        folder = tmp_path / order
        folder.mkdir()
        for i, frame in enumerate(frames):
            frame.set_index("k").to_parquet(folder / f"part.{i}.parquet")
        df = dg.read_parquet(folder, blocksize=1, target="host", client=tcp)
        assert df.v.dtype == df.index.dtype == pd.Int64Dtype()
        parts = tcp.gather(tcp.compute(df.to_delayed()))
        assert all(p.v.dtype == p.index.dtype == pd.Int64Dtype() for p in parts)
        got = pd.concat(parts).sort_index()
        assert got.v.tolist() == [1, pd.NA, 2**40, 5] and got.index.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("first", "second", "dtype"),
    [
        (pd.array([1, None], "Int64"), np.array([3, 4], "int64"), pd.Int64Dtype()),
        (pd.array([True, None], "boolean"), pd.Series([None, None], dtype=object), "boolean"),
        (pd.array([1.5, None], "Float32"), np.array([2.5, 3.5]), pd.Float64Dtype()),
    ],
    ids=["Int64-and-int64", "boolean-and-None", "Float32-and-float64"],
)
def test_files_pandas_stored_other_dtypes_for_read_as_the_first(
    tcp, tmp_path, first, second, dtype
):
    """pandas stores each file's dtypes, and pyarrow gives a column the stored one: files whose
    columns pandas stored as other dtypes (``Int64`` and ``int64``: one Arrow type) convert by
    the first file's, as meta does, so every partition has ``df.dtypes``; also where a filter
    rules out the first file."""
    for i, values in enumerate([first, second]):
        frame = pd.DataFrame({"k": [2 * i, 2 * i + 1], "v": values})
        frame.to_parquet(tmp_path / f"part.{i}.parquet")
    for filters in (None, [("k", ">", 1)]):
        df = dg.read_parquet(tmp_path, filters=filters, blocksize=1, target="host", client=tcp)
        assert df.v.dtype == dtype
        parts = tcp.gather(tcp.compute(df.to_delayed()))
        assert all(p.v.dtype == dtype for p in parts), [p.v.dtype for p in parts]
