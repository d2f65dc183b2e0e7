"""Device target: ``kvikio.CuFile.pread`` into an ``rmm.DeviceBuffer`` (binary shards); libcudf
reads and decodes a Parquet partition's row groups in one call, through the same kvikio.

kvikio uses GDS (one DMA copy) where nvidia-fs is loaded and its compat mode (POSIX read into
pinned bounce buffers, then host-to-device: two copies) elsewhere; the ledger records which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import cupy
import kvikio
import kvikio.defaults
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pylibcudf as plc
import rmm

from .. import cudf_compat, remote
from ..compat import PYARROW_DEFAULTS, Conversion
from ..errors import InputError
from ..formats.parquet import TAIL
from ..shards import decoding
from . import Order, Target

cudf_compat.patch_struct_serialization()

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import cudf
    from distributed import Worker

    from ..access import Opened
    from ..ledger import Ledger
    from ..shards import Shard


def _decode_parquet(
    sources: list[Any], row_groups: list[list[int]] | None, columns: list[str]
) -> cudf.DataFrame:
    """One libcudf read of ``sources`` (device buffers or paths), end to end; ``row_groups``:
    each source's, or None for all."""
    import cudf

    options = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo(sources)).build()
    options.set_column_names(columns)
    if row_groups is not None:
        options.set_row_groups(row_groups)
    return cudf.DataFrame.from_pylibcudf(plc.io.parquet.read_parquet(options))


@dataclasses.dataclass(frozen=True)
class _Span:
    """Device bytes at ``ptr`` as libcudf's readers take them (pylibcudf's Span protocol)."""

    ptr: int
    size: int


def _decode_packed(shard: Shard, buffer: rmm.DeviceBuffer, columns: list[str]) -> cudf.DataFrame:
    """``shard`` decoded from its ranges alone, end to end in ``buffer`` (``Shard.layout``),
    by libcudf's hybrid-scan reader: the footer (the buffer's last bytes) on the host, each
    column chunk a span of the buffer, as cudf-polars' split scans read a file. No buffer
    of the whole file: a remote file cut into k shards cost k times its size before."""
    import cudf

    data = cupy.asarray(buffer)
    tail = data[-TAIL:].get().tobytes()  # the footer's length, then the magic bytes
    length = int.from_bytes(tail[:4], "little")
    footer = data[-TAIL - length : -TAIL].get().tobytes()
    options = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo([])).build()
    options.set_column_names(columns)
    reader = plc.io.experimental.HybridScanReader(footer, options)
    row_groups, layout = list(shard.part.row_groups), shard.layout
    chunks = reader.all_column_chunks_byte_ranges(row_groups, options)
    spans = [_Span(buffer.ptr + layout.at(c.offset, c.size), c.size) for c in chunks]
    return cudf.DataFrame.from_pylibcudf(reader.materialize_all_columns(row_groups, spans, options))


def _decoded(shards: Sequence[Shard], sources: list[Any]) -> cudf.DataFrame:
    """``shards`` decoded end to end from ``sources``: files by path in one libcudf read, or
    the device buffers of remote shards (:func:`_decode_packed`) one by one."""
    import cudf

    columns = list(shards[0].part.read_columns)
    if not isinstance(sources[0], rmm.DeviceBuffer):
        return _decode_parquet(sources, [list(s.part.row_groups) for s in shards], columns)
    frames = []
    for i, shard in enumerate(shards):
        with decoding(shard):  # named here: the buffers decoded are gone, none is decoded again
            frames.append(_decode_packed(shard, sources[i], columns))
        sources[i] = None  # its raw bytes go once decoded, as the host target's do, not
        # held through the others' decoding, the concat and the casts
    with decoding(*shards):
        return cudf.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _decode_run(shards: Sequence[Shard], sources: list[Any]) -> cudf.DataFrame:
    """``shards`` decoded from ``sources`` (a path or a device buffer each), end to end,
    float16 as float32, with the rows their footers promise. Where the decode fails, the
    shard whose source fails alone is named."""
    try:
        frame = _decoded(shards, sources)
    except (MemoryError, InputError):  # InputError: a remote shard's, named as it failed
        raise
    except Exception as exc:  # one call for many files names none: find the one
        for shard, source in zip(shards, sources, strict=True):
            with decoding(shard):
                _decoded([shard], [source])
        with decoding(*shards):
            raise exc from None
    missing = [c for c in shards[0].part.read_columns if c not in frame.columns]
    if missing:  # libcudf joins a path with dots: "a.b" names the field b of a struct a
        raise InputError(
            shards[0].path,
            f"the device target cannot read column(s) {missing}: libcudf takes a dotted name "
            "for the field of a struct of that path; read this file with target='host'",
        )
    frame = halves_as_float32(frame, shards[0].part.halves)
    with decoding(*shards):  # columns stored in other types than the read's
        frame = _cast(frame, shards[0].part.casts)
    rows = sum(shard.part.rows for shard in shards)
    if len(frame) != rows:
        raise InputError(
            shards[0].path,
            f"decoded {len(frame)} rows where the footers of {len(shards)} file(s) promise {rows}",
        )
    return frame


def empty_frame(table: pa.Table, conversion: Conversion = PYARROW_DEFAULTS) -> cudf.DataFrame:
    """The cuDF partition type for ``table``'s schema (a collection's ``meta``).

    Decoded by the same reader as the partitions, so dtypes (decimal widths included) match,
    but for what libcudf types differently when it decodes no rows: fixed-length binary
    (``list<uint8>`` with rows, strings without) and float16 (made float32 values here).
    """
    import cudf

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    frame = _decode_parquet([sink.getvalue().to_pybytes()], None, table.column_names)
    for field in table.schema:
        if pa.types.is_fixed_size_binary(field.type):
            frame[field.name] = cudf.Series([], dtype=cudf.ListDtype("uint8"))
        elif pa.types.is_float16(field.type):
            frame[field.name] = cudf.Series([], dtype="float32")
    return frame


def _cast(frame: cudf.DataFrame, casts: tuple[tuple[str, pa.DataType], ...]) -> cudf.DataFrame:
    """``frame`` with the columns a file stores in other types than the read gives them
    (``ParquetPart.casts``) in those types, as meta has them."""
    import cudf

    for name, dtype in _cudf_types(casts).items():
        column = frame[name]
        if column.null_count < len(column):
            _check_safe(name, column, dtype)
            frame[name] = column.astype(dtype)
        else:  # nulls alone (libcudf's type for a column stored as nulls casts to junk)
            nulls = cudf.Series([None], dtype=dtype).repeat(len(column))
            nulls.index = column.index
            frame[name] = nulls
    return frame


#: Nanoseconds in each unit Parquet stores times and durations in (cuDF's units).
_NANOSECONDS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _check_safe(name: str, column: cudf.Series, dtype: Any) -> None:
    """Raise where ``column`` holds a value ``dtype`` cannot hold, as pyarrow's safe cast (the
    host target's) refuses it: cuDF's ``astype`` rounds an integer past the float's mantissa
    (2**53 + 1 as 2**53) and wraps a timestamp or duration past the finer unit's range."""
    before = column.dtype
    kind, to = getattr(before, "kind", None), getattr(dtype, "kind", None)
    if kind in ("i", "u") and to == "f":
        limit = 2 ** (np.finfo(dtype).nmant + 1)  # pyarrow's range: +-2**53 for float64
        low, high = int(column.min()), int(column.max())
        if low < -limit or high > limit:
            bad = low if low < -limit else high
            raise ValueError(
                f"column {name!r}: integer value {bad} not in range: -{limit} to {limit}"
            )
    elif kind in ("m", "M") and to == kind and before != dtype:
        unit, finer = np.datetime_data(before)[0], np.datetime_data(dtype)[0]
        factor = _NANOSECONDS[unit] // _NANOSECONDS[finer]
        if factor > 1:
            ints = column.astype("int64")
            low, high = int(ints.min()), int(ints.max())
            limit = (2**63 - 1) // factor
            if low < -limit or high > limit:
                raise ValueError(
                    f"column {name!r}: casting from {before} to {dtype} would result in out of "
                    "bounds values"
                )


@functools.lru_cache(maxsize=64)
def _cudf_types(casts: tuple[tuple[str, pa.DataType], ...]) -> dict[str, Any]:
    """The cuDF dtypes of ``casts``' Arrow types: those libcudf decodes them to (meta's)."""
    if not casts:
        return {}
    return dict(empty_frame(pa.schema(list(casts)).empty_table()).dtypes)


def halves_as_float32(frame: cudf.DataFrame, columns: Sequence[str]) -> cudf.DataFrame:
    """``frame`` with its float16 ``columns``, which libcudf gives as lists of their two bytes
    (little-endian), as float32 values: cuDF holds no float16. Nulls stay nulls, NaN NaN."""
    import cudf

    for name in columns:
        column = frame[name]
        low, high = (column.list.get(k).astype("uint16") for k in (0, 1))
        bits = cupy.asarray((low + high * 256).fillna(0).values)
        values = cudf.Series(bits.view(cupy.float16).astype(cupy.float32), nan_as_null=False)
        values.index = frame.index
        frame[name] = values.mask(column.isnull())
    return frame


def with_range_index(
    frame: cudf.DataFrame, ranges: list[tuple[int, int, int]], name: str | None
) -> cudf.DataFrame:
    """``frame`` labelled as the RangeIndex pandas stored: ``(first, step, rows)`` per shard of
    its rows, end to end (one RangeIndex where one shard, its labels joined where more)."""
    import cudf

    if len(ranges) == 1:
        first, step, _ = ranges[0]
        frame.index = cudf.RangeIndex(first, first + step * len(frame), step, name=name)
    else:
        labels = [cupy.arange(first, first + step * n, step) for first, step, n in ranges]
        frame.index = cudf.Index(cupy.concatenate(labels), name=name)
    return frame


@functools.lru_cache(maxsize=16)
def category_type(categories: tuple, integer: bool) -> cudf.CategoricalDtype:
    """A hive partition column's type (see the host target's), as cuDF holds it; made once
    per read, not once per run of files."""
    import cudf

    values = cudf.Index(list(categories), dtype="int32" if integer else "str")
    return cudf.CategoricalDtype(categories=values, ordered=False)


def categories_of(series: cudf.Series) -> pd.Index:
    """A categorical ``series``' categories, copied to the host: few next to its rows, and
    sent to every peer of a shuffle."""
    return series.cat.categories.to_pandas()


def as_categories(categories: pd.Index) -> cudf.Index:
    """Categories (a pandas Index) as cuDF's ``set_categories`` takes them."""
    import cudf

    return cudf.from_pandas(categories)


def with_partition_column(
    frame: cudf.DataFrame,
    name: str,
    values: list,
    rows: list[int],
    categories: tuple,
    integer: bool,
) -> cudf.DataFrame:
    """``frame`` with the hive column ``name``: each file's value (None: null) on its ``rows``,
    end to end, typed by :func:`category_type`: one repeat on the GPU and one cast for a run
    of files from many folders, decoded by one libcudf call."""
    import cudf

    arrow = pa.array(values, type=pa.int32() if integer else pa.string())
    counts = plc.Column.from_array(np.asarray(rows, dtype=np.int32))
    (column,) = plc.filling.repeat(plc.Table([plc.Column.from_arrow(arrow)]), counts).columns()
    series = cudf.Series.from_pylibcudf(column).astype(category_type(categories, integer))
    series.index = frame.index
    frame[name] = series
    return frame


def kept_categories(frame: cudf.DataFrame, columns: tuple[str, ...]) -> cudf.DataFrame:
    """Nothing to change: libcudf decodes ``columns`` as their values, made categories after
    the filters (see the host target's)."""
    return frame


def with_nulls(frame: cudf.DataFrame, columns: tuple[str, ...]) -> cudf.DataFrame:
    """cuDF columns hold nulls in any type: nothing to change (see the host target's)."""
    return frame


def to_table(frame: cudf.DataFrame, index: bool = True) -> plc.Table:
    """A cuDF frame as one pylibcudf table, its index levels first (none without ``index``):
    what RapidsMPF packs."""
    return plc.Table([*(_columns(frame.index) if index else []), *_columns(frame)])


def _columns(frame: cudf.DataFrame | cudf.Index) -> list[plc.Column]:
    """``frame``'s columns as pylibcudf views (``to_pylibcudf`` of a frame builds a pandas
    index of its column names as well, which costs more than the views)."""
    return [column.to_pylibcudf() for column in frame._columns]


def _joined_index(frames: list[cudf.DataFrame]) -> list[plc.Column]:
    """The index levels of ``frames`` end to end. RangeIndexes (what a read or
    ``from_pandas`` gives each partition) are labelled in one pass on the GPU: materialising
    each alone costs cuDF about 0.2 ms, most of a join of many small partitions."""
    import cudf

    if not all(isinstance(f.index, cudf.RangeIndex) for f in frames):
        return plc.concatenate.concatenate([plc.Table(_columns(f.index)) for f in frames]).columns()
    starts = np.array([f.index.start for f in frames], dtype=np.int64)
    steps = np.array([f.index.step for f in frames], dtype=np.int64)
    lengths = np.array([len(f) for f in frames], dtype=np.int64)
    # Row r of frame s (whose rows start at placed[s]) is labelled
    # starts[s] + steps[s] * (r - placed[s]) = first[s] + steps[s] * r.
    first = starts - steps * (np.cumsum(lengths) - lengths)
    first_of_row, step_of_row = _per_row([_int64(first), _int64(steps)], _int64(lengths))
    return [_binop(first_of_row, _binop(step_of_row, _rows(int(lengths.sum())), _MUL), _ADD)]


def concat_frames(
    frames: list[cudf.DataFrame], meta: cudf.DataFrame, index: bool = True
) -> cudf.DataFrame:
    """``frames`` end to end (labelled 0, 1, 2... without ``index``). One libcudf concatenate
    of their columns where that keeps every type (:func:`tables_keep_types`; the same types in
    every frame): ``cudf.concat`` spends about 0.2 ms a frame on its checks, this about
    0.02 ms; Dask's concat (cuDF's) for the rest."""
    from dask.dataframe.dispatch import concat

    if len(frames) == 1:
        return frames[0] if index else frames[0].reset_index(drop=True)
    if tables_keep_types(meta):
        try:
            data = plc.concatenate.concatenate([plc.Table(_columns(f)) for f in frames])
            labels = _joined_index(frames) if index else []
            return from_table(plc.Table([*labels, *data.columns()]), meta, index)
        except (TypeError, ValueError, RuntimeError):  # frames of differing types: cuDF's rules
            pass
    return concat(frames, ignore_index=not index)


def take_rows(frame: cudf.DataFrame, order: cupy.ndarray, index: bool = True) -> cudf.DataFrame:
    """Rows ``order`` of ``frame``; without ``index``, labelled 0, 1, 2... and the index not
    gathered (nor made: a RangeIndex taken becomes a column of labels)."""
    if index or not tables_keep_types(frame, index=False):
        taken = frame.take(order)
        return taken if index else taken.reset_index(drop=True)
    policy = plc.copying.OutOfBoundsPolicy.DONT_CHECK
    return from_table(
        plc.copying.gather(to_table(frame, False), _int64(order), policy), frame, False
    )


def hash_partition(
    frame: cudf.DataFrame,
    on: list,
    n: int,
    meta: cudf.DataFrame,
    index: bool = True,
    hashed: cudf.DataFrame | None = None,
) -> tuple[cudf.DataFrame, np.ndarray] | None:
    """``frame``'s rows grouped by output partition as Dask's hash assigns them, in no set order
    within one (it differs from call to call), and each output's row count; None for frames like
    ``meta`` whose types a pylibcudf table does not keep (the ordered split takes those).
    ``hashed``: the values hashed in place of the ``on`` columns (Dask's own shuffle hashes
    numbers as float64), one row for each of ``frame``'s.

    One libcudf ``hash_partition`` call: murmur3 with seed 0 over the ``on`` columns (or
    ``hashed``), the hash of cuDF's ``hash_values`` that Dask's ``partitioning_index`` takes
    modulo ``n``. On an H200 it cut 54 Mi rows in 3.4-5.5 ms, where the ordered split's hash,
    stable sort and gather took 14-25 ms (``scripts/split-kernels.py``)."""
    if not tables_keep_types(meta, index):
        return None
    if len(frame) == 0:
        return frame if index else frame.reset_index(drop=True), np.zeros(n, dtype=np.int64)
    columns = list(to_table(frame, index).columns())
    if hashed is None:
        levels = frame.index.nlevels if index else 0
        keys = [levels + frame.columns.get_loc(c) for c in on]
    else:  # hashed after the frame's own columns, and dropped from the cut
        keys = list(range(len(columns), len(columns) + len(hashed.columns)))
        columns += _columns(hashed)
    table, offsets = plc.partitioning.hash_partition(plc.Table(columns), keys, n)
    sizes = np.diff(np.array([*offsets, len(frame)], dtype=np.int64))[:n]
    cut = plc.Table(table.columns()[: len(columns) - len(keys)]) if hashed is not None else table
    return from_table(cut, frame, index), sizes


def concat_slices(
    frames: list[cudf.DataFrame],
    slices: list[tuple[int, int, int]],
    meta: cudf.DataFrame,
    index: bool = True,
) -> cudf.DataFrame:
    """Rows ``start:stop`` of ``frames[k]`` for each ``(k, start, stop)`` of ``slices``, end to
    end, in one copy: pylibcudf views of the slices and one concatenate, where joining the
    frames and gathering from the join copies every row twice (on the H200, 5.1 against
    10.4 ms for 1 GiB in eight slices). Each view costs about 0.2 ms, so it pays for few."""
    if tables_keep_types(meta):
        tables = [to_table(frame, index) for frame in frames]
        views = [plc.copying.slice(tables[k], [a, b])[0] for k, a, b in slices]
        try:
            return from_table(plc.concatenate.concatenate(views), meta, index)
        except (TypeError, ValueError, RuntimeError):  # frames of differing types: cuDF's rules
            pass
    return concat_frames([frames[k].iloc[a:b] for k, a, b in slices], meta, index)


def tables_keep_types(meta: cudf.DataFrame, index: bool = True) -> bool:
    """Whether frames like ``meta`` survive a trip through pylibcudf tables (their index too,
    with ``index``): not with a categorical or struct column, whose categories or field names
    a table does not carry. Asked of a whole frame, only without ``index``: the index's types
    come from a frame of it, which for a RangeIndex is a column of all its labels."""
    import cudf

    kept = (cudf.CategoricalDtype, cudf.StructDtype)
    labels = meta.index.to_frame(index=False).dtypes if index else []
    types = [*meta.dtypes, *labels]
    return not any(isinstance(t, kept) for t in types)


def cut_frame(
    frame: cudf.DataFrame, bounds: np.ndarray, index: bool = True
) -> list[cudf.DataFrame]:
    """``frame``'s rows ``bounds[k]:bounds[k + 1]`` as slices that share its memory, as
    dask_cudf's own shuffle outputs share theirs: cuDF's split (what ``scatter_by_map`` cuts
    with), one libcudf call for all of them, where ``iloc`` costs about 0.2 ms a slice and a
    copy 0.55 ms. Device memory of a frame goes back once its last slice is freed or
    spilled; a shuffle's frame is one group of outputs, at most a chunk
    (``gpudirect.shuffle.chunk-size``). Without ``index``, each slice is labelled 0, 1, 2...
    and no labels are cut (nor made: a RangeIndex cut is a column of labels first)."""
    if len(frame) == 0:  # cuDF's split of no rows gives no frames
        return [frame] * (len(bounds) - 1)
    return frame._split([int(b) for b in bounds[1:-1]], keep_index=index)


#: Whether :func:`cut_frame`'s outputs are copies: slices here, so joining and cutting a group
#: holds no more than copying each output out of the pieces would.
CUT_COPIES = False


def copied(frame: cudf.DataFrame) -> cudf.DataFrame:
    """``frame`` in memory of its own (a slice of a frame shares the frame's)."""
    return frame.copy()


def from_table(table: plc.Table, meta: cudf.DataFrame, index: bool = True) -> cudf.DataFrame:
    """The frame :func:`to_table` made, with ``meta``'s column names, index and dtypes
    (without ``index``, labelled 0, 1, 2...)."""
    import cudf

    levels = meta.index.nlevels if index else 0
    columns = table.columns()
    frame = cudf.DataFrame.from_pylibcudf(
        plc.Table(columns[levels:]), {"columns": list(meta.columns)}
    )
    if levels:
        labels = cudf.DataFrame.from_pylibcudf(
            plc.Table(columns[:levels]), {"columns": list(range(levels))}
        )
        if levels > 1:
            frame.index = cudf.MultiIndex.from_frame(labels, names=meta.index.names)
        else:
            frame.index = cudf.Index(labels[0], name=meta.index.name)
    changed = {c: t for c, t in meta.dtypes.items() if frame[c].dtype != t}
    return frame.astype(changed) if changed else frame


def frames_of(
    tables: list[plc.Table], meta: cudf.DataFrame, index: bool = True
) -> list[cudf.DataFrame]:
    """Tables laid out as :func:`to_table` lays them, as frames: one join of them all and one
    cut (:func:`cut_frame`), where a :func:`from_table` each costs cuDF 1.2-4 ms. A table of no
    rows may have no columns either (RapidsMPF's of a partition that got none): ``meta``."""
    rows = np.array([t.num_rows() for t in tables], dtype=np.int64)
    full = [t for t in tables if t.num_rows()]
    if not full:
        return [meta] * len(tables)
    joined = plc.concatenate.concatenate(full) if len(full) > 1 else full[0]
    parts = cut_frame(from_table(joined, meta, index), np.cumsum([0, *rows]), index)
    return [part if n else meta for part, n in zip(parts, rows, strict=True)]


def empty_array(dtype: np.dtype, ndim: int) -> cupy.ndarray:
    return cupy.empty((0,) * ndim, dtype=dtype.newbyteorder("="))


def unsupported(dtype: np.dtype) -> str | None:
    """Why CuPy cannot hold ``dtype``, or None: it holds numbers and booleans only."""
    if dtype.kind not in "biufc":
        return f"dtype {dtype} cannot live on the GPU: CuPy holds only numbers and booleans"
    return None


def permutations(lengths: np.ndarray, seeds: np.ndarray) -> cupy.ndarray:
    """Row positions that put each run of ``lengths[k]`` rows (the runs end to end) in a random
    order drawn from ``seeds[k]`` alone, each run kept in its place: one sort for every run,
    where a CuPy generator a run cost about 1.4 ms (``dg.shuffle_array``'s split of 512 chunks
    a worker: 0.7 s). Each row's key is the 64-bit xxHash of its run's seed plus its place in
    the run (one column: hashing the two as a table, where libcudf seeds each column's hash
    with the one before, left the order within a run far from uniform: over 4000 seeds of runs
    of 8 rows, a chi-square of 58 where chance exceeds 24.3 one time in 1000), the run's
    number in the top bits (the fewest that hold it), so that one stable radix sort orders the
    runs and shuffles within each. libcudf's calls only (see :func:`group_order`)."""
    total = int(np.sum(lengths))
    if not total:
        return cupy.empty(0, dtype=cupy.int64)
    runs = len(lengths)
    sizes = _int64(lengths)
    starts = plc.reduce.scan(sizes, plc.aggregation.sum(), plc.reduce.ScanType.EXCLUSIVE)
    seed_of_row, start_of_row, run_of_row = _per_row(
        [_uint64(seeds), starts, _uint64(np.arange(runs))], sizes
    )
    place = _binop(_rows(total), start_of_row, _SUB)
    key = plc.hashing.xxhash_64(plc.Table([_binop(seed_of_row, place, _ADD, _UINT64)]), 0)
    bits = (runs - 1).bit_length()
    if bits:
        high = _binop(run_of_row, _uint64_scalar(64 - bits), _SHL, _UINT64)
        key = _binop(high, _binop(key, _uint64_scalar(bits), _SHR, _UINT64), _OR, _UINT64)
    ascending, nulls = [plc.types.Order.ASCENDING], [plc.types.NullOrder.AFTER]
    return _cupy(plc.sorting.stable_sorted_order(plc.Table([key]), ascending, nulls))


def group_order(where: cudf.Series, lengths: list[int], n: int) -> tuple[cupy.ndarray, np.ndarray]:
    """The row order that groups equal values of ``where`` (0..n-1, a cuDF Series), stably, and
    how many rows of the ``k``-th run of ``lengths`` rows hold ``j``, as :func:`host.group_order
    <dask_gpudirect.targets.host.group_order>` gives them.

    libcudf's calls only, whose kernels ship compiled: CuPy's compile on their first call in a
    process (NVRTC), which cost a fresh machine's first shuffle 6 s of a 7-8 s run
    (``scripts/cold-split.py``). The sort is stable radix, a pass per byte of the key: the
    narrowest type that holds ``n - 1`` (one pass below 256 outputs, where int64 takes eight).
    Along that order ``key = value * inputs + input`` rises: its distinct values (one pass) are
    the ``(output, input)`` cells that hold rows, and a search for each gives where its run
    starts. Both come back to the host as rows ``(j, k, rows)`` (the shuffle's ``Cells``): work
    and memory follow the rows, where a search for every ``(j, k)`` took a vector of
    inputs x outputs (268 MB at 4,096 inputs and 8,192 outputs) and copied it to the host."""
    inputs = len(lengths)
    values = where._column.to_pylibcudf()
    if n <= 1 << 16:
        narrow = plc.DataType(plc.TypeId.UINT8 if n <= 1 << 8 else plc.TypeId.UINT16)
        values_narrow = plc.unary.cast(values, narrow)
    else:
        values_narrow = values
    ascending, nulls = [plc.types.Order.ASCENDING], [plc.types.NullOrder.AFTER]
    order = plc.sorting.stable_sorted_order(plc.Table([values_narrow]), ascending, nulls)
    (source,) = _per_row([_rows(inputs)], _int64(lengths))  # the input each row came from
    key = _binop(_binop(values, plc.Scalar.from_py(inputs, _INT64), _MUL), source, _ADD)
    ordered = plc.copying.gather(plc.Table([key]), order, plc.copying.OutOfBoundsPolicy.DONT_CHECK)
    keep, equal = plc.stream_compaction.DuplicateKeepOption.KEEP_FIRST, plc.types.NullEquality.EQUAL
    held = plc.stream_compaction.unique(ordered, [0], keep, equal)  # sorted: one of each run
    starts = _cupy(plc.search.lower_bound(ordered, held, ascending, nulls)).get().astype(np.int64)
    j, k = np.divmod(_cupy(held.columns()[0]).get(), inputs)
    return _cupy(order), np.stack([j, k, np.diff(starts, append=len(where))])


#: ``gpudirect.shuffle.chunk-size: auto`` here: bytes of inputs a shuffle stage splits at once.
#: Each chunk costs the GPU a few calls (join, hash, order, gather) and each worker a message per
#: peer: on one H200 shared by two workers, 8 GiB in 64 partitions shuffled in 0.22-0.23 s with
#: 2 GiB chunks against 0.62-0.65 s with 512 MiB ones (and 0.59-0.60 s with 512 MiB chunks and
#: four times the bytes in flight: the chunks, not the wire, were the cost).
SHUFFLE_CHUNK = "2GiB"


def positions(starts: Any, lengths: Any) -> cupy.ndarray:
    """The row positions of the segments ``starts[s] .. starts[s] + lengths[s]`` (NumPy or
    CuPy arrays), one after another, made on the GPU by libcudf (see :func:`group_order`)."""
    if not len(lengths):
        return cupy.empty(0, dtype=cupy.int64)
    lengths = _int64(lengths)
    sum_ = plc.aggregation.sum()
    placed = plc.reduce.scan(lengths, sum_, plc.reduce.ScanType.EXCLUSIVE)  # in the result
    (offset_of_row,) = _per_row([_binop(_int64(starts), placed, _SUB)], lengths)
    total = plc.reduce.reduce(lengths, sum_, _INT64).to_py()
    return _cupy(_binop(_rows(total), offset_of_row, _ADD))


_INT64 = plc.DataType(plc.TypeId.INT64)
_UINT64 = plc.DataType(plc.TypeId.UINT64)
_ADD, _SUB, _MUL, _SHL, _SHR, _OR = (
    getattr(plc.binaryop.BinaryOperator, op)
    for op in ("ADD", "SUB", "MUL", "SHIFT_LEFT", "SHIFT_RIGHT_UNSIGNED", "BITWISE_OR")
)


def _int64(values: Any) -> plc.Column:
    """NumPy or CuPy integers as an int64 column: a copy on the GPU of NumPy's, a view of
    CuPy's."""
    xp = cupy if isinstance(values, cupy.ndarray) else np
    return plc.Column.from_array(xp.ascontiguousarray(values, dtype=xp.int64))


def _uint64(values: np.ndarray) -> plc.Column:
    """NumPy integers as a uint64 column on the GPU."""
    return plc.Column.from_array(np.ascontiguousarray(values, dtype=np.uint64))


def _uint64_scalar(value: int) -> plc.Scalar:
    return plc.Scalar.from_py(value, _UINT64)


def _binop(
    left: plc.Column, right: plc.Column | plc.Scalar, op: Any, to: plc.DataType = _INT64
) -> plc.Column:
    return plc.binaryop.binary_operation(left, right, op, to)


def _rows(n: int) -> plc.Column:
    """0, 1, ..., n - 1 as an int64 column."""
    return plc.filling.sequence(n, plc.Scalar.from_py(0, _INT64), plc.Scalar.from_py(1, _INT64))


def _per_row(columns: list[plc.Column], lengths: plc.Column) -> list[plc.Column]:
    """Each value of ``columns`` repeated ``lengths`` times: a segment's value for each of its
    rows."""
    return plc.filling.repeat(plc.Table(columns), lengths).columns()


def _cupy(column: plc.Column) -> cupy.ndarray:
    """A pylibcudf column as a CuPy array (a view, through cuDF: the column itself has no
    array interface)."""
    import cudf

    return cudf.Series.from_pylibcudf(column).values


def memory_bytes(worker: Worker) -> int:
    """The memory that received shuffle pieces may use a fraction of: this GPU's."""
    return _total_memory(cupy.cuda.runtime.getDevice())


@functools.cache
def _total_memory(device: int) -> int:
    """A GPU's memory, asked of the driver once: it never changes, and every read's survey and
    every shuffle's plan ask for it (``cudaMemGetInfo``, a driver call, each time before)."""
    return cupy.cuda.Device(device).mem_info[1]


def _native(data: cupy.ndarray, dtype: np.dtype) -> cupy.ndarray:
    """Bytes of ``dtype`` values as native-order values: CuPy has no big-endian arrays."""
    if dtype.isnative:
        return data.view(dtype)
    width = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize  # swap each part
    swapped = cupy.ascontiguousarray(data.reshape(-1, width)[:, ::-1]).reshape(-1)
    return swapped.view(dtype.newbyteorder("="))


def configure_kvikio(options: dict[str, Any]) -> str:
    """Set kvikio's threads, task size and compat mode; return the route reads will take.

    libcudf configures kvikio once per process, on its first read, from the KVIKIO_* env vars;
    running that setup first keeps a later cuDF read from undoing ours.
    """
    plc.utils._set_up_kvikio(options["threads"])
    kvikio.defaults.set(
        {
            "num_threads": options["threads"],
            "task_size": options["task_size"],
            "compat_mode": kvikio.CompatMode[options["compat_mode"]],
        }
    )
    return "kvikio-compat" if kvikio.defaults.is_compat_mode_preferred() else "gds"


def configure_remote(settings: remote.Settings) -> None:
    """kvikio's HTTP client with ``gpudirect.remote.*``'s retries and timeout (it backs off by
    itself between attempts, on 429 and 5xx)."""
    kvikio.defaults.set(
        {"http_max_attempts": settings.retries + 1, "http_timeout": max(int(settings.timeout), 1)}
    )


def remote_file(obj: remote.Object) -> kvikio.RemoteFile:
    """A kvikio handle on the opened remote object ``obj`` (its size already known): S3 with
    its store's credentials and endpoint (path-style, as S3-compatible servers take it), or
    plain HTTP(S)."""
    store = obj.store
    if remote.scheme(obj.path) != "s3":
        return kvikio.RemoteFile.open_http(obj.path, obj.size)
    bucket, _, key = remote.s3_path(obj.path).partition("/")
    if store.anonymous:
        return kvikio.RemoteFile.open_s3_public(obj.path, obj.size)
    access, secret, token = store.credentials()
    return kvikio.RemoteFile.open_s3(
        bucket,
        key,
        obj.size,
        aws_region_name=store.region_name() or "us-east-1",
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        aws_endpoint_url=store.endpoint(),
        aws_session_token=token,
    )


def _check_same_file(file: Opened, fd: int) -> None:
    """Raise unless ``fd`` is open on the same inode as ``file`` (kvikio's own open)."""
    mine, theirs = file.stat, os.fstat(fd)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise InputError(file.path, "was replaced while it was opened")


class DeviceTarget(Target):
    name = "device"

    def __init__(self, options: dict[str, Any], ledger: Ledger):
        super().__init__(options, ledger)
        self.route = configure_kvikio(options)
        configure_remote(remote.Settings.current())
        self._pool: ThreadPoolExecutor | None = None

    def _allocate(self, size: int, scratch: bool = False) -> tuple[rmm.DeviceBuffer, cupy.ndarray]:
        buffer = rmm.DeviceBuffer(size=size)
        return buffer, cupy.asarray(buffer)

    def _start_read(
        self,
        shard: Shard,
        file: Opened,
        view: cupy.ndarray,
        stack: contextlib.ExitStack,
        alone: bool = False,
    ) -> list[Callable[[], int]]:
        """``kvikio.CuFile.pread`` of each range: kvikio cuts it into tasks of its task size on
        its threads."""
        # kvikio opens by name: the descriptor's own name opens the very file we checked
        f = stack.enter_context(kvikio.CuFile(file.same_file_path, "r"))
        _check_same_file(file, f.fileno())
        return [f.pread(view[at : at + n], n, o).get for o, at, n in shard.layout.pieces()]

    def _read_object(self, shard: Shard, obj: remote.Object) -> tuple[rmm.DeviceBuffer, int]:
        """``shard``'s ranges straight into GPU memory by ``kvikio.RemoteFile``: parallel range
        requests on kvikio's threads, in its task size."""
        buffer = rmm.DeviceBuffer(size=shard.nbytes)
        view = cupy.asarray(buffer)
        try:
            with remote_file(obj) as f:
                futures = [f.pread(view[at : at + n], n, o) for o, at, n in shard.layout.pieces()]
                nread = sum(fut.get() for fut in futures)
        except RuntimeError as exc:  # kvikio's HTTP errors (status, connection) from C++
            raise remote.error(shard.path, exc, obj.store) from None
        return buffer, nread

    def decode_run(self, shards: Sequence[Shard]) -> cudf.DataFrame:
        """libcudf reads and decodes the run in one call (one call per small file costs about
        10 ms, most of its time), from the descriptors this target opened and checked: only
        the column chunks it needs, through the kvikio this target set up, so the bytes take
        this target's route, and no buffer of a whole file. The ledger gives each shard its
        share of a call's time by bytes."""
        if remote.is_remote(shards[0].path):  # each shard's ranges into GPU memory
            return self._read_remote_parquet(shards)
        return self._read_together(shards)

    def _read_together(self, shards: Sequence[Shard]) -> cudf.DataFrame:
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(self.checked(shard)) for shard in shards]
            frame = _decode_run(shards, [file.same_file_path for file in files])
        self.record_shares(shards, time.perf_counter() - start)
        return frame

    def _read_remote_parquet(self, shards: Sequence[Shard]) -> cudf.DataFrame:
        """Remote shards, each read into a device buffer of its ranges alone, all at once,
        then decoded by libcudf (:func:`_decode_packed`), each buffer let go once decoded."""
        return _decode_run(shards, list(self._remote_pool().map(self.read, shards)))

    def _remote_pool(self) -> ThreadPoolExecutor:
        """Threads that fetch a partition's remote shards side by side: each shard's open
        and version checks are requests that would otherwise wait on one another."""
        if self._pool is None:
            connections = remote.Settings.current().connections
            self._pool = ThreadPoolExecutor(connections, thread_name_prefix="gpudirect-remote")
        return self._pool

    def _release(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def as_array(
        self, buffer: rmm.DeviceBuffer, dtype: np.dtype, shape: tuple[int, ...], order: Order
    ) -> cupy.ndarray:
        return _native(cupy.asarray(buffer), dtype).reshape(shape, order=order)


TARGET = DeviceTarget
