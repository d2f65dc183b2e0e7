"""Data, expectations and worker probes for the GPU suite; shipped to workers by value.

Everything here imports only CPU libraries at import time, so CI (no GPU) can collect the suite
and skip it. cuDF and CuPy are imported inside the functions that need them.
"""

from __future__ import annotations

import datetime
import decimal
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PLUGIN = "gpudirect"
#: GPUDirectPlugin threads in the suite's clusters (not the default 16, so tests see ours).
PLUGIN_THREADS = 4
#: dask-cuda's own worker plugins (named ``<Class>-<uuid>``), which ours must not displace.
DASK_CUDA_PLUGINS = ("CPUAffinity", "RMMSetup", "PreImport", "CUDFSetup")

PARQUET_FILES = 3
ROWS_PER_FILE = 3000
ROW_GROUP = 1000
COMPRESSIONS = ("snappy", "zstd", "none")


# --- Parquet -------------------------------------------------------------------------------------


def parquet_table(start: int, n: int) -> pa.Table:
    """Rows ``start .. start + n`` of many types, with nulls in every column but ``i``."""
    ks = range(start, start + n)
    t0 = datetime.datetime(2024, 1, 1)
    colors = ["red", "green", "blue"]
    return pa.table(
        {
            "i": pa.array(list(ks), pa.int64()),
            "i32": pa.array([None if k % 17 == 0 else k % 1000 - 500 for k in ks], pa.int32()),
            "f": pa.array([None if k % 7 == 0 else k * 0.25 for k in ks], pa.float64()),
            "b": pa.array([None if k % 19 == 0 else k % 2 == 0 for k in ks], pa.bool_()),
            "s": pa.array(
                [None if k % 11 == 0 else f"s{k % 37}-" + "x" * (k % 5) for k in ks], pa.string()
            ),
            "cat": pa.array(
                [None if k % 13 == 0 else colors[k % 3] for k in ks]
            ).dictionary_encode(),
            "dec": pa.array(
                [None if k % 5 == 0 else decimal.Decimal(k).scaleb(-2) for k in ks],
                pa.decimal128(12, 2),
            ),
            "dec38": pa.array(
                [None if k % 6 == 0 else decimal.Decimal(k * 1_000_003).scaleb(-6) for k in ks],
                pa.decimal128(38, 6),
            ),
            "ts": pa.array(
                [None if k % 23 == 0 else t0 + datetime.timedelta(seconds=k) for k in ks],
                pa.timestamp("us"),
            ),
            "ts_ms": pa.array(
                [None if k % 29 == 0 else t0 + datetime.timedelta(milliseconds=7 * k) for k in ks],
                pa.timestamp("ms"),
            ),
            "l": pa.array(
                [None if k % 9 == 0 else [k + j for j in range(k % 4)] for k in ks],
                pa.list_(pa.int32()),
            ),
        }
    )


def write_parquet_dataset(directory) -> list[str]:
    """Three files (snappy, zstd, uncompressed), 3 row groups each: the round-trip dataset."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, compression in enumerate(COMPRESSIONS):
        path = os.path.join(directory, f"part-{i}.parquet")
        table = parquet_table(i * ROWS_PER_FILE, ROWS_PER_FILE)
        pq.write_table(table, path, row_group_size=ROW_GROUP, compression=compression)
        paths.append(path)
    return paths


def expected_parquet(paths, columns=None, filters=None) -> pa.Table:
    """What pyarrow reads with Dask's ``filters``, file by file in order, as one table."""
    from util import dask_filters

    tables = [pq.read_table(p, columns=columns, filters=dask_filters(filters)) for p in paths]
    return pa.concat_tables(tables)


def assert_same_table(got: pa.Table, expected: pa.Table) -> None:
    """Same columns in the same order, same rows, same values (nulls included), column by column.

    Values are compared as Python objects, so a dictionary column equals its strings and a
    decimal equals its value whatever the decimal width cuDF picked.
    """
    assert got.column_names == expected.column_names
    assert got.num_rows == expected.num_rows, (got.num_rows, expected.num_rows)
    for name in expected.column_names:
        try:
            a, b = _values(got.column(name)), _values(expected.column(name))
        except OverflowError:  # a nested date past Python's: Arrow compares it
            x, y = got.column(name).combine_chunks(), expected.column(name).combine_chunks()
            assert x.equals(y), f"column {name!r} ({x.type} vs {y.type}) differs"
            continue
        if a != b:
            first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            raise AssertionError(
                f"column {name!r} ({got.column(name).type} vs {expected.column(name).type}) "
                f"differs first at row {first}: {a[first]!r} != {b[first]!r}"
            )


#: What a NaN compares as: equal to another NaN, as the two readers mean it.
NAN = "NaN"


def _values(column: pa.ChunkedArray) -> list:
    """A column as Python values: categories as their values, strings as their bytes (a file's
    "strings" need not be UTF-8: libcudf reads undeclared binary as strings), timestamps as
    their integers (Python's datetime ends at year 9999), NaN as :data:`NAN`."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        column = column.cast(pa.large_binary())
    elif pa.types.is_timestamp(kind):
        column = column.cast(pa.int64())
    return [_plain(v) for v in column.to_pylist()]


def _plain(value):
    if isinstance(value, float) and value != value:
        return NAN
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def described(part) -> tuple[dict[str, str], pa.Table]:
    """A partition's column types and its rows as Arrow, made on its worker (run there): cuDF
    26.10 cannot serialize a frame whose structs hold strings under pandas 3 (``StructDtype``
    asks a pandas ``StringDtype`` for ``.str``), so nested partitions do not travel as frames."""
    return {c: str(t) for c, t in part.dtypes.items()}, cudf_to_arrow(part)


def cudf_to_arrow(frame) -> pa.Table:
    import cudf

    assert isinstance(frame, cudf.DataFrame), type(frame)
    return frame.to_arrow(preserve_index=False)


# --- binary --------------------------------------------------------------------------------------


def npy_array(shape, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        native = dtype.newbyteorder("=")  # numpy draws only native-order integers
        return rng.integers(info.min, info.max, shape, dtype=native, endpoint=True).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def assert_same_array(got, expected: np.ndarray) -> None:
    import cupy

    assert isinstance(got, cupy.ndarray), type(got)
    host = cupy.asnumpy(got)
    assert host.dtype == expected.dtype, (host.dtype, expected.dtype)
    assert host.shape == expected.shape, (host.shape, expected.shape)
    np.testing.assert_array_equal(host, expected)


# --- worker probes (run with client.run) ---------------------------------------------------------


def plugin_names(dask_worker) -> list[str]:
    return sorted(dask_worker.plugins)


def plugin_state(dask_worker) -> dict:
    plugin = dask_worker.plugins[PLUGIN]
    return {"options": dict(plugin.options), **plugin.describe()}


def kvikio_threads() -> int:
    import kvikio.defaults

    return int(kvikio.defaults.get("num_threads"))


def clear_ledger(dask_worker) -> None:
    dask_worker.plugins[PLUGIN].ledger.clear()


def check_cluster(client, threads: int) -> None:
    """Every worker holds dask-cuda's plugins and ours, with our options and a GPU."""
    names = client.run(plugin_names)
    assert names, "no workers"
    for worker, ns in names.items():
        assert PLUGIN in ns, (worker, ns)
        for prefix in DASK_CUDA_PLUGINS:
            assert any(n.startswith(prefix) for n in ns), (worker, prefix, ns)
    for worker, state in client.run(plugin_state).items():
        assert state["options"]["threads"] == threads, (worker, state)
        assert state["gpus"] >= 1, (worker, state)


def ledger_paths(client) -> list[dict]:
    import dask_gpudirect as dg

    return dg.report(client).to_dict(orient="records")


def set_allowed_roots(roots) -> None:
    """Set ``gpudirect.allowed-roots`` on this worker (read at each listing and each read)."""
    import dask.config

    dask.config.set({"gpudirect.allowed-roots": roots})
