"""Host target: a thread pool of ``os.preadv`` into NumPy; pyarrow decodes Parquet."""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from dask.dataframe.dispatch import concat
from dask.dataframe.io.parquet.arrow import ArrowDatasetEngine

from .. import remote
from ..compat import PYARROW_DEFAULTS, Conversion
from ..errors import InputError
from ..formats.parquet import MAGIC, TAIL
from ..shards import decoding
from . import Order, Target

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable, Sequence

    from distributed import Worker

    from ..access import Opened
    from ..ledger import Ledger
    from ..shards import Shard


def _to_pandas(
    table: pa.Table, conversion: Conversion = PYARROW_DEFAULTS, categorical: tuple[str, ...] = ()
) -> pd.DataFrame:
    """``table`` as pandas with the types pandas stored (``Int64``...) but not its index: the
    reader sets the index itself, by Dask's rules, on both targets. ``conversion``: the types
    ``dd.read_parquet`` would give (Dask's own ``types_mapper``, so the two agree).
    ``categorical``: the columns that become categories, made so by pyarrow as Dask's read makes
    them (``to_pandas(categories=...)``, in the order their values first appear): a pandas
    categorical of integers, which pyarrow stores as plain integers, keeps integer categories
    where a file holds nulls (cast after the conversion, its float64 values gave float64
    categories, which no other file's integer ones joined: "dtype of categories must be the
    same")."""
    stored = table.schema.pandas_metadata
    if stored:
        # an unnamed index's column keeps its field name (``__index_level_0__``), not None;
        # the columns keep their field names too, not the labels pandas' ``column_indexes``
        # makes of them (``0``, ``1``... of ``pd.DataFrame(array)``: the reader selects
        # columns by field name, and an index alone made pyarrow cast its name to int)
        columns = [
            {**c, "name": c["field_name"]} if c.get("name") is None else c
            for c in stored.get("columns", [])
        ]
        kept = {**stored, "index_columns": [], "columns": columns, "column_indexes": []}
        unindexed = json.dumps(kept).encode()
        table = table.replace_schema_metadata({**table.schema.metadata, b"pandas": unindexed})
    mapper = ArrowDatasetEngine._determine_type_mapper(
        dtype_backend=conversion.dtype_backend, convert_string=conversion.pyarrow_strings
    )
    # (pandas' nullable integers hold nulls as they are, and pyarrow makes no categories of
    # them: NotImplementedError, where Dask's read fails so)
    nullable = conversion.dtype_backend is not None
    categories = [c for c in categorical if c in table.column_names and not nullable]
    frame = table.to_pandas(types_mapper=mapper, categories=categories or None)
    dictionaries = [f for f in table.schema if pa.types.is_dictionary(f.type)]
    for field in dictionaries if frame.columns.is_unique else ():
        column = frame.get(field.name)
        if column is None or not isinstance(column.dtype, pd.CategoricalDtype):
            continue  # pyarrow-backed, or an index's
        if not len(column.cat.categories):  # a dictionary of nulls alone: categories typed as
            # pyarrow types those of any other (as objects, they could not be concatenated)
            typed = pd.Index(pa.array([], field.type.value_type).to_pandas())
            frame[field.name] = column.cat.set_categories(typed)
    return frame


def concat_frames(
    frames: list[pd.DataFrame], meta: pd.DataFrame, index: bool = True
) -> pd.DataFrame:
    """``frames`` end to end (Dask's concat: categories unioned, as the device target's),
    labelled 0, 1, 2... without ``index``."""
    joined = concat(frames, ignore_index=not index) if len(frames) > 1 else frames[0]
    # Dask's pandas concat keeps the frames' labels whatever ``ignore_index`` says
    return joined if index else _relabelled(joined)


def concat_slices(
    frames: list[pd.DataFrame],
    slices: list[tuple[int, int, int]],
    meta: pd.DataFrame,
    index: bool = True,
) -> pd.DataFrame:
    """Rows ``start:stop`` of ``frames[k]`` for each ``(k, start, stop)`` of ``slices``, end to
    end, in one copy."""
    return concat_frames([frames[k].iloc[a:b] for k, a, b in slices], meta, index)


def concat_owned(
    frames: list[pd.DataFrame],
    slices: list[tuple[int, int, int]],
    meta: pd.DataFrame,
    index: bool = True,
) -> pd.DataFrame:
    """:func:`concat_slices` in memory of its own: one slice is a view of its frame, and
    pandas' concat of several chunks their Arrow arrays (strings, ``str`` among them) and
    copies none, so an output built so held every piece it had rows of, and its spill freed
    none of them while its neighbours lived (see :func:`cut_frame`)."""
    rows = concat_slices(frames, slices, meta, index)
    if len(slices) == 1:
        return copied(rows)
    # the index chunked too where it is Arrow's (a NumPy one was copied)
    return _taken(rows, _arrow_columns(rows), _arrow_index(rows.index))


def take_rows(frame: pd.DataFrame, order: np.ndarray, index: bool = True) -> pd.DataFrame:
    """Rows ``order`` of ``frame``, labelled 0, 1, 2... without ``index``."""
    taken = frame.take(order)
    return taken if index else _relabelled(taken)


def cut_frame(frame: pd.DataFrame, bounds: np.ndarray, index: bool = True) -> list[pd.DataFrame]:
    """``frame``'s rows ``bounds[k]:bounds[k + 1]`` as frames of their own memory: a worker
    counts each output's bytes and spills outputs one by one, and a view's spill would free
    nothing while its neighbours live (a copy costs pandas what a gather does). Each is
    labelled 0, 1, 2... without ``index``.

    Where the slices are small, each dtype's columns are joined into one block first, once: a
    concatenated or gathered frame keeps a block per input block, and pandas' copy of a slice
    joins them again for every slice (512 slices of 20,000 rows: 11.5 ms against 22.1 on the
    2-core CPU; of 4 M rows 32.5 against 41.6 ms). Large slices are joined faster one by one
    (4 slices of 4 M rows: 12.6 against 23.1 ms; 128 slices cost the same either way)."""
    if len(frame) < SMALL_SLICE_ROWS * (len(bounds) - 1):
        # no copy where the blocks are joined already (pandas-stubs take it for a column)
        frame = frame._consolidate()  # type: ignore[operator]
    arrow = _arrow_columns(frame)
    parts = [copied(frame.iloc[a:b], arrow) for a, b in itertools.pairwise(bounds)]
    return parts if index else [_relabelled(part) for part in parts]


def _arrow_index(index: pd.Index) -> bool:
    """Whether ``index`` keeps its labels in an Arrow array (a MultiIndex keeps codes)."""
    return not isinstance(index, pd.MultiIndex) and isinstance(
        index.array, pd.arrays.ArrowExtensionArray
    )


def _arrow_columns(frame: pd.DataFrame) -> list[int]:
    """The columns that keep their values in Arrow buffers (pandas' ``str`` among them)."""
    arrays = (frame.iloc[:, i].array for i in range(frame.shape[1]))
    return [i for i, array in enumerate(arrays) if isinstance(array, pd.arrays.ArrowExtensionArray)]


def copied(part: pd.DataFrame, arrow: list[int] | None = None) -> pd.DataFrame:
    """``part`` in memory of its own: pandas' copy shares an Arrow column's buffers (they
    cannot change), so one output of a cut frame kept all of its strings; a take copies.
    ``arrow``: :func:`_arrow_columns` of ``part``, where the caller has them."""
    arrow = _arrow_columns(part) if arrow is None else arrow
    part = part.copy()
    # a copy's index is a view of the slice's
    return _taken(part, arrow, not isinstance(part.index, pd.RangeIndex))


def _taken(part: pd.DataFrame, arrow: list[int], index: bool) -> pd.DataFrame:
    """``part`` with its ``arrow`` columns, and its index where ``index``, copied by a take of
    every row (``take`` of an index returns a view for all positions; ``index[positions]``
    copies)."""
    if arrow or index:
        positions = np.arange(len(part))
        if index:
            part.index = part.index[positions]
        for i in arrow:
            part.isetitem(i, part.iloc[:, i].array.take(positions))
    return part


#: Whether :func:`cut_frame`'s outputs are copies (the device's share the frame's memory).
CUT_COPIES = True

#: Rows per slice below which :func:`cut_frame` joins a frame's blocks before slicing it.
SMALL_SLICE_ROWS = 1 << 15


def _relabelled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` labelled 0, 1, 2... (its columns not copied: pandas copies on write)."""
    return frame.set_axis(pd.RangeIndex(len(frame)), axis=0)


def empty_frame(table: pa.Table, conversion: Conversion = PYARROW_DEFAULTS) -> pd.DataFrame:
    """The pandas partition type for ``table``'s schema (a collection's ``meta``)."""
    return _to_pandas(table, conversion)


def with_range_index(
    frame: pd.DataFrame, ranges: list[tuple[int, int, int]], name: str | None
) -> pd.DataFrame:
    """``frame`` labelled as the RangeIndex pandas stored: ``(first, step, rows)`` per shard of
    its rows, end to end (one RangeIndex where one shard, its labels joined where more)."""
    if len(ranges) == 1:
        first, step, _ = ranges[0]
        frame.index = pd.RangeIndex(first, first + step * len(frame), step, name=name)
    else:
        labels = [np.arange(first, first + step * n, step) for first, step, n in ranges]
        frame.index = pd.Index(np.concatenate(labels), name=name)
    return frame


@functools.lru_cache(maxsize=16)
def category_type(categories: tuple, integer: bool) -> pd.CategoricalDtype:
    """A hive partition column's type: its values as categories (int32 or strings), as Dask.
    Made once per read, not once per file: a read of many folders has as many categories."""
    return pd.CategoricalDtype(pd.Index(list(categories), dtype="int32" if integer else "str"))


def categories_of(series: pd.Series) -> pd.Index:
    """A categorical ``series``' categories, as pandas holds them."""
    return series.cat.categories


def as_categories(categories: pd.Index) -> pd.Index:
    """Categories (a pandas Index) as this target's ``set_categories`` takes them."""
    return categories


@functools.lru_cache(maxsize=16)
def _codes_of(categories: tuple) -> dict[Any, int]:
    return {value: code for code, value in enumerate(categories)}


def with_partition_column(
    frame: pd.DataFrame, name: str, values: list, rows: list[int], categories: tuple, integer: bool
) -> pd.DataFrame:
    """``frame`` with the hive column ``name``: each file's value (None: null) on its ``rows``,
    end to end, typed by :func:`category_type`. Made of codes looked up once per file, where a
    cast of the values hashes them against every category (a read of many folders has as
    many), and so once per file cost time that grew with the square of the folders."""
    codes = _codes_of(categories)
    per_file = np.array([-1 if v is None else codes[v] for v in values], dtype=np.int32)
    dtype = category_type(categories, integer)
    frame[name] = pd.Categorical.from_codes(np.repeat(per_file, rows), dtype=dtype)
    return frame


def kept_categories(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``frame``, filtered, with the categories of ``columns`` (categorical by pandas' note
    alone, made so before the filters) those of its rows, in the order they first appear: as
    Dask's read makes them, of the rows its filters kept."""
    for column in columns:
        series = frame[column]
        if isinstance(series.dtype, pd.CategoricalDtype):
            codes = series.cat.codes.to_numpy()
            kept = series.cat.categories.take(pd.unique(codes[codes >= 0]))
            frame[column] = series.cat.set_categories(kept)
    return frame


def with_nulls(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``columns`` in the type pandas gives a column holding nulls (integers as float64,
    booleans as object), so that every partition and ``meta`` agree when only some files
    hold nulls. Extension types (``Int64``...) hold nulls as they are."""
    for column in columns:
        dtype = frame[column].dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "iu":
            _check_exact(column, frame[column].to_numpy())
            frame[column] = frame[column].astype("float64")
        elif isinstance(dtype, np.dtype) and dtype.kind == "b":
            frame[column] = frame[column].astype(object)
    return frame


def _check_exact(column: str, values: np.ndarray) -> None:
    """Refuse integers that float64 would round (beyond 2**53), rather than change them."""
    large = values[(values > 2**53) | (values < -(2**53))] if values.dtype.itemsize == 8 else ()
    inexact = next((int(v) for v in large if int(float(v)) != int(v)), None)
    if inexact is not None:
        raise InputError(
            None,
            f"column {column!r} holds {inexact}, which float64 cannot hold exactly: an integer "
            "column that may hold nulls (a file's statistics count some, or have no null count "
            "to rule them out) is float64 in pandas; read it with "
            "dtype_backend='numpy_nullable' to keep its integers",
        )


def empty_array(dtype: np.dtype, ndim: int) -> np.ndarray:
    return np.empty((0,) * ndim, dtype=dtype)


def unsupported(dtype: np.dtype) -> str | None:
    """NumPy holds every fixed-size dtype."""
    return None


def permutations(lengths: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Row positions that put each run of ``lengths[k]`` rows (the runs end to end) in a random
    order drawn from ``seeds[k]`` alone, each run kept in its place."""
    starts = np.cumsum(lengths) - lengths
    runs = [
        start + np.random.default_rng(int(seed)).permutation(int(n))
        for start, n, seed in zip(starts, lengths, seeds, strict=True)
    ]
    return np.concatenate(runs) if runs else np.empty(0, dtype=np.int64)


#: No cut in no set order (the device target's ``hash_partition``): pandas has no faster cut
#: than the ordered split, which the host target keeps.
hash_partition = None


def group_order(where: Any, lengths: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The row order that groups equal values of ``where`` (0..n-1), stably, and how many rows
    of the ``k``-th run of ``lengths`` rows hold ``j``, for each ``(j, k)`` that has any: rows
    ``(j, k, rows)``, in the order's (the shuffle's ``Cells``). Work and memory follow the
    rows: a table of every ``(j, k)`` is counted only where it has at most a cell a row (it
    took 256 MiB at 4,096 inputs and 8,192 outputs); past that, ``key = value * inputs +
    input`` rises along the order, and its runs are the counts (a gather more: 4 M rows in 8
    outputs took 96 ms against the table's 73)."""
    inputs = len(lengths)
    values = np.asarray(where, dtype=np.int64)
    # NumPy's stable sort of 16-bit integers is a radix sort: linear in the rows, where a
    # merge sort of int64 is n log n and most of a split's time.
    order = np.argsort(values.astype(np.uint16) if n <= 1 << 16 else values, kind="stable")
    source = np.repeat(np.arange(inputs, dtype=np.int64), lengths)
    if inputs * n <= len(values):  # counted input by input: the rows' order, 2 x faster
        table = np.bincount(source * n + values, minlength=inputs * n).reshape(inputs, n)
        counts = np.ascontiguousarray(table.T).ravel()  # by output, then input
        j, k = np.divmod(cells := np.flatnonzero(counts), inputs)
        return order, np.stack([j, k, counts[cells]])
    key = (values * inputs + source)[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1))
    j, k = np.divmod(key[starts], inputs)
    return order, np.stack([j, k, np.diff(starts, append=len(key))])


#: ``gpudirect.shuffle.chunk-size: auto`` here: bytes of inputs a shuffle stage splits at once
#: (the host's size before ``auto``, which the CPU runs of issue 14 used).
SHUFFLE_CHUNK = "512MiB"


def positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The row positions of the segments ``starts[s] .. starts[s] + lengths[s]``, one after
    another: one vectorised pass, however many segments."""
    lengths = np.asarray(lengths, dtype=np.int64)
    placed = np.cumsum(lengths) - lengths  # where each segment starts in the result
    offsets = np.asarray(starts, dtype=np.int64) - placed
    return np.repeat(offsets, lengths) + np.arange(lengths.sum(), dtype=np.int64)


def memory_bytes(worker: Worker) -> int:
    """The memory that received shuffle pieces may use a fraction of: the worker's limit."""
    import psutil

    return worker.memory_manager.memory_limit or psutil.virtual_memory().total


def _pread_into(fd: int, box: list[memoryview], offset: int) -> int:
    """Fill the view in ``box`` from ``offset``, looping over short reads; stop early only at
    end of file. The view is taken out of ``box``: the pool's work item holds its arguments
    until its thread comes back to it, after the caller has its result, so a view passed as
    an argument kept the shard's buffer alive past its decoding."""
    view = box.pop()
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


class HostTarget(Target):
    name = "host"
    route = "posix-host"

    def __init__(self, options: dict[str, Any], ledger: Ledger):
        super().__init__(options, ledger)
        self.task_size = options["task_size"]
        self.pool = ThreadPoolExecutor(options["threads"], thread_name_prefix="gpudirect-read")
        self._remote_pool: ThreadPoolExecutor | None = None

    def _read_object(self, shard: Shard, obj: remote.Object) -> tuple[np.ndarray, int]:
        """Range requests of ``gpudirect.remote.range-size``, ``connections`` at once, into
        one NumPy buffer."""
        settings = remote.Settings.current()
        if self._remote_pool is None:
            self._remote_pool = ThreadPoolExecutor(
                settings.connections, thread_name_prefix="gpudirect-remote"
            )
        buffer = np.empty(shard.nbytes, dtype=np.uint8)
        futures = [
            (at, self._remote_pool.submit(obj.pread, n, o))
            for o, at, n in shard.layout.pieces(settings.range_size)
        ]
        nread = 0
        for at, future in futures:
            data = future.result()
            buffer[at : at + len(data)] = np.frombuffer(data, np.uint8)
            nread += len(data)
        return buffer, nread

    def _allocate(self, size: int, scratch: bool = False) -> tuple[np.ndarray, memoryview]:
        """A NumPy buffer; a ``scratch`` one (a Parquet shard's bytes, let go once decoded) in
        pyarrow's memory pool, where pyarrow's own reads and the decoded tables lie, which
        reuses freed pages: a fresh NumPy buffer a shard, mapped anew by malloc in the worker,
        faulted in every page as it was read (6,000 page faults a partition of 128 files of
        187 KB: 158-175 ms against 144-146; 1,400 of 2 files of 15 MB: 49 against 44 ms,
        pyarrow's own read of the files 45 ms, on the 2-core CPU)."""
        if scratch:
            buffer = np.frombuffer(pa.allocate_buffer(size), dtype=np.uint8)
        else:
            buffer = np.empty(size, dtype=np.uint8)
        return buffer, buffer.data

    def _start_read(
        self,
        shard: Shard,
        file: Opened,
        view: memoryview,
        stack: contextlib.ExitStack,
        alone: bool = False,
    ) -> list[Callable[[], int]]:
        """Reads of ``task_size`` bytes on this target's threads; one read ``alone`` (a small
        Parquet shard, decoded one at a time) in the caller's thread when its call is made,
        which gains nothing from the threads but their hand-offs (128 files of 187 KB in a
        partition: 143 against 132 ms, on the 2-core CPU)."""
        pieces = shard.layout.pieces(self.task_size)
        if alone and len(pieces) == 1:
            ((offset, at, n),) = pieces
            return [functools.partial(_pread_into, file.fd, [view[at : at + n]], offset)]
        return [
            self.pool.submit(_pread_into, file.fd, [view[at : at + n]], o).result
            for o, at, n in pieces
        ]

    def decode_run(self, shards: Sequence[Shard]) -> pd.DataFrame:
        """Each shard read into a buffer of its own and decoded by pyarrow; the run's tables
        joined and made one pandas frame, as the device target decodes a run in one call: a
        conversion and a finish per file cost about 2 ms, most of a small file's read."""
        tables = []
        for shard in shards:
            buffer = self.read(shard, scratch=True)
            part = shard.part
            with decoding(shard):
                packed = PackedFile(buffer, shard)
                file = pq.ParquetFile(pa.PythonFile(packed, mode="r"), metadata=packed.footer())
                table = _cast(_read_row_groups(file, part), part.casts)
                tables.append(table if part.pandas is None else _with_pandas(table, part.pandas))
            # the raw bytes are not held through the next shard's read and the conversion to
            # pandas (a row group of 1 GB peaked 30 % above Dask's read): the table owns its own
            del file, packed, buffer
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        # a value pandas cannot hold (a time64[ns] with nanoseconds as datetime.time) names the
        # run's files, as a decode error does
        with decoding(*shards):
            return _to_pandas(table, shards[0].part.conversion, shards[0].part.categorical)

    def as_array(
        self, buffer: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], order: Order
    ) -> np.ndarray:
        return buffer.view(dtype).reshape(shape, order=order)

    def _release(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._remote_pool is not None:
            self._remote_pool.shutdown(wait=False, cancel_futures=True)


class PackedFile(io.RawIOBase):
    """A Parquet file as pyarrow reads it, from a shard's buffer: its ranges alone, end to
    end (``Shard.layout``), where a buffer of the whole file cost its size in memory for
    each shard (a file larger than memory could not be read). Reading a byte outside them
    is an error: the plan missed a range."""

    def __init__(self, buffer: np.ndarray, shard: Shard):
        self.buffer = buffer.data
        self.layout = shard.layout
        offset, length = shard.ranges[-1]
        self.end = offset + length  # a Parquet shard reads the file's footer, to its end
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        start = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.end}[whence]
        self.position = start + offset
        return self.position

    def footer(self) -> pq.FileMetaData:
        """The file's footer, parsed from the buffer's last bytes: pyarrow's own first read
        of a file takes its last 64 KiB at once, whatever the footer's size."""
        tail = self.buffer[len(self.buffer) - TAIL :]
        length = int.from_bytes(tail[:4], "little")
        footer = self.buffer[len(self.buffer) - TAIL - length :]
        return pq.read_metadata(pa.BufferReader(MAGIC + bytes(footer)))

    def read(self, size: int = -1) -> memoryview:
        size = self.end - self.position if size < 0 else min(size, self.end - self.position)
        at = self.layout.at(self.position, size)
        self.position += size
        return self.buffer[at : at + size]


def _read_row_groups(file: pq.ParquetFile, part: Any) -> pa.Table:
    """``part``'s row groups and columns of ``file``, the leaf columns under each read column
    chosen as the plan chose their chunks: by name, pyarrow takes a column ``"a.b"`` for the
    field ``b`` of a struct ``a`` too, whose bytes the shard did not read."""
    leaves: dict[str, list[int]] = {}
    for i, path in enumerate(file.reader.column_paths):
        leaves.setdefault(path[0], []).append(i)
    indices = [i for name in part.read_columns for i in leaves.get(name, [])]
    return file.reader.read_row_groups(list(part.row_groups), column_indices=indices)


def _cast(table: pa.Table, casts: tuple[tuple[str, pa.DataType], ...]) -> pa.Table:
    """``table`` with the columns a file stores in other types than the read gives them
    (``ParquetPart.casts``) cast to those, safely: a value the type cannot hold fails."""
    for name, kind in casts:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.field(i).with_type(kind), table.column(i).cast(kind))
    return table


def _with_pandas(table: pa.Table, pandas: bytes) -> pa.Table:
    """``table`` converting by the pandas metadata ``pandas`` (none where empty): the dtypes
    the read's first file stored, which meta has (``ParquetPart.pandas``)."""
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"pandas"}
    return table.replace_schema_metadata({**metadata, **({b"pandas": pandas} if pandas else {})})


TARGET = HostTarget
