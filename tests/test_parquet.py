"""Parquet round trips against pyarrow, over tcp and ucxx, on files the tests write."""

from __future__ import annotations

import datetime
import decimal
import operator
import os
from collections import Counter

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pandas.testing import assert_frame_equal, assert_series_equal
from util import (
    assert_same_frame,
    clear_ledgers,
    compute,
    expected_parquet,
    partitions,
    shards_of,
)

import dask_gpudirect as dg
from dask_gpudirect import collections as dg_collections
from dask_gpudirect import ledger_report

N = 600


def rich_table(n: int = N, start: int = 0) -> pa.Table:
    """Every kind of column the loader must round-trip, with nulls in most."""
    idx = np.arange(start, start + n)
    ids = idx.tolist()

    def nulls(values, every=7):
        return [None if i % every == 3 else v for i, v in enumerate(values)]

    base = datetime.datetime(2024, 3, 30, 23, 0)
    return pa.table(
        {
            "id": pa.array(idx, pa.int64()),
            "i8": pa.array(nulls((idx % 100 - 50).tolist()), pa.int8()),
            "u32": pa.array((idx * 7 % 1000).tolist(), pa.uint32()),
            "f32": pa.array(nulls((idx / 3).tolist()), pa.float32()),
            "f64": pa.array([float("nan") if i % 11 == 0 else i * 0.5 for i in ids]),
            "flag": pa.array(nulls([bool(i % 2) for i in ids], 5), pa.bool_()),
            "text": pa.array(nulls([f"row-{i}-{'é' * (i % 4)}" for i in ids])),
            "large": pa.array([str(i) * (i % 5) for i in ids], pa.large_string()),
            "blob": pa.array(nulls([bytes([i % 256]) * (i % 3) for i in ids]), pa.binary()),
            "price": pa.array(nulls([decimal.Decimal(i) / 100 for i in ids]), pa.decimal128(12, 2)),
            "day": pa.array(
                [datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in ids],
                pa.date32(),
            ),
            "ts": pa.array(
                nulls([base + datetime.timedelta(minutes=i) for i in ids]),
                pa.timestamp("us"),
            ),
            "ts_tz": pa.array(
                [base + datetime.timedelta(hours=i) for i in ids],
                pa.timestamp("ns", tz="Europe/Berlin"),
            ),
            "ts_utc": pa.array(
                nulls([base + datetime.timedelta(seconds=i) for i in ids]),
                pa.timestamp("ms", tz="UTC"),
            ),
            "ints": pa.array(nulls([list(range(i % 4)) for i in ids], 9), pa.list_(pa.int64())),
            "words": pa.array([[f"w{i}", None] if i % 2 else [] for i in ids]),
            "color": pa.array(
                nulls([["red", "green", "blue"][i % 3] for i in ids])
            ).dictionary_encode(),
            "point": pa.array([{"x": i, "y": i / 2} for i in ids]),
        }
    )


def write(path, table: pa.Table, **kwargs) -> str:
    pq.write_table(table, path, **kwargs)
    return os.fspath(path)


def read(client, paths, **kwargs):
    return compute(client, dg.read_parquet(paths, client=client, **kwargs))


@pytest.mark.parametrize("compression", ["snappy", "zstd", "none"])
@pytest.mark.parametrize("row_group_size", [N, 64])
def test_round_trip_types(client, tmp_path, compression, row_group_size):
    path = write(
        tmp_path / "rich.parquet",
        rich_table(),
        compression=compression,
        row_group_size=row_group_size,
    )
    assert pq.ParquetFile(path).metadata.num_row_groups == -(-N // row_group_size)
    df = dg.read_parquet(path, client=client, blocksize="16KiB")
    assert list(df.columns) == rich_table().column_names
    got = compute(client, df)
    assert_same_frame(got, expected_parquet(path))
    assert got["ts_tz"].dt.tz is not None
    assert str(got["ts_tz"].dt.tz) == "Europe/Berlin"
    assert isinstance(got["color"].dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("use_dictionary", [True, False])
def test_dictionary_page_encoding(client, tmp_path, use_dictionary):
    """Columns stored with and without Parquet dictionary pages (low-cardinality strings)."""
    table = pa.table(
        {
            "k": np.arange(5000),
            "city": [["Oslo", "Lima", "Pune", None][i % 4] for i in range(5000)],
            "n": np.arange(5000) % 3,
        }
    )
    path = write(
        tmp_path / "dict.parquet", table, use_dictionary=use_dictionary, row_group_size=1000
    )
    encodings = pq.ParquetFile(path).metadata.row_group(0).column(1).encodings
    assert ("RLE_DICTIONARY" in encodings) == use_dictionary
    got = read(client, path, blocksize=1)
    assert_same_frame(got, expected_parquet(path))


def test_pandas_index_is_not_a_column(client, tmp_path):
    """A stored pandas index is dropped: every partition gets a fresh RangeIndex."""
    frame = pd.DataFrame({"x": np.arange(20), "y": np.arange(20) * 2.0})
    frame.index = pd.Index([f"r{i}" for i in range(20)], name="label")
    path = tmp_path / "indexed.parquet"
    frame.to_parquet(path)
    df = dg.read_parquet(path, client=client)
    assert list(df.columns) == ["x", "y"]
    got = compute(client, df)
    assert_same_frame(got, frame.reset_index(drop=True))


def test_column_names_with_dots(client, tmp_path):
    """A column named ``a.b`` is one top-level column, not a nested field of ``a``."""
    rng = np.random.default_rng(1)
    n = 30_000  # column chunks far larger than the gap below which reads are merged
    table = pa.table(
        {
            "a": rng.random(n),
            "a.b": rng.random(n),
            "c.d.e": pa.array([f"z{i}" for i in range(n)]),
            "s": pa.array([{"x": i, "y.z": float(i)} for i in range(n)]),
        }
    )
    path = write(tmp_path / "dots.parquet", table, row_group_size=10_000, compression="none")
    assert_same_frame(read(client, path), expected_parquet(path))
    for columns in (["a.b"], ["c.d.e", "a"], ["s"]):
        got = read(client, path, columns=columns, blocksize=1)
        assert_same_frame(got, expected_parquet(path, columns=columns))


def test_empty_row_groups(client, tmp_path):
    """Row groups with no rows, between and after full ones, load as nothing."""
    table = rich_table(100)
    path = tmp_path / "holes.parquet"
    with pq.ParquetWriter(path, table.schema) as writer:
        writer.write_table(table.slice(0, 50))
        writer.write_table(table.slice(0, 0))
        writer.write_table(table.slice(50))
        writer.write_table(table.slice(0, 0))
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [50, 0, 50, 0]
    df = dg.read_parquet(path, client=client, blocksize=1)
    assert df.npartitions == 2
    assert_same_frame(compute(client, df), expected_parquet(path))


def test_only_empty_row_groups(client, tmp_path):
    """A file whose row groups are all empty gives an empty frame with the schema."""
    table = rich_table(10)
    path = tmp_path / "empty-rows.parquet"
    with pq.ParquetWriter(path, table.schema) as writer:
        writer.write_table(table.slice(0, 0))
    got = read(client, path)
    assert len(got) == 0
    assert list(got.columns) == table.column_names


def test_columns_projection(client, tmp_path):
    path = write(tmp_path / "p.parquet", rich_table(), row_group_size=100)
    columns = ["price", "text", "ints"]
    df = dg.read_parquet(path, columns=columns, client=client)
    assert list(df.columns) == columns
    assert_same_frame(compute(client, df), expected_parquet(path, columns=columns))
    # a single name works like a one-element list
    assert list(dg.read_parquet(path, columns="id", client=client).columns) == ["id"]


def test_projection_reads_fewer_bytes(tcp, tmp_path):
    """Only the projected column chunks are read: the ledger shows fewer bytes."""
    rng = np.random.default_rng(0)
    table = pa.table({f"c{k}": rng.random(100_000) for k in range(8)})
    path = write(tmp_path / "wide.parquet", table, row_group_size=25_000, compression="none")

    def bytes_read(**kwargs):
        clear_ledgers(tcp)
        read(tcp, path, **kwargs)
        return int(ledger_report.records(tcp)["bytes"].sum())

    everything = bytes_read()
    one = bytes_read(columns=["c3"])
    assert 0 < one < everything / 4


FILTERS = [
    pytest.param([("id", ">=", 450)], id="one-term"),
    pytest.param([("id", ">", 100), ("id", "<=", 140), ("flag", "==", True)], id="and"),
    pytest.param([[("id", "<", 30)], [("id", ">", 570), ("i8", "!=", 25)]], id="or-of-ands"),
    pytest.param([("color", "in", ["red", "blue"])], id="in"),
    pytest.param([("text", "not in", ["row-1-é", "row-2-éé"]), ("id", "<", 50)], id="not-in"),
    pytest.param([("color", "not in", ["red"]), ("id", "<", 100)], id="not-in-keeps-nulls"),
    pytest.param([("text", "in", ["row-5-éé", None]), ("id", "<", 100)], id="in-none"),
    pytest.param([("text", "not in", ["row-5-éé", None]), ("id", "<", 100)], id="not-in-none"),
    pytest.param([("ts_utc", ">", pd.Timestamp("2024-03-30 23:05", tz="UTC"))], id="tz"),
    pytest.param([("price", ">=", decimal.Decimal("5.50"))], id="decimal"),
    pytest.param([("f32", "<", 10.0)], id="nulls-never-match"),
    pytest.param([("i8", "!=", 25), ("id", "<", 100)], id="not-equal-keeps-nulls"),
    pytest.param([("f64", "!=", 0.5), ("id", "<", 100)], id="not-equal-keeps-nan"),
]


@pytest.mark.parametrize("filters", FILTERS)
def test_filters_match_dask(client, tmp_path, filters):
    path = write(tmp_path / "f.parquet", rich_table(), row_group_size=50)
    got = read(client, path, filters=filters, columns=["id", "text", "price", "ts_utc"])
    expected = expected_parquet(path, filters=filters, columns=["id", "text", "price", "ts_utc"])
    assert len(expected) > 0
    assert_same_frame(got, expected, by="id")


NULL_FILTERS = [
    pytest.param([("text", "is", None)], id="is-none"),
    pytest.param([("f32", "is", None)], id="is-none-float"),
    pytest.param([("f32", "is not", None)], id="is-not-none"),
    pytest.param([("f64", "is", None)], id="is-none-keeps-nan"),
    pytest.param([("f64", "is not", np.nan)], id="is-not-nan"),
    pytest.param([[("text", "is", None)], [("id", "<", 5)]], id="or"),
]


@pytest.mark.parametrize(
    "filters",
    [
        pytest.param([("v", "!=", 3)], id="not-equal"),
        pytest.param([("v", "not in", [3, 4])], id="not-in"),
        pytest.param([("v", "not in", [3, None])], id="not-in-none"),
        pytest.param([[("v", "!=", 3), ("id", ">=", 5)], [("id", "<", 2)]], id="or"),
    ],
)
def test_filters_keep_the_rows_dask_keeps(client, tmp_path, filters):
    """``!=`` and ``not in`` keep a null as ``dd.read_parquet`` does, even in a row group whose
    statistics say every value is the one ruled out (its nulls keep it from being pruned)."""
    v = [None, 3, 3, None, 3] + [None if i % 4 == 0 else i % 6 for i in range(15)]
    table = pa.table({"id": np.arange(20), "v": pa.array(v, pa.int64())})
    path = write(tmp_path / "v.parquet", table, row_group_size=5)  # group 0: only 3s and nulls
    want = dd.read_parquet(path, filters=filters, columns=["id"]).compute()["id"]
    got = read(client, path, filters=filters, blocksize=1)["id"]
    assert sorted(got) == sorted(want)
    assert 0 in set(got)  # a null in the row group whose statistics say only 3


@pytest.mark.parametrize("filters", [[("x", "!=", 3.0)], [("x", "not in", [3.0])]])
def test_nans_pass_not_equal_in_every_row_group(client, tmp_path, filters):
    """A float column's NaNs pass ``!=`` and ``not in`` (Dask's rule for rows) in every row
    group: no statistic counts NaNs, so a group whose statistics say "only 3.0" is read (Dask's
    own pruning skips it, and so drops row 1's NaN but keeps row 7's)."""
    x = [3.0, np.nan, 3.0, 3.0, 3.0, 1.0, 2.0, np.nan, 3.0, 4.0]
    path = write(tmp_path / "x.parquet", pa.table({"id": np.arange(10), "x": x}), row_group_size=5)
    got = read(client, path, filters=filters, blocksize=1)
    assert sorted(got["id"]) == [1, 5, 6, 7, 9]


@pytest.mark.parametrize(
    ("filters", "ids"),
    [
        ([("x", "in", [0.0])], [0, 1, 2, 4, 5]),
        ([("x", "in", [0.0, 1.0])], [0, 1, 2, 3, 4, 5]),
        ([("x", "in", [0])], [0, 1, 2, 4, 5]),
    ],
)
def test_in_zero_keeps_a_row_group_of_zeros(tcp, tmp_path, filters, ids):
    """``in`` with a zero keeps a row group of zeros, whose statistics are -0.0 and 0.0 (the
    Parquet writer's rule), the rows ``("x", "==", 0.0)`` keeps: pyarrow took the statistics
    for -0.0 alone, found it in no set of 0.0 and pruned the group (apache/arrow#46183), so
    the 0.0s were dropped and the -0.0s of the other group kept."""
    x = [0.0, 0.0, 0.0, 1.0, -0.0, -0.0]
    path = write(
        tmp_path / "zeros.parquet", pa.table({"id": np.arange(6), "x": x}), row_group_size=3
    )
    got = read(tcp, path, filters=filters, blocksize=1)
    assert sorted(got["id"]) == ids
    assert sorted(read(tcp, path, filters=[("x", "==", 0.0)])["id"]) == [0, 1, 2, 4, 5]


@pytest.mark.parametrize("dtype_backend", [None, "pyarrow"])
def test_filters_on_zoned_times_with_each_dtype_backend(tcp, tmp_path, dtype_backend):
    """A zone-aware value compares with a column stored with a time zone as the same instant
    whatever the dtype backend: with pyarrow-backed columns the value was made naive (UTC),
    for a column it took for naive, so ``==`` kept no row, ``!=`` every one, and ``<``,
    ``in`` and ``not in`` failed the read."""
    zone = pa.timestamp("ms", tz="UTC")
    t = [pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-01-02", tz="UTC"), None]
    path = write(tmp_path / "t.parquet", pa.table({"id": [0, 1, 2], "t": pa.array(t, zone)}))
    first = t[0]
    kwargs = {"dtype_backend": dtype_backend} if dtype_backend else {}
    for filters, ids in (
        ([("t", "==", first)], [0]),
        ([("t", "!=", first)], [1, 2]),
        ([("t", ">", first)], [1]),
        ([("t", "in", [first])], [0]),
        ([("t", "not in", [first])], [1, 2]),
    ):
        got = read(tcp, path, filters=filters, **kwargs)
        assert sorted(got["id"]) == ids, filters
        want = dd.read_parquet(path, filters=filters, **kwargs).compute()
        assert sorted(want["id"]) == ids, filters


@pytest.mark.parametrize("dtype_backend", [None, "numpy_nullable", "pyarrow"])
def test_nans_count_as_nulls_with_each_dtype_backend(tcp, tmp_path, dtype_backend):
    """A float column's NaNs are nulls to ``is``, ``is not`` and ``in`` with None (Dask's
    ``nan_is_null``) whatever the dtype backend: pyarrow-backed floats hold a NaN apart from
    null, and ``is`` dropped it, ``is not`` kept it."""
    x = pa.array([1.0, float("nan"), None, 2.0])
    path = write(tmp_path / "x.parquet", pa.table({"id": [0, 1, 2, 3], "x": x}))
    kwargs = {"dtype_backend": dtype_backend} if dtype_backend else {}
    for filters, ids in (
        ([("x", "is", None)], [1, 2]),
        ([("x", "is not", None)], [0, 3]),
        ([("x", "in", [None, 2.0])], [1, 2, 3]),
        ([("x", "not in", [None, 2.0])], [0, 1, 2]),
    ):
        got = read(tcp, path, filters=filters, **kwargs)
        assert sorted(got["id"]) == ids, filters
    for filters in ([("x", "is", None)], [("x", "is not", None)]):
        want = dd.read_parquet(path, filters=filters, **kwargs).compute()
        assert sorted(read(tcp, path, filters=filters, **kwargs)["id"]) == sorted(want["id"])


UINT64_FILTERS = [[("u", "<=", 5)], [("u", "in", [1, 7])], [("u", ">", 2**63)], [("u", "<", 5.5)],
                  [("s", "in", ["a"])], [("s", "not in", ["a"])], [("s", "==", "b")]]  # fmt: skip


@pytest.mark.parametrize("filters", UINT64_FILTERS)
def test_filters_on_uint64_past_int64_and_on_a_file_of_nulls(client, tmp_path, filters):
    """Row groups are pruned by statistics a filter's value is compared with in the column's
    own type: a uint64 statistic past int64's range (it failed: "Integer value ... not in
    range"), and a column of nulls alone in one file (``in`` failed on its type, null)."""
    write(tmp_path / "part.0.parquet", pa.table({"u": pa.array([1, 2**64 - 1], pa.uint64()),
                                                 "s": ["a", "b"]}), row_group_size=1)  # fmt: skip
    nulls = pa.table({"u": pa.array([7], pa.uint64()), "s": pa.array([None], pa.null())})
    write(tmp_path / "part.1.parquet", nulls)
    frame = pd.DataFrame({"u": np.array([1, 2**64 - 1, 7], np.uint64), "s": ["a", "b", None]})
    column, op, value = filters[0]
    ops = {"<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
    if op in ("in", "not in"):
        mask = frame[column].isin(value)
        mask = mask if op == "in" else ~mask  # a null passes "not in", as in Dask
    else:
        mask = ops[op](frame[column], value)
    got = read(client, str(tmp_path), filters=filters)
    assert sorted(got["u"].tolist()) == sorted(frame[mask]["u"].tolist())


BYTES_AND_CATEGORY_FILTERS = [
    [("c", "<", "v")], [("c", ">=", "v")], [("c", "==", "v")],
    [("b", "in", [b"ab\x00"])], [("b", "in", [b"\x00\x00", b"zz"])],
    [("b", "not in", [b"ab\x00"])], [("f", "in", [b"\x00" * 4, b"<<<<"])],
    [("f", "not in", [b"ab\x00\x00"])],
]  # fmt: skip


@pytest.mark.parametrize("filters", BYTES_AND_CATEGORY_FILTERS, ids=str)
def test_filters_on_categories_and_bytes_keep_the_rows_dask_keeps(client, tmp_path, filters):
    """An order filter on a dictionary-encoded column compares its values, as pyarrow does
    (pandas refused: "Unordered Categoricals can only compare equality"); ``in`` on bytes
    ending in NULs matches them whole (a list of bytes became NumPy's, which drops them)."""
    table = pa.table({
        "c": pa.array(["u", "v", "w", "u"]).dictionary_encode(),
        "b": pa.array([b"ab\x00", b"ab", b"\x00\x00", b"zz"], pa.binary()),
        "f": pa.array([b"\x00" * 4, b"<<<<", b"ab\x00\x00", b"abcd"], pa.binary(4)),
        "id": [0, 1, 2, 3],
    })  # fmt: skip
    write(tmp_path / "a.parquet", table)
    got = read(client, str(tmp_path), filters=filters)
    expected = dd.read_parquet(tmp_path, filters=filters).compute()
    assert sorted(got["id"].tolist()) == sorted(expected["id"].tolist())


def _groups(*tables: dict, **types) -> list:
    """Row groups of one file: ``id`` and the columns of each dict, typed by ``types``."""
    return [pa.table({c: pa.array(v, types.get(c)) for c, v in t.items()}) for t in tables]


NANO = pd.Timestamp("2020-01-01 00:00:00.000000001")
BIG = 2**53 + 1
NAN = float("nan")
EDGE_FILTERS = {  # row groups, filters, the ids Dask's rules keep
    "int past 2**53 with a null": (
        _groups({"id": [0, 1, 2], "x": [2**53, 2**53 + 2, None]}, x=pa.int64()),
        [([("x", "==", BIG)], []), ([("x", "!=", BIG)], [0, 1, 2]), ([("x", "<", BIG)], [0]),
         ([("x", ">=", BIG)], [1]), ([("x", "in", [BIG])], []),
         ([("x", "not in", [BIG])], [0, 1, 2])],
    ),
    "nanoseconds": (
        _groups({"id": [0], "t": [pd.Timestamp("2020-01-01")]},
                {"id": [1], "t": [pd.Timestamp("2020-01-02")]}, t=pa.timestamp("ns")),
        [([("t", "<", NANO)], [0]), ([("t", "!=", NANO)], [0, 1]),
         ([("t", "in", [NANO])], []), ([("t", "not in", [NANO])], [0, 1])],
    ),
    "float in None": (
        _groups({"id": [0, 1], "f": [NAN, 1.0]}, {"id": [2, 3], "f": [NAN, None]}),
        [([("f", "in", [None])], [0, 2, 3])],  # a NaN counts as null, as in "is"
    ),
    "None and empty lists": (
        _groups({"id": [0, 1], "s": ["a", None], "d": ["a", None]},
                d=pa.dictionary(pa.int32(), pa.string())),
        [([("s", "in", [None])], [1]), ([("s", "not in", [])], [0, 1]),
         ([("d", "not in", [None])], [0, 1]), ([("d", "in", [])], [])],
    ),
    "float16": (
        _groups({"id": [0, 1], "h": np.array([0.5, 2.0], np.float16)}),
        [([("h", ">", 1.0)], [1]), ([("h", "==", 0.5)], [0]), ([("h", "in", [0.5])], [0])],
    ),
    "floats on int statistics past 2**53": (
        _groups({"id": [0, 1], "x": [-(2**62), 0]}, x=pa.int64()),
        [([("x", "<", 1.5)], [0, 1]), ([("x", "==", 0.0)], [1]), ([("x", "in", [0.0])], [1]),
         ([("x", ">", -0.5)], [1]), ([("x", "==", 0.5)], []), ([("x", "!=", 0.5)], [0, 1])],
    ),
    "uint64 with None": (
        _groups({"id": [0, 1, 2], "u": [2**63, 5, None]}, u=pa.uint64()),
        [([("u", "in", [2**63])], [0]), ([("u", "in", [2**63, None])], [0, 2]),
         ([("u", "not in", [2**63, None])], [1, 2]), ([("u", ">=", 2**63)], [0])],
    ),
}  # fmt: skip


@pytest.mark.parametrize("dtype_backend", [None, "numpy_nullable", "pyarrow"])
@pytest.mark.parametrize("case", sorted(EDGE_FILTERS))
def test_filters_at_the_edges_of_types_keep_the_same_rows_however_cut(
    tcp, tmp_path, case, dtype_backend
):
    """Filters decide each row as Dask's rules say, and row-group pruning never drops a row
    the filter keeps, whether row groups are read apart or together: an int past 2**53 on a
    column pandas decodes as float64 (it was rounded), a time with nanoseconds (pyarrow's
    scalar dropped them and pruned a kept group), ``in [None]`` on floats (a NaN counts as
    null; pruning dropped groups of NaNs), None or an empty list (refused: a null-typed value
    set), float16 (refused: no kernel), floats on int statistics past 2**53 (refused: not in
    range) and a uint64 list with None (refused: overflow). With each ``dtype_backend``: the
    pyarrow-backed columns' own comparisons overflowed on a uint64 value past int64's range
    and found no kernel for float16's ``in``."""
    groups, cases = EDGE_FILTERS[case]
    kwargs = {"dtype_backend": dtype_backend} if dtype_backend else {}
    with pq.ParquetWriter(tmp_path / "a.parquet", groups[0].schema) as writer:
        for group in groups:
            writer.write_table(group)
    for filters, ids in cases:
        for split in ("infer", True):
            df = dg.read_parquet(
                tmp_path, filters=filters, split_row_groups=split, client=tcp, **kwargs
            )
            got = compute(tcp, df)
            assert sorted(got["id"].tolist()) == ids, (filters, split)
            assert len(df) == len(ids)


@pytest.mark.parametrize("filters", NULL_FILTERS)
def test_null_filters_as_dask(client, tmp_path, filters):
    """Dask's null test: ``(column, "is", None)`` keeps the nulls, and a float column's NaNs
    (Dask's ``nan_is_null``), ``"is not"`` the others. Row groups without nulls are pruned by
    their null counts, but not for a float column: no statistic counts NaNs (Dask prunes them
    there, and so loses NaN rows where a row group holds no null)."""
    n = 600  # nulls only in the first half's row groups; NaNs in f64 everywhere
    table = pa.table(
        {
            "id": np.arange(n),
            "f32": pa.array([None if i % 7 == 3 and i < 300 else i / 3 for i in range(n)]),
            "f64": np.where(np.arange(n) % 11 == 0, np.nan, np.arange(n) * 0.5),
            "text": pa.array([None if i % 5 == 0 and i < 300 else f"t{i}" for i in range(n)]),
        }
    )
    path = write(tmp_path / "nulls.parquet", table, row_group_size=100)
    frame = table.to_pandas()
    keep = None
    for conjunction in filters if isinstance(filters[0], list) else [filters]:
        mask = np.ones(n, dtype=bool)
        for column, op, _ in conjunction:
            if op in ("is", "is not"):
                mask &= frame[column].isna() if op == "is" else frame[column].notna()
            else:
                mask &= frame[column] < 5
        keep = mask if keep is None else keep | mask
    got = read(client, path, filters=filters)
    assert sorted(got["id"]) == frame["id"][keep].tolist()
    if filters == [("text", "is", None)]:  # the null counts rule out rows 300 and on
        assert dg.read_parquet(path, filters=filters, blocksize=1, client=client).npartitions == 3


def test_filters_prune_row_groups(tcp, tmp_path):
    """Row groups ruled out by statistics are never read: fewer partitions, fewer bytes."""
    path = write(tmp_path / "sorted.parquet", rich_table(1000), row_group_size=100)
    everything = dg.read_parquet(path, blocksize=1, client=tcp)
    assert everything.npartitions == 10

    filters = [[("id", "<", 150)], [("id", ">=", 900)]]  # row groups 0, 1 and 9
    pruned = dg.read_parquet(path, filters=filters, blocksize=1, client=tcp)
    assert pruned.npartitions == 3

    clear_ledgers(tcp)
    compute(tcp, everything)
    all_bytes = int(ledger_report.records(tcp)["bytes"].sum())
    clear_ledgers(tcp)
    got = compute(tcp, pruned)
    pruned_bytes = int(ledger_report.records(tcp)["bytes"].sum())
    assert pruned_bytes < all_bytes * 0.5
    assert_same_frame(got, expected_parquet(path, filters=filters))


COMPARED = {">=": operator.ge, "<": operator.lt, "!=": operator.ne}


@pytest.mark.parametrize(
    "filters",
    [
        [("v", ">=", 2.5e7)],
        [("v", "<", np.float32(2.5))],
        [("v", "in", [1.5, 2.0, None])],
        [("v", "!=", 3.0)],
    ],
    ids=["ge", "lt-numpy-float32", "in", "ne"],
)
def test_float_filter_values_on_an_int_column(tcp, tmp_path, filters):
    """An int64 column compared with floats, as pandas compares them, also where its
    statistics lie past 2**24 (pyarrow compared them as float32 and failed the read, as in
    Dask): row groups still pruned, the rows those a float comparison keeps. With a file that
    stores the column as double, the read's type, a float filter is the one a user writes."""
    (_, op, value) = filters[0]

    def kept(v: pd.Series) -> list:
        keep = v.isin([1.5, 2.0]) if op == "in" else COMPARED[op](v, value)
        return sorted(v[keep].tolist())

    values = pd.Series(np.arange(0, 3 * 10**7, 10**5, dtype=np.int64))
    path = write(tmp_path / "ints.parquet", pa.table({"v": values}), row_group_size=30)
    got = compute(tcp, dg.read_parquet(path, filters=filters, blocksize=1, client=tcp))
    assert sorted(got.v.tolist()) == kept(values)
    if op == ">=":  # the row groups below 2.5e7 are not read
        pruned = dg.read_parquet(path, filters=filters, blocksize=1, client=tcp)
        assert pruned.npartitions < dg.read_parquet(path, blocksize=1, client=tcp).npartitions
    write(tmp_path / "doubles.parquet", pa.table({"v": [2.5, 3.5]}))
    both = compute(tcp, dg.read_parquet(tmp_path, filters=filters, client=tcp))
    assert sorted(both.v.tolist()) == kept(
        pd.concat([values.astype("float64"), pd.Series([2.5, 3.5])])
    )


@pytest.mark.parametrize("dtype_backend", [None, "numpy_nullable"])
def test_float_filter_values_on_a_float32_column(tcp, tmp_path, dtype_backend):
    """A float32 column keeps the rows pyarrow (and so Dask) keeps: compared with a Python
    float in float64 (``1/3`` is below ``1/3f``, ``0.1`` is not ``0.1f``), and ``in`` with its
    values cast to float32 (``0.1f`` is in ``[0.1]``). NumPy compared in float32 and pandas'
    ``isin`` in float64, each the other way round."""
    values = np.array([0.05, 0.1, 1 / 3, 0.5], dtype=np.float32)
    path = write(tmp_path / "f32.parquet", pa.table({"f": values}))
    for filters in (
        [("f", ">", 1 / 3)],
        [("f", "!=", 0.1)],
        [("f", "==", 0.1)],
        [("f", "in", [0.1])],
        [("f", "not in", [0.1, None])],
    ):
        kwargs = {"dtype_backend": dtype_backend} if dtype_backend else {}
        got = compute(tcp, dg.read_parquet(path, filters=filters, client=tcp, **kwargs))
        expected = pq.read_table(path, filters=filters).column("f").to_pylist()
        assert got.f.tolist() == expected, filters


def test_a_selection_after_the_read_reads_only_its_columns(tcp, tmp_path):
    """Dask's optimizer pushes a later selection into the read, as into ``dd.read_parquet``'s:
    ``df[["a"]]`` and ``df.a`` read the column chunks ``columns=["a"]`` reads (the ledger's
    bytes, well under the whole files') and give its rows, in the partitions planned; filters
    on other columns, the index and categories still apply, and ruled-out files stay empty."""
    rng = np.random.default_rng(3)
    n = 60_000
    for k in range(3):
        table = pa.table(
            {
                "id": np.arange(n) + k * n,
                "a": rng.random(n),
                "b": rng.random(n),
                "c": rng.integers(0, 9, n),
                "s": pa.array(rng.choice(["x", "y"], n)).dictionary_encode(),
            }
        )
        write(tmp_path / f"{k}.parquet", table, row_group_size=20_000)

    def loaded(df):
        clear_ledgers(tcp)
        got = compute(tcp, df)
        return got, int(ledger_report.records(tcp).query("op == 'read'")["bytes"].sum())

    _, whole = loaded(dg.read_parquet(tmp_path, client=tcp))
    want, asked = loaded(dg.read_parquet(tmp_path, columns=["a"], client=tcp))
    selected = dg.read_parquet(tmp_path, client=tcp)[["a"]]
    got, projected = loaded(selected)
    assert_frame_equal(got, want)
    assert projected == asked < whole / 2
    series, _ = loaded(dg.read_parquet(tmp_path, client=tcp).a)
    assert_series_equal(series, want["a"])
    swapped, _ = loaded(dg.read_parquet(tmp_path, client=tcp)[["b", "a"]])
    assert list(swapped.columns) == ["b", "a"]  # in the order asked, as Dask's meta says
    # no column at all: the rows alone, as dd.read_parquet gives them, one column read
    empty, rows_only = loaded(dg.read_parquet(tmp_path, client=tcp)[[]])
    assert empty.shape == (3 * n, 0) and rows_only < whole / 2

    filters = [("c", ">", 4), ("id", ">=", n)]  # the first file ruled out by its statistics
    df = dg.read_parquet(tmp_path, filters=filters, index="id", client=tcp)[["b", "s"]]
    got, _ = loaded(df)
    full = expected_parquet(str(tmp_path), filters=filters).set_index("id")
    assert_frame_equal(got, full[["b", "s"]])
    assert got["s"].dtype == "category" and got.index.name == "id"
    labels, _ = loaded(dg.read_parquet(tmp_path, filters=filters, index="id", client=tcp)[[]])
    assert_frame_equal(labels, full[[]])


@pytest.mark.parametrize("shape", ["many row groups", "many columns"])
def test_a_selection_of_a_shard_of_too_many_chunks_to_list_reads_only_its_columns(
    tcp, tmp_path, shape
):
    """A shard of more column chunks than it lists (``MAX_CHUNKS``: 16 row groups of 100
    columns, or 1,100 columns in one row group) finds them in its footer on the worker: a
    selection after the read reads the bytes ``columns=`` reads (it read the whole file,
    40-85 x more), and gives the same rows."""
    from dask_gpudirect.formats.parquet import MAX_CHUNKS

    rng = np.random.default_rng(5)
    if shape == "many row groups":
        table = pa.table({f"c{j}": rng.random(3200) for j in range(100)})
        path = write(tmp_path / "many.parquet", table, row_group_size=200)
        picked = ["c7"]
    else:
        table = pa.table({f"c{j}": rng.random(200) for j in range(MAX_CHUNKS + 76)})
        path, picked = write(tmp_path / "wide.parquet", table), ["c1", "c0"]
    assert table.num_columns * (table.num_rows // 200) > MAX_CHUNKS
    df = dg.read_parquet(path, client=tcp)
    (shard,) = shards_of(df).values()
    assert shard.part.chunks == ()  # not listed: too many to carry in each task
    asked, asked_bytes = _read_counting(tcp, dg.read_parquet(path, columns=picked, client=tcp))
    got, got_bytes = _read_counting(tcp, df[picked])
    assert_frame_equal(got, table.select(picked).to_pandas())
    assert_frame_equal(got, asked)
    assert got_bytes == asked_bytes < os.path.getsize(path) / 10


def _read_counting(client, df) -> tuple[pd.DataFrame, int]:
    """``df`` computed, and the bytes its reads took from storage (the ledger's)."""
    clear_ledgers(client)
    got = compute(client, df)
    return got, int(ledger_report.records(client).query("op == 'read'")["bytes"].sum())


def test_filters_prune_everything(client, tmp_path):
    """No row group can match: an empty frame with the projected schema, nothing read."""
    path = write(tmp_path / "none.parquet", rich_table(), row_group_size=100)
    df = dg.read_parquet(path, columns=["id", "text"], filters=[("id", ">", 10**6)], client=client)
    got = compute(client, df)
    assert len(got) == 0
    assert list(got.columns) == ["id", "text"]


def test_filter_column_not_projected(client, tmp_path):
    """A filter may use a column that is not loaded; it is read, applied, then dropped."""
    path = write(tmp_path / "fc.parquet", rich_table(), row_group_size=100)
    df = dg.read_parquet(path, columns=["text"], filters=[("id", "<", 10)], client=client)
    assert list(df.columns) == ["text"]
    got = compute(client, df)
    assert_same_frame(got, expected_parquet(path, columns=["text"]).head(10))


@pytest.fixture
def dataset(tmp_path):
    """Three files of one schema in a directory, plus a hidden and a metadata file."""
    root = tmp_path / "data"
    root.mkdir()
    files = []
    for k in range(3):
        files.append(
            write(root / f"part-{k}.parquet", rich_table(200, start=200 * k), row_group_size=40)
        )
    (root / "_SUCCESS").write_text("")
    (root / ".hidden.parquet").write_text("not parquet")
    return root, files


def test_paths_file_list_directory_glob(client, dataset):
    root, files = dataset
    expected_all = expected_parquet(files)
    assert_same_frame(read(client, files[1]), expected_parquet(files[1]))
    assert_same_frame(read(client, [files[2], files[0]]), expected_parquet([files[2], files[0]]))
    assert_same_frame(read(client, root), expected_all)
    assert_same_frame(read(client, os.fspath(root)), expected_all)
    assert_same_frame(read(client, os.path.join(root, "part-*.parquet")), expected_all)
    assert_same_frame(
        read(client, [os.path.join(root, "part-[01].parquet"), files[2]]), expected_all
    )
    # a file two entries name is read twice, as dd.read_parquet reads it: none dropped
    twice = [os.path.join(root, "part-*.parquet"), files[0]]
    assert_same_frame(read(client, twice), expected_parquet([*files, files[0]]))


def test_auto_blocksize_joins_small_files_and_leaves_every_worker_some(client, tmp_path):
    """Twelve small files on two workers: joined about three by three, in file order, into no
    fewer than two partitions per worker, each worker reading at least two."""
    for k in range(12):
        pq.write_table(pa.table({"id": np.arange(100) + 100 * k}), tmp_path / f"p{k:02d}.parquet")
    df = dg.read_parquet(tmp_path, client=client)
    assert 4 <= df.npartitions < 12
    got = compute(client, df)
    np.testing.assert_array_equal(got["id"].to_numpy(), np.arange(1200))
    per_worker = Counter(s.worker for s in shards_of(df).values())
    assert len(per_worker) == 2 and min(per_worker.values()) >= 2


def test_auto_blocksize_gives_each_worker_as_many_partitions(tcp, tmp_path, monkeypatch):
    """Seven partitions' worth of equal files on two workers: "auto" makes six, three a worker
    of two files each, where seven would leave one worker reading four while the other waits.
    (The host's auto size is set to a seventh of these files: 256 MiB would need 2 GB of them.)
    """
    for k in range(12):
        pq.write_table(pa.table({"id": np.arange(100) + 100 * k}), tmp_path / f"p{k:02d}.parquet")
    total = sum(s.nbytes for s in shards_of(dg.read_parquet(tmp_path, blocksize=1)).values())
    monkeypatch.setattr(dg_collections, "AUTO_HOST", total // 7 + 1)
    df = dg.read_parquet(tmp_path, client=tcp)
    assert df.npartitions == 6
    assert compute(tcp, df.map_partitions(len)).tolist() == [200] * 6
    assert sorted(Counter(s.worker for s in shards_of(df).values()).values()) == [3, 3]
    np.testing.assert_array_equal(compute(tcp, df)["id"].to_numpy(), np.arange(1200))


def test_blocksize_partitions(client, dataset):
    """Partitions are runs of row groups, small files and runs joined up to the blocksize, in
    file order (as Dask's read_parquet joins them)."""
    root, files = dataset
    whole = dg.read_parquet(root, blocksize="256MiB", client=client)  # all joined, in order
    assert whole.npartitions == 1
    assert_same_frame(compute(client, whole), expected_parquet(files))
    # "auto" (the default) joins no further than two partitions per worker: here, none
    assert dg.read_parquet(root, client=client).npartitions == 3
    assert dg.read_parquet(root, blocksize=1, client=client).npartitions == 15
    rg_bytes = pq.ParquetFile(files[0]).metadata.row_group(0).total_byte_size
    df = dg.read_parquet(root, blocksize=2 * rg_bytes, client=client)
    assert 1 < df.npartitions < 15
    parts = partitions(client, df)
    assert all(isinstance(p, pd.DataFrame) for p in parts)
    assert all(len(p) > 0 for p in parts)
    assert sum(map(len, parts)) == 600
    assert_same_frame(pd.concat(parts), expected_parquet(files))
