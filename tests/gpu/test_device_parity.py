"""The device target against the host target where a review found them apart: casts between
the types files store a column in (safe on the host), ``in`` on float16 columns, filters on
decimal columns, time-zone-aware timestamps and undeclared binary columns. Each test reads the
same small file on both targets of one ``dg.LocalCUDACluster`` and asserts they agree."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu


def compute(client, collection):
    return client.compute(collection).result()


def _ids(client, path, target, filters):
    df = dg.read_parquet(str(path), filters=filters, target=target, client=client)
    got = compute(client, df)
    ids = got["id"].to_pandas() if target == "device" else got["id"]
    return sorted(int(i) for i in ids)


# --- 1. the device casts a file's column to the read's type unsafely ---------------------------


def test_int64_past_2_53_read_as_double_is_refused_as_on_the_host(cuda_tcp, tmp_path):
    """One file stores ``v`` as int64 holding 2**53 + 1, another as double: the read gives
    double. The host casts safely (pyarrow: 'Integer value ... not in range') and fails with
    an InputError naming the file; the docs say 'each file's values are cast safely'. The
    device's ``_cast`` is cuDF's ``astype``, which rounds to 2**53 silently."""
    pq.write_table(pa.table({"id": [0, 1], "v": pa.array([0, 2**53 + 1], pa.int64())}),
                   tmp_path / "part.0.parquet")  # fmt: skip
    pq.write_table(pa.table({"id": [2], "v": pa.array([0.5], pa.float64())}),
                   tmp_path / "part.1.parquet")  # fmt: skip
    with pytest.raises(dg.InputError, match=r"part\.0\.parquet"):
        compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", client=cuda_tcp))
    device = dg.read_parquet(str(tmp_path), target="device", client=cuda_tcp)
    assert str(device._meta.v.dtype) == "float64"
    with pytest.raises(dg.InputError, match=r"part\.0\.parquet"):
        got = compute(cuda_tcp, device)
        pytest.fail(f"device read gave {got['v'].to_arrow().to_pylist()} (2**53 + 1 rounded)")


def test_us_timestamp_past_the_ns_range_is_refused_as_on_the_host(cuda_tcp, tmp_path):
    """One file stores ``t`` as timestamp[ns], another as timestamp[us] holding the year 3000:
    the read gives ns. The host's safe cast fails ('would result in out of bounds
    timestamp'); the device's ``astype`` wraps the value to another date silently."""
    pq.write_table(
        pa.table({"id": [0], "t": pa.array([pd.Timestamp("2020-01-01")], pa.timestamp("ns"))}),
        tmp_path / "part.0.parquet",
    )
    pq.write_table(
        pa.table({"id": [1], "t": pa.array([datetime.datetime(3000, 1, 1)], pa.timestamp("us"))}),
        tmp_path / "part.1.parquet",
    )
    with pytest.raises(dg.InputError, match=r"part\.1\.parquet"):
        compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", client=cuda_tcp))
    device = dg.read_parquet(str(tmp_path), target="device", client=cuda_tcp)
    with pytest.raises(dg.InputError, match=r"part\.1\.parquet"):
        got = compute(cuda_tcp, device)
        pytest.fail(f"device read gave {got['t'].to_arrow().to_pylist()} (year 3000 wrapped)")


# --- 2. 'in' on a float16 column casts the values to float32 on the device ---------------------


@pytest.mark.parametrize(
    "filters", [[("h", "in", [0.1])], [("h", "not in", [0.1])]], ids=["in", "not-in"]
)
def test_in_filter_on_float16_keeps_the_host_rows(cuda_tcp, tmp_path, filters):
    """The host casts an 'in' list to the column's type (float16: 0.1 -> 0.0999755859375,
    which the row holds); the device decodes float16 as float32 before filtering, so its
    ``_isin`` casts 0.1 to float32 (0.100000001...) and matches nothing."""
    table = pa.table({"id": [0, 1, 2], "h": pa.array(np.array([0.1, 0.5, 2.0], np.float16))})
    pq.write_table(table, tmp_path / "a.parquet")
    host = _ids(cuda_tcp, tmp_path, "host", filters)
    assert host == ([0] if filters[0][1] == "in" else [1, 2])  # the case tests something
    assert _ids(cuda_tcp, tmp_path, "device", filters) == host


# --- 3. filters on a decimal column ------------------------------------------------------------


@pytest.mark.parametrize(
    "filters",
    [
        [("dec", "in", [decimal.Decimal("1.50")])],
        [("dec", "in", [decimal.Decimal("1.5"), 3])],
        [("dec", "not in", [decimal.Decimal("1.50")])],
    ],
    ids=["in", "in-other-scale-and-int", "not-in"],
)
def test_in_filter_on_a_decimal_column_keeps_the_host_rows(cuda_tcp, tmp_path, filters):
    """cuDF's DecimalColumn has no ``_process_values_for_isin``: ``ColumnBase.isin`` makes a
    column of the values (decimal(3, 2) from [Decimal('1.50')]) and, its dtype not the
    column's decimal(12, 2), answers False for every row. The host (pandas' Decimal objects)
    and pyarrow match 1.50."""
    values = ["0.10", "0.12", "0.13", "1.50", "3.00"]
    table = pa.table({
        "id": list(range(len(values))),
        "dec": pa.array([decimal.Decimal(v) for v in values], pa.decimal128(12, 2)),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    host = _ids(cuda_tcp, tmp_path, "host", filters)
    assert host and host != list(range(len(values)))  # the case tests something
    assert _ids(cuda_tcp, tmp_path, "device", filters) == host


def test_order_filter_on_a_decimal_column_with_a_finer_value(cuda_tcp, tmp_path):
    """``dec < Decimal('0.125')`` on decimal(12, 2): the host compares Decimal objects
    (0.10, 0.12 kept); cuDF makes the value a scalar of the column's type
    (``pa.scalar(Decimal('0.125'), decimal128(12, 2))``: ArrowInvalid 'Rescaling Decimal
    value would cause data loss'), which ``_compared`` does not catch (TypeError only): a bare
    pyarrow error from the worker, not the host's rows or an InputError."""
    values = ["0.10", "0.12", "0.13", "1.50"]
    table = pa.table({
        "id": list(range(len(values))),
        "dec": pa.array([decimal.Decimal(v) for v in values], pa.decimal128(12, 2)),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    filters = [("dec", "<", decimal.Decimal("0.125"))]
    host = _ids(cuda_tcp, tmp_path, "host", filters)
    assert host == [0, 1]
    assert _ids(cuda_tcp, tmp_path, "device", filters) == host


# --- 4. a time-zone-aware timestamp column -----------------------------------------------------


def test_filter_on_a_utc_timestamp_column_keeps_the_host_rows(cuda_tcp, tmp_path):
    """libcudf decodes timestamp[us, tz=UTC] as a naive datetime64[us] (the device target
    restores no time zone, in meta or partitions), so a filter with an aware Timestamp, which
    the host and pyarrow take, is refused by cuDF ('Cannot compare tz-naive and tz-aware') and
    becomes an InputError on the device."""
    utc = [pd.Timestamp(f"2020-01-0{d}", tz="UTC") for d in (1, 2, 3)]
    pq.write_table(
        pa.table({"id": [0, 1, 2], "t": pa.array(utc, pa.timestamp("us", "UTC"))}),
        tmp_path / "a.parquet",
    )
    filters = [("t", ">=", pd.Timestamp("2020-01-02", tz="UTC"))]
    host = _ids(cuda_tcp, tmp_path, "host", filters)
    assert host == [1, 2]
    assert _ids(cuda_tcp, tmp_path, "device", filters) == host


# --- 5. bytes filters on an undeclared binary column (lowest confidence) -----------------------


@pytest.mark.parametrize(
    "filters",
    [[("b", "in", [b"ab"])], [("b", "not in", [b"ab"])], [("b", "==", b"zz")]],
    ids=["in", "not-in", "eq"],
)
def test_bytes_filters_on_a_binary_column_keep_the_host_rows(cuda_tcp, tmp_path, filters):
    """libcudf reads an unannotated BYTE_ARRAY as strings; ``_isin`` hands cuDF an object
    array of bytes (for NUL-ending bytes, on the host's account), which cuDF makes a binary
    column or refuses. The host keeps the rows tests/test_parquet.py checks against Dask."""
    table = pa.table({"id": [0, 1, 2], "b": pa.array([b"ab\x00", b"ab", b"zz"], pa.binary())})
    pq.write_table(table, tmp_path / "a.parquet")
    host = _ids(cuda_tcp, tmp_path, "host", filters)
    assert host
    assert _ids(cuda_tcp, tmp_path, "device", filters) == host


def test_a_bytes_filter_that_is_not_utf8_is_refused_on_the_device(cuda_tcp, tmp_path):
    """libcudf reads a column of bytes as strings, which a filter's bytes are matched as: bytes
    that are not UTF-8 cannot be, and are refused naming the file (the host reads them)."""
    table = pa.table({"id": [0, 1], "b": pa.array([b"\xff", b"ab"], pa.binary())})
    pq.write_table(table, tmp_path / "a.parquet")
    filters = [("b", "==", b"\xff")]
    assert _ids(cuda_tcp, tmp_path, "host", filters) == [0]
    with pytest.raises(dg.InputError, match=r"a\.parquet.*not UTF-8"):
        _ids(cuda_tcp, tmp_path, "device", filters)
