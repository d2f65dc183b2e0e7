"""Parquet: plan shards from footers (projection, statistics pruning), decode on the target.

A shard is a run of row groups of one file of about ``blocksize`` projected bytes. It reads only
the column chunks it needs plus the file's head and tail (magic, page indexes, footer), each at
its own offset in a buffer of the file's size, so pyarrow and libcudf decode it as the file.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from dask.dataframe.utils import clear_known_categories

from .. import filters as dnf
from .. import remote, stamps
from ..access import pread_exact
from ..compat import PYARROW_DEFAULTS, Conversion, pandas_types
from ..errors import InputError
from ..shards import Shard, coalesce
from . import hive

if TYPE_CHECKING:
    from ..targets import Frame

#: Ranges closer than this are read as one: fewer, larger reads beat skipping small gaps.
MERGE_GAP = 64 * 1024
#: Column chunks a shard lists at most for a selection after the read to narrow its ranges
#: (:func:`projected`): every read task carries them. A shard of more (a file of many columns
#: or row groups) finds them in its file's footer, read again on the worker that reads it.
MAX_CHUNKS = 1024


@dataclasses.dataclass(frozen=True)
class ParquetPart:
    """Row groups of one file, the columns to read, and the row filter to apply after decoding."""

    row_groups: tuple[int, ...]
    read_columns: tuple[str, ...]
    columns: tuple[str, ...]
    filters: Any = None
    categorical: tuple[str, ...] = ()  # dictionary-encoded in the schema
    # those of them categorical by pandas' note alone (stored as plain values): Dask makes
    # their categories of the rows its filters keep (see _dictionary_columns)
    noted: tuple[str, ...] = ()
    halves: tuple[str, ...] = ()  # float16 in the schema: libcudf decodes them as their bytes
    # Integer and boolean columns that may hold nulls: in this file's row groups when planned,
    # in any planned file's once the plan is unified (ParquetPlan.unified)
    nulls: tuple[str, ...] = ()
    # Set where the filters rule out every row group: the shard reads the footer only, to
    # check the file is still the one planned, and gives no rows of this (output) schema.
    empty: pa.Schema | None = None
    index: str | None = None  # the column (one of ``columns``) every partition is indexed by
    # the index column's (smallest, largest) value in these row groups, from the footer's
    # statistics (None where one lacks them): what calculate_divisions builds divisions of
    index_range: tuple[Any, Any] | None = None
    # (first value, step, name) of the RangeIndex pandas stored as metadata, at the first row
    # of these row groups: the index is rebuilt before filtering, so kept rows keep their labels
    range_index: tuple[int, int, str | None] | None = None
    # hive partition columns: this file's (name, value) and every one's (name, categories, int?)
    partition: tuple[tuple[str, Any], ...] = ()
    partition_types: tuple[tuple[str, tuple, bool], ...] = ()
    conversion: Conversion = PYARROW_DEFAULTS  # Arrow to pandas, for pandas partitions
    # (column, type) of the read columns this file stores in another type than the read gives
    # them (files that differ, promoted: ParquetPlan.joined): cast to it after decoding
    casts: tuple[tuple[str, pa.DataType], ...] = ()
    # pandas' metadata to convert this file's rows by (the first file's), where the dtypes it
    # stored differ from it (b"": none; None: the file's own): ParquetPlan.joined
    pandas: bytes | None = None
    rows: int = 0  # in these row groups, as the footer says: what a read of them must give
    # about the read columns' bytes in memory, from the footer (:attr:`_Footer.row_groups`): the
    # bytes read are compressed and encoded
    decoded: int = 0
    layout: tuple = ()  # the file's columns as its footer lays them out (:func:`_layout`)
    # each read column chunk of these row groups: (top-level column, offset, bytes, decoded
    # bytes); and the file's header and footer ranges: what a projection reads (:func:`projected`)
    chunks: tuple[tuple[str, int, int, int], ...] = ()
    frame: tuple[tuple[int, int], ...] = ()

    @property
    def indexed(self) -> bool:
        """Whether partitions carry an index of the data (joined ones keep it)."""
        return self.index is not None or self.range_index is not None

    def label(self) -> str:
        """The row groups: every Parquet shard's first byte range is the file's header."""
        if not self.row_groups:
            return "footer"
        first, last = self.row_groups[0], self.row_groups[-1]
        return f"rg{first}" if first == last else f"rg{first}-{last}"


#: Files one reader call takes at most: it opens each, and a worker's descriptors are few.
RUN_FILES = 256


def alike(a: ParquetPart, b: ParquetPart) -> bool:
    """Whether ``a`` and ``b`` may be decoded end to end in one libcudf call and finished as
    one: files laid out alike (libcudf refuses others: "All sources must have the same
    schema"), the same filters, and both with or both without a stored RangeIndex. Their
    hive folders may differ: each file's values go on its own rows (one libcudf call per
    folder cost about 10 ms a small file)."""
    return (
        a.empty is None
        and b.empty is None
        and a.layout == b.layout
        and a.filters == b.filters
        and a.casts == b.casts
        and (a.range_index is None) == (b.range_index is None)
    )


def runs(shards: Sequence[Shard]) -> list[list[Shard]]:
    """``shards`` in runs that one reader call decodes and :func:`finish` handles at once
    (consecutive, alike, at most :data:`RUN_FILES`)."""
    grouped: list[list[Shard]] = []
    for shard in shards:
        last = grouped[-1] if grouped else None
        if last and len(last) < RUN_FILES and alike(last[0].part, shard.part):
            last.append(shard)
        else:
            grouped.append([shard])
    return grouped


def finish(parts: Sequence[ParquetPart], helpers: ModuleType, frame: Frame | None) -> Frame:
    """The rows decoded from a run of alike ``parts`` (``frame``; None for a footer-only shard)
    as a partition gives them: filtered, with the files' partition values and index, in the
    types of ``meta``. ``helpers``: the target's module."""
    part = parts[0]
    if part.empty is not None:
        frame = helpers.empty_frame(part.empty.empty_table(), part.conversion)
    else:
        if part.range_index is not None:  # each shard's labels, end to end
            ranges = [(r[0], r[1], p.rows) for p in parts if (r := p.range_index) is not None]
            frame = helpers.with_range_index(frame, ranges, part.range_index[2])
        rows = [p.rows for p in parts]
        for name, categories, integer in part.partition_types:  # each file's folders' values
            values = [dict(p.partition)[name] for p in parts]
            frame = helpers.with_partition_column(frame, name, values, rows, categories, integer)
        # float16 columns the read gives as float16 (the device decodes them as float32): the
        # host casts an 'in' list to float16 there, and so must the device
        halves = tuple(c for c in part.halves if c not in dict(part.casts))
        frame = dnf.apply(frame, part.filters, halves)
        if part.filters is not None:
            frame = helpers.kept_categories(frame, part.noted)
        frame = frame[list(part.columns)]
        if part.range_index is None:
            frame = frame.reset_index(drop=True)
    range_name = part.range_index[2] if part.range_index is not None else None
    return finished(
        frame, helpers, part.categorical, part.nulls, part.index, range_name, part.partition_types
    )


def finished(
    frame: Frame,
    helpers: ModuleType,
    categorical: tuple[str, ...],
    nulls: tuple[str, ...],
    index: str | None,
    range_name: str | None,
    partition_types: tuple = (),
) -> Frame:
    """A decoded frame, or ``meta``, as every partition is given: categories (a hive partition
    column's are every value of the read), the types of columns that may hold nulls, and its
    index (a column, or a stored RangeIndex's name)."""
    for name, categories, integer in partition_types:
        dtype = helpers.category_type(categories, integer)
        if name in frame.columns and frame[name].dtype != dtype:  # meta's, a footer-only shard's
            frame[name] = frame[name].astype(dtype)
    frame = helpers.with_nulls(categorize(frame, categorical), nulls)
    if range_name is not None:
        frame.index.name = range_name
    return indexed(frame, index)


#: The column Dask's ``to_parquet`` stores an unnamed index in (``dd.read_parquet`` unnames it).
DASK_UNNAMED_INDEX = "__null_dask_index__"


def indexed(frame: Frame, index: str | None) -> Frame:
    """``frame`` indexed by the column ``index``; unnamed where pandas or Dask stored an
    unnamed index (``__index_level_0__``, ``__null_dask_index__``)."""
    if index is None:
        return frame
    frame = frame.set_index(index)
    if _unnamed_index(index):
        frame.index.name = None
    return frame


def _unnamed_index(name: str) -> bool:
    """Whether ``name`` is where pandas or Dask stored an unnamed index."""
    return name.startswith("__index_level_") or name == DASK_UNNAMED_INDEX


def categorize(frame: Frame, columns: tuple[str, ...]) -> Frame:
    """Dictionary-encoded ``columns`` as categories: pyarrow decodes them so, libcudf does not."""
    for column in columns:
        if frame[column].dtype != "category":
            # unordered, as pyarrow gives them; cuDF leaves `ordered` unset, which breaks to_arrow
            frame[column] = frame[column].astype("category").cat.as_unordered()
    return frame


@dataclasses.dataclass(frozen=True)
class ParquetPlan:
    shards: list[Shard]
    schema: pa.Schema  # projected to the output columns
    file_schema: pa.Schema  # every planned file's, checked equal
    first: str  # the file the others were checked against
    nulls: tuple[str, ...] = ()  # columns that may hold nulls in some file (see unified)
    index: str | None = None  # the column the partitions are indexed by (one of ``schema``'s)
    range_name: str | None = None  # the name of a RangeIndex pandas stored as metadata
    partition_types: tuple[tuple[str, tuple, bool], ...] = ()  # hive columns (see ParquetPart)
    conversion: Conversion = PYARROW_DEFAULTS  # Arrow to pandas, for pandas partitions

    def meta(self, target_module: ModuleType) -> Frame:
        """An empty partition of the result on the target (the collection's ``meta``). A
        dictionary-encoded column's categories are each file's own, so unknown here, as in
        Dask's meta (``df.c.cat.known`` is False); a hive column's are every folder's value."""
        empty = target_module.empty_frame(self.schema.empty_table(), self.conversion)
        categorical = _dictionary_columns(self.schema, self.conversion)
        meta = finished(
            empty,
            target_module,
            categorical,
            self.nulls,
            self.index,
            self.range_name,
            self.partition_types,
        )
        folders = {name for name, _, _ in self.partition_types}
        unknown = [c for c in categorical if c in meta.columns and c not in folders]
        return clear_known_categories(meta, cols=unknown, index=False) if unknown else meta

    def unified(self) -> ParquetPlan:
        """The plan with one type per column in every partition: a column that may hold nulls
        in any file is given as such in all (pandas makes an integer column with nulls
        float64, one without int64)."""
        nulls = {c for s in self.shards for c in s.part.nulls}
        ordered = tuple(c for c in self.schema.names if c in nulls)
        shards = [  # a frozen dataclass's replace costs about 10 us: only where it changes
            s
            if s.part.nulls == ordered
            else dataclasses.replace(s, part=dataclasses.replace(s.part, nulls=ordered))
            for s in self.shards
        ]
        return dataclasses.replace(self, shards=shards, nulls=ordered)

    def check_against(self, head: ParquetPlan) -> None:
        """The same columns as ``head``'s file (types that read as one), and the same index:
        each file is planned alone, by the index pandas stored in it, and meta is the first
        file's (a file that stored none beside one that did lost its index column's values)."""
        _check_schema(self.first, self.file_schema, head.first, head.file_schema, promote=True)
        if (self.index, self.range_name) != (head.index, head.range_name):
            raise InputError(
                self.first,
                f"the index pandas stored differs from {head.first}'s ({_index_of(self)} here, "
                f"{_index_of(head)} there): choose one with index= (index=False for none)",
            )

    def joined(self, plans: Sequence[ParquetPlan]) -> ParquetPlan:
        """One plan of ``plans`` (this one first), every file's rows given the types of
        ``meta``. Where files store a column in different types, the read gives it the type
        pyarrow's permissive unify gives them (int32 and int64 as int64, int64 and double as
        double, the finest timestamp unit...), and each file stored otherwise casts its rows
        to it after decoding. Where pandas stored other dtypes for a file's columns than for
        the first file's (``Int64`` and ``int64``: one Arrow type), its rows convert by the
        first file's, as meta does (``ParquetPart.pandas``), and so are the columns pandas noted
        as categorical in the first file categories in every file's rows, and none other (as
        Dask reads them by the first file's note)."""
        others: list[pa.Schema] = []
        for plan in plans:
            if not any(plan.file_schema.equals(o) for o in [self.file_schema, *others]):
                others.append(plan.file_schema)
        unified = self.file_schema
        if others:
            unified = pa.unify_schemas([unified, *others], promote_options="permissive")
        types = {f.name: f.type for f in unified} if others else {}
        schema = _promoted(self.schema, types)
        wanted = _pandas_dtypes(schema.metadata)
        first = (schema.metadata or {}).get(b"pandas", b"")
        categorical = _dictionary_columns(schema, self.conversion)
        noted = _noted_alone(schema, categorical)
        seen: dict[bytes | None, tuple] = {}
        shards = []
        for plan in plans:
            stored = {f.name: f.type for f in plan.file_schema}
            own = (plan.file_schema.metadata or {}).get(b"pandas")
            if own not in seen:
                seen[own] = _pandas_dtypes(plan.file_schema.metadata)
            pandas = None if seen[own] == wanted else first
            for shard in plan.shards:
                part = shard.part
                casts = tuple(
                    (c, t) for c in part.read_columns if stored[c] != (t := types.get(c, stored[c]))
                )
                if set(part.noted) != set(noted):  # the first file's note, not this file's
                    part = dataclasses.replace(part, categorical=categorical, noted=noted)
                if casts or pandas is not None or (others and part.empty is not None):
                    empty = part.empty
                    if empty is not None:
                        empty = _retyped(empty, types, schema.metadata)  # promoted
                    # a column of nulls alone holds nulls, whatever type it is read as
                    was_null = [c for c, _ in casts if pa.types.is_null(stored[c])]
                    nulls = (*part.nulls, *(c for c in was_null if c in part.columns))
                    part = dataclasses.replace(
                        part, casts=casts, empty=empty, nulls=nulls, pandas=pandas
                    )
                if part is not shard.part:
                    shard = dataclasses.replace(shard, part=part)
                shards.append(shard)
        return dataclasses.replace(self, shards=shards, schema=schema, file_schema=unified)


def _index_of(plan: ParquetPlan) -> str:
    if plan.index is not None:
        return f"column {plan.index!r}"
    return "none" if plan.range_name is None else f"a RangeIndex named {plan.range_name!r}"


def _pandas_dtypes(metadata: dict[bytes, bytes] | None) -> tuple:
    """The dtype pandas stored for each column (``(name, "Int64")``...): pyarrow gives a
    column that one."""
    if not metadata or b"pandas" not in metadata:
        return ()
    stored = json.loads(metadata[b"pandas"])
    return tuple(
        (c.get("field_name", c.get("name")), c.get("numpy_type")) for c in stored.get("columns", [])
    )


def _dictionary_columns(schema: pa.Schema, conversion: Conversion) -> tuple[str, ...]:
    """The columns that become categories: the dictionary-encoded ones and those pandas noted
    as categorical (pyarrow stores a categorical of integers as plain integers; Dask reads it
    as categories by that note), unless pyarrow-backed columns were asked for (Dask keeps
    those as pyarrow dictionaries)."""
    if conversion.dtype_backend == "pyarrow":
        return ()
    noted = {
        c.get("field_name", c.get("name"))
        for c in _pandas_metadata(schema).get("columns", [])
        if c.get("pandas_type") == "categorical"
    } - set(_stored_index(schema))  # an index of them Dask reads as the integers stored
    return tuple(f.name for f in schema if pa.types.is_dictionary(f.type) or f.name in noted)


def _noted_alone(schema: pa.Schema, categorical: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``categorical`` categories by pandas' note alone (stored as plain values)."""
    return tuple(c for c in categorical if not pa.types.is_dictionary(schema.field(c).type))


#: A Parquet file ends with its footer's length (4 bytes, little-endian) and the magic ``PAR1``.
MAGIC = b"PAR1"
TAIL = 8


@dataclasses.dataclass(frozen=True)
class _Footer:
    """A file's footer, read once through the checked descriptor, and its stamp."""

    path: str
    file: pq.ParquetFile  # over the footer bytes alone: metadata and schema, no data
    source: pa.Buffer  # the same bytes, for statistics pruning
    stamp: stamps.Stamp

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The file's Arrow schema: pyarrow converts it anew on every ``schema_arrow``."""
        return self.file.schema_arrow

    @functools.cached_property
    def stored_range(self) -> dict | None:
        """The RangeIndex pandas stored (its metadata is JSON, parsed once here)."""
        return _stored_range(self.schema)

    @functools.cached_property
    def leaves(self) -> list[str]:
        """The top-level column of each leaf column, in the footer's order."""
        return _top_level_columns(self.file)

    @property
    def row_groups(self) -> list[_RowGroup]:
        """Each row group's rows, column chunks and columns that may hold nulls."""
        return self._walked[0]

    @property
    def tail_start(self) -> int:
        """Where the last column chunk ends: page indexes and the footer follow it."""
        return self._walked[1]

    @functools.cached_property
    def _walked(self) -> tuple[list[_RowGroup], int]:
        """:attr:`row_groups` and :attr:`tail_start`, the footer walked once: pyarrow makes a
        Python object for every chunk asked for, and three walks of them were most of a
        file's planning (CPU time for 100 columns in 50 row groups: 31 to 23 ms). A chunk of
        a file parquet-mr 1.2.8 or older wrote is read as pyarrow reads it
        (:data:`OLD_MR_PADDING`), but the tail starts where the chunks end."""
        meta, leaves, groups = self.file.metadata, self.leaves, []
        padding = OLD_MR_PADDING if _before_parquet_816(meta.created_by) else 0
        size, tail = self.stamp.size, 4
        counted = {  # columns read as numbers that a null would make floats or objects
            f.name
            for f in self.schema
            if f.nullable and (pa.types.is_integer(f.type) or pa.types.is_boolean(f.type))
        }
        # what each leaf column's chunks share, looked up once a file, not once a chunk (a
        # file of 1,000 columns in 300 row groups has 300,000 chunks)
        columns = [
            (j, name, name in counted, _WIDTHS.get(meta.schema.column(j).physical_type, 0))
            for j, name in enumerate(leaves)
        ]
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            chunks, nulls = [], set()
            for j, name, may_be_null, width in columns:
                c = rg.column(j)
                if may_be_null:
                    stats = c.statistics  # no null count: it may hold one
                    if stats is None or not stats.has_null_count or stats.null_count > 0:
                        nulls.add(name)
                start = c.data_page_offset
                if c.has_dictionary_page and 0 < c.dictionary_page_offset < start:
                    start = c.dictionary_page_offset
                # about the bytes in memory: the values at their width, or the size
                # uncompressed where that is more (a dictionary-encoded chunk is far smaller
                # than its values even uncompressed)
                decoded = c.num_values * width
                uncompressed = c.total_uncompressed_size
                if uncompressed > decoded:
                    decoded = uncompressed
                length = c.total_compressed_size
                end = start + length
                if end > tail:
                    tail = end
                if padding:
                    length += max(0, min(padding, size - end))
                chunks.append((name, start, length, decoded))
            groups.append(_RowGroup(rg.num_rows, tuple(chunks), frozenset(nulls)))
        return groups, tail

    @functools.cached_property
    def rows_before(self) -> list[int]:
        """The rows of the row groups before each one (once: a shard per row group of a file
        of 10,000 summed them anew each, 50 M lookups)."""
        return list(itertools.accumulate((g.rows for g in self.row_groups), initial=0))


#: Bytes pyarrow (Arrow's ``ComputeColumnChunkRange``) reads past the end of each column chunk
#: of a file parquet-mr 1.2.8 or older wrote (PARQUET-816: its sizes left out the dictionary
#: page header), up to the file's end: a plan that leaves them out fails the read.
OLD_MR_PADDING = 100
_PARQUET_MR = re.compile(r"parquet-mr(?![\w-])(?:\s+version\s+(\d+)(?:\.(\d+))?(?:\.(\d+))?)?")


def _before_parquet_816(created_by: str | None) -> bool:
    """Whether Arrow takes ``created_by`` for parquet-mr older than 1.2.9 (the application's
    name as written, a missing version part as 0)."""
    match = _PARQUET_MR.match((created_by or "").lstrip())  # Arrow trims leading spaces
    return match is not None and tuple(int(g or 0) for g in match.groups()) < (1, 2, 9)


class _RowGroup(NamedTuple):
    rows: int
    #: (top-level column, first byte, bytes stored, about the bytes decoded) of each leaf
    chunks: tuple[tuple[str, int, int, int], ...]
    #: Integer and boolean columns that may hold a null here: the statistics count one or
    #: have no count to say there is none (a column the schema marks required never does)
    nulls: frozenset[str]


def _corrupt(path: str, why: str) -> InputError:
    return InputError(path, f"not a valid Parquet file (corrupt or truncated footer): {why}")


def _open(path: str, store: remote.Store | None = None) -> _Footer:
    """The footer of ``path``: one open (allowed roots checked on it; a remote object's
    ``store``), two small reads."""
    with remote.opened(path, store) as f:
        size = f.stat.st_size
        if size == 0:
            raise InputError(path, "empty file (0 bytes), not a Parquet file")
        if size < len(MAGIC) + TAIL:
            raise _corrupt(path, f"{size} bytes is too short for a Parquet file")
        tail = pread_exact(f, TAIL, size - TAIL)
        if tail[4:] != MAGIC:
            raise _corrupt(path, "Parquet magic bytes not found at the end")
        length = int.from_bytes(tail[:4], "little")
        if length + len(MAGIC) + TAIL > size:
            raise _corrupt(path, f"footer length {length} is more than the file holds")
        footer = pread_exact(f, length + TAIL, size - TAIL - length)
        stamp = stamps.take(f, (size - TAIL - length, length + TAIL), footer)
    source = pa.py_buffer(MAGIC + footer)
    try:
        return _Footer(path, pq.ParquetFile(pa.BufferReader(source)), source, stamp)
    except (OSError, pa.ArrowException) as exc:
        raise _corrupt(path, str(exc)) from None


def _pandas_metadata(schema: pa.Schema) -> dict:
    """What pandas stored in ``schema``'s metadata (``{}``: nothing), parsed once for each
    distinct text: ``schema.pandas_metadata`` parses its JSON anew on every call, and planning
    a small file asked five times (a tenth of its planning). Read only: the dict is shared."""
    raw = (schema.metadata or {}).get(b"pandas")
    return _parsed_json(raw) if raw else {}


@functools.lru_cache(maxsize=64)
def _parsed_json(raw: bytes) -> dict:
    return json.loads(raw)


def _stored_index(schema: pa.Schema) -> list[str]:
    """The columns pandas stored its index in (none for a RangeIndex, kept as metadata)."""
    return [c for c in _pandas_metadata(schema).get("index_columns", []) if isinstance(c, str)]


def _stored_range(schema: pa.Schema) -> dict | None:
    """The RangeIndex pandas stored as metadata alone (``{"start", "step", "name"...}``)."""
    stored = _pandas_metadata(schema).get("index_columns", [])
    if len(stored) == 1 and isinstance(stored[0], dict) and stored[0].get("kind") == "range":
        return stored[0]
    return None


def _choose_index(
    path: str,
    schema: pa.Schema,
    index: str | list[str] | bool | None,
    columns: list[str] | None,
    folders: list[str],
) -> str | None:
    """The column to index every partition by, as ``dd.read_parquet`` chooses it: ``None``
    takes the index pandas stored (one column; not where ``columns`` asks for it as a
    column), ``False`` none, a name that column (or hive key of ``folders``)."""
    if index is False:
        return None
    if index is None:
        stored = _stored_index(schema)
        if len(stored) != 1 or (columns is not None and stored[0] in columns):
            return None  # none stored, or a MultiIndex: its levels stay columns
        return stored[0]
    names = list(index) if isinstance(index, (list, tuple)) else [index]
    if len(names) != 1:
        raise InputError(None, f"index={index!r}: one column only (Dask has no MultiIndex)")
    (name,) = names
    names = schema.names + folders
    if not isinstance(name, str) or name not in names:
        raise InputError(path, f"index={name!r}: no such column; columns are {names}")
    return name


def _describe(schema: pa.Schema) -> str:
    return schema.to_string(show_schema_metadata=False)


def _by_name(schema: pa.Schema) -> dict[str, pa.Field] | None:
    """The fields by name, each as nullable (a file whose writer marked a column required
    reads with those that did not, as in Dask); None where a name repeats (then only the order
    can match them)."""
    fields = {f.name: f.remove_metadata().with_nullable(True) for f in schema}
    return fields if len(fields) == len(schema) else None


def _check_schema(
    path: str, schema: pa.Schema, first: str, expected: pa.Schema, promote: bool = False
) -> None:
    """The same columns, matched by name (in any order, as Dask matches them), else by place;
    with ``promote``, of the same types or of types :func:`_promotable` to one."""
    if schema.equals(expected, check_metadata=False):  # the usual case, decided in C
        return
    mine, theirs = _by_name(schema), _by_name(expected)
    if mine is not None and theirs is not None:
        alike = _promotable if promote else pa.DataType.equals
        same = mine.keys() == theirs.keys() and all(
            alike(mine[k].type, theirs[k].type) for k in mine
        )
    else:
        same = schema.equals(expected, check_metadata=False)
    if not same:
        raise InputError(
            path,
            f"schema differs from {first}{_differences(mine, theirs)}:\n{_describe(schema)}"
            f"\n  expected:\n{_describe(expected)}",
        )


def _promotable(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether a column stored as ``a`` in one file and ``b`` in another reads as one type:
    equal; a column of nulls alone and any plain type; or two types of one family (numbers,
    decimals, timestamps, durations, strings, binary) that pyarrow's permissive unify makes
    one, which both targets cast the same way. Not across families (an int and a decimal or a
    string, a decimal and a float: the unified type loses values or precision), nor nested
    types, dictionaries, two time zones, or uint64 with a signed integer (unified as int64)."""
    if a.equals(b):
        return True
    if pa.types.is_null(a) or pa.types.is_null(b):
        other = b if pa.types.is_null(a) else a
        return _family(other) is not None or _plain(other)
    if _family(a) is None or _family(a) != _family(b):
        return False
    if {a, b} & {pa.uint64()} and any(map(pa.types.is_signed_integer, (a, b))):
        return False
    try:
        one = [pa.schema([("c", a)]), pa.schema([("c", b)])]
        pa.unify_schemas(one, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return True


#: The families of column types whose members read as one (:func:`_promotable`).
_FAMILIES = {
    "number": (pa.types.is_integer, pa.types.is_floating),
    "decimal": (pa.types.is_decimal,),
    "timestamp": (pa.types.is_timestamp,),
    "duration": (pa.types.is_duration,),
    "string": (pa.types.is_string, pa.types.is_large_string),
    "binary": (pa.types.is_binary, pa.types.is_large_binary),
}


def _family(t: pa.DataType) -> str | None:
    return next((name for name, kinds in _FAMILIES.items() if any(k(t) for k in kinds)), None)


def _plain(t: pa.DataType) -> bool:
    """Booleans, dates and times: a column of nulls alone reads as one of them."""
    return pa.types.is_boolean(t) or pa.types.is_date(t) or pa.types.is_time(t)


def _promoted(schema: pa.Schema, types: dict[str, pa.DataType]) -> pa.Schema:
    """``schema`` with its fields of ``types``' names of those types, and the pandas nullable
    dtypes its metadata stores for them made those of the types."""
    return _retyped(schema, types, pandas_types(schema.metadata, types))


def _retyped(schema: pa.Schema, types: dict[str, pa.DataType], metadata: dict | None) -> pa.Schema:
    """``schema`` with its fields of ``types``' names of those types (hive keys as they are)
    and ``metadata``."""
    return pa.schema([f.with_type(types.get(f.name, f.type)) for f in schema], metadata=metadata)


def _differences(mine: dict[str, pa.Field] | None, theirs: dict[str, pa.Field] | None) -> str:
    """What differs by name, first (a wide schema hides it): `` (x: int64 here, int32 there;
    only here: w)``; nothing where names repeat, or only the order differs."""
    if mine is None or theirs is None:
        return ""
    changed = [k for k in mine if k in theirs and not mine[k].equals(theirs[k])]
    found = [f"{k}: {mine[k].type} here, {theirs[k].type} there" for k in changed]
    if here := [k for k in mine if k not in theirs]:
        found.append(f"only here: {', '.join(here)}")
    if there := [k for k in theirs if k not in mine]:
        found.append(f"only there: {', '.join(there)}")
    return f" ({'; '.join(found)})" if found else ""


def _kept_row_groups(footer: _Footer, expression: Any) -> list[int]:
    non_empty = [i for i, g in enumerate(footer.row_groups) if g.rows > 0]
    if expression is None:
        return non_empty
    # pruned on the footer already read: the statistics the stamp vouches for
    fragment = ds.ParquetFileFormat().make_fragment(
        pa.BufferReader(footer.source), row_groups=non_empty
    )
    try:
        return [rg.id for rg in fragment.subset(filter=expression).row_groups]
    except (pa.ArrowException, TypeError) as exc:
        raise InputError(footer.path, f"filters do not apply to this file's types: {exc}") from None


def plan(
    files: list[str],
    columns: str | list[str] | None,
    filters: Any,
    blocksize: int,
    target: str,
    index: str | list[str] | bool | None = None,
    partitioning: hive.Partitioning | None = None,
    per_shard: int | None = None,
    conversion: Conversion = PYARROW_DEFAULTS,
    store: remote.Store | None = None,
) -> ParquetPlan:
    """Shards of ``files`` (footers only, no data read) and the schema of the result (its
    columns, hive partition columns after the files' own, the index column last). A shard is
    a run of row groups of about ``blocksize`` bytes, or with ``per_shard`` of that many row
    groups. ``store``: how to reach remote objects."""
    partitioning = partitioning or hive.UNPARTITIONED
    first = _open(files[0], store)
    schema = first.schema
    if isinstance(columns, str):
        columns = [columns]
    folders = list(partitioning.names)
    key = _choose_index(files[0], schema, index, columns, folders)
    clash = [name for name in folders if name in schema.names]
    if clash:
        raise InputError(files[0], f"hive partition key(s) {clash} are also columns of the file")
    # index=False or another column: the columns pandas stored its index in come first, as
    # Dask puts them
    stored = []
    if index is not None:
        stored = [n for n in _stored_index(schema) if n in schema.names and n != key]
    available = stored + [n for n in schema.names + folders if n != key and n not in stored]
    if columns is None:
        # an unnamed index read as no index is dropped, as Dask drops it; asked for, it is kept
        columns = [c for c in available if c not in stored or not _unnamed_index(c)]
    else:
        columns = [c for c in columns if c != key]
        unknown = [c for c in columns if c not in available]
        if unknown:
            raise InputError(files[0], f"unknown column(s) {unknown}; columns are {available}")
    kept = columns + ([key] if key is not None else [])
    filters = dnf.normalize(filters, schema.names + folders, files[0])
    read_columns = [c for c in kept if c not in folders]
    read_columns += [c for c in dnf.columns_of(filters) if c not in read_columns + folders]
    # a row count needs a column: where only partition columns are asked for, read the first
    read_columns = read_columns or schema.names[:1]
    repeated = [c for c in dict.fromkeys(read_columns) if len(schema.get_all_field_indices(c)) > 1]
    if repeated:  # pyarrow finds no field by such a name (pandas and Dask read no such file)
        raise InputError(
            files[0],
            f"column name(s) {repeated} appear more than once in the file's schema: leave them "
            "out with columns=",
        )
    # with the pandas metadata: columns stored as Int64 and the like come back so in meta too
    fields = [
        schema.field(c) if c not in folders else _partition_field(c, partitioning) for c in kept
    ]
    out_schema = pa.schema(fields, metadata=schema.metadata)
    types = tuple(
        (name, partitioning.categories[name], partitioning.integer[name])
        for name in folders
        if name in kept
    )
    part = dict(  # what every shard's ParquetPart shares; row groups are added per shard
        read_columns=tuple(read_columns),
        columns=tuple(kept),
        categorical=(categorical := _dictionary_columns(out_schema, conversion)),
        noted=_noted_alone(out_schema, categorical),
        halves=tuple(f.name for f in out_schema if pa.types.is_float16(f.type)),
        index=key,
        partition_types=types,
        conversion=conversion,
    )
    # a RangeIndex pandas kept as metadata: rebuilt per shard from each file's own (as pandas)
    ranged = _stored_range(schema) if index is None else None

    shards: list[Shard] = []
    for path in files:
        footer = first if path == files[0] else _open(path, store)
        _check_schema(path, footer.schema, files[0], schema)
        values = partitioning.of(path)
        possible, left = hive.keep(values, filters)  # partition terms decided on the folders
        mine = dict(part, filters=left, partition=values)
        args = (blocksize, per_shard, target, ranged, store)
        shards.extend(_file_shards(footer, mine, out_schema, possible, *args))
    return ParquetPlan(
        shards=shards,
        schema=out_schema,
        file_schema=schema,
        first=files[0],
        index=key,
        range_name=ranged.get("name") if ranged else None,
        partition_types=types,
        conversion=conversion,
    )


def _layout(file: pq.ParquetFile) -> tuple:
    """Each leaf column of ``file`` in the footer's order: path, physical and logical type,
    nesting levels. Files read as one schema by name may still differ here (columns in
    another order)."""
    schema = file.schema
    return tuple(
        (
            c.path,
            c.physical_type,
            str(c.logical_type),
            c.max_definition_level,
            c.max_repetition_level,
        )
        for c in map(schema.column, range(len(schema)))
    )


def _partition_field(name: str, partitioning: hive.Partitioning) -> pa.Field:
    """A hive partition column as Dask gives it: dictionary-encoded (a category)."""
    values = pa.int32() if partitioning.integer[name] else pa.string()
    return pa.field(name, pa.dictionary(pa.int32(), values))


def _top_level_columns(pf: pq.ParquetFile) -> list[str]:
    """The top-level column of each leaf column chunk, in chunk order.

    ``path_in_schema`` joins the path with dots, so a column named ``a.b`` would pass for the
    field ``b`` of ``a``; the reader's path components do not mix the two up.
    """
    return [path[0] for path in pf.reader.column_paths]


def _null_columns(
    footer: _Footer, row_groups: list[int], columns: Sequence[str]
) -> tuple[str, ...]:
    """Integer and boolean ``columns`` that may hold a null in ``row_groups``
    (:attr:`_RowGroup.nulls`)."""
    found = set().union(*(footer.row_groups[i].nulls for i in row_groups))
    return tuple(c for c in columns if c in found)


def _range_at(
    footer: _Footer, ranged: dict | None, row_group: int
) -> tuple[int, int, str | None] | None:
    """(first value, step, name) of the file's stored RangeIndex at ``row_group``'s first row."""
    if ranged is None:
        return None
    own = footer.stored_range or {"start": 0, "step": 1}
    before = footer.rows_before[row_group]
    return (own["start"] + own["step"] * before, own["step"], ranged.get("name"))


#: Bytes a value of each Parquet physical type takes at least once decoded (a string: its
#: offset); the footer says nothing closer of fixed-length byte arrays.
_WIDTHS = {
    "BOOLEAN": 1,
    "INT32": 4,
    "INT64": 8,
    "INT96": 12,
    "FLOAT": 4,
    "DOUBLE": 8,
    "BYTE_ARRAY": 4,
}


def _index_range(
    meta: pq.FileMetaData, leaves: list[str], index: str | None, row_groups: list[int]
) -> tuple[Any, Any] | None:
    """The index column's smallest and largest value in ``row_groups``, from the footer's
    statistics; None where any row group lacks them (or the index is not one leaf column)."""
    if index is None or leaves.count(index) != 1:
        return None
    j = leaves.index(index)
    lows, highs = [], []
    for i in row_groups:
        stats = meta.row_group(i).column(j).statistics
        if stats is None or not stats.has_min_max:
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return min(lows), max(highs)


def divisions(partitions: Sequence[Sequence[Shard]], plan: ParquetPlan) -> tuple | None:
    """The divisions of ``partitions`` (each a run of shards) as ``dd.read_parquet(...,
    calculate_divisions=True)`` finds them: each partition's smallest index value and the last
    one's largest, where every partition's values start at or after the largest of the one
    before (Dask's ``sorted_columns``); None where they do not, where a statistic is missing,
    or where there is no plain index column. Shards that filters ruled out hold no rows
    (:func:`.placement.fold_rowless` leaves no partition of only those)."""
    kind = plan.schema.field(plan.index).type if plan.index is not None else None
    if kind is None or pa.types.is_dictionary(kind):
        return None
    bounds = []
    for shards in partitions:
        ranges = [s.part.index_range for s in shards if s.part.empty is None]
        if not ranges or None in ranges:
            return None
        bounds.append((min(low for low, _ in ranges), max(high for _, high in ranges)))
    if not bounds or any(b[0] < a[1] for a, b in itertools.pairwise(bounds)):
        return None
    values = [low for low, _ in bounds] + [bounds[-1][1]]
    return tuple(pa.array(values, type=kind).to_pandas())


def rows(partition: Sequence[Shard]) -> int | None:
    """The rows a partition's read gives, from its footers: its row groups' counts (none for
    a file filters ruled out whole); None where a filter is left to drop rows after decoding
    (terms on hive keys alone were decided at planning)."""
    if any(s.part.empty is None and s.part.filters is not None for s in partition):
        return None
    return sum(s.part.rows for s in partition)


def _file_shards(
    footer: _Footer, part: dict[str, Any], out: pa.Schema, possible: bool, *args: Any
) -> list[Shard]:
    """The shards of one file: runs of its row groups that its filters (``part["filters"]``,
    the file's own terms) may keep, or where none may (or not ``possible``: its folders are
    ruled out) one shard that reads the footer alone, to check the file, and gives no rows of
    ``out``."""
    blocksize, per_shard, target, ranged, store = args
    part = dict(part, layout=_layout(footer.file))
    expression = dnf.to_expression(part["filters"], footer.schema)
    path, meta, size = footer.path, footer.file.metadata, footer.stamp.size
    store = remote.store_of(path, store)
    head_tail = [(0, 4), (footer.tail_start, size - footer.tail_start)]
    wanted = set(part["read_columns"])
    groups: list[list[int]] = []
    chunks: list[list[tuple[str, int, int, int]]] = []
    group_bytes = blocksize
    previous = None
    for i in _kept_row_groups(footer, expression) if possible else []:
        mine = [c for c in footer.row_groups[i].chunks if c[0] in wanted]
        full = groups and (len(groups[-1]) >= per_shard if per_shard else group_bytes >= blocksize)
        if not groups or full or previous != i - 1:
            groups.append([])
            chunks.append([])
            group_bytes = 0
        groups[-1].append(i)
        chunks[-1].extend(mine)
        group_bytes += sum(n for _, _, n, _ in mine)
        previous = i
    nulls = _null_columns(footer, [i for g in groups for i in g], part["columns"])
    if not groups:  # statistics planned from this footer rule it all out: check it is still so
        assert footer.stamp.probe is not None  # a footer's stamp probes the footer
        offset, length = footer.stamp.probe
        start = _range_at(footer, ranged, 0)
        empty = ParquetPart(row_groups=(), empty=out, range_index=start, **part)
        only = ((offset, length),)
        return [Shard(path, only, empty, target, stamp=footer.stamp, store=store)]
    return [
        Shard(
            path=path,
            ranges=_ranges(cs, head_tail),
            part=ParquetPart(
                row_groups=tuple(g),
                rows=footer.rows_before[g[-1] + 1] - footer.rows_before[g[0]],
                decoded=sum(n for *_, n in cs),
                nulls=nulls,
                range_index=_range_at(footer, ranged, g[0]),
                index_range=_index_range(meta, footer.leaves, part["index"], g),
                chunks=tuple(cs) if len(cs) <= MAX_CHUNKS else (),
                frame=tuple(head_tail),
                **part,
            ),
            target=target,
            stamp=footer.stamp,
            store=store,
        )
        for g, cs in zip(groups, chunks, strict=True)
    ]


def _ranges(chunks: Sequence[tuple[str, int, int, int]], frame: Sequence[tuple[int, int]]) -> tuple:
    """What a shard reads: its column chunks and the file's header and footer, near ones
    merged."""
    return coalesce([(offset, n) for _, offset, n, _ in chunks] + list(frame), gap=MERGE_GAP)


def projected(shard: Shard, columns: Sequence[str], *, reading: bool = False) -> Shard:
    """``shard`` reading only what ``columns`` (a selection Dask's optimizer pushed into the
    read: ``df[["x"]]``, ``df.x.sum()``) needs, with its index and the columns its filters
    test: fewer column chunks of the same row groups, so the partitions stay as planned.
    ``reading``: on the worker about to read it, where a shard of more chunks than it lists
    finds them in its file's footer (elsewhere it keeps the ranges planned)."""
    part = shard.part
    keep = {*columns, part.index}
    # in the order asked (Dask's meta of the selection has it), the index column last
    out = tuple(c for c in columns if c in part.columns and c != part.index)
    out += tuple(c for c in part.columns if c == part.index)
    if out == part.columns:
        return shard
    needed = keep | set(dnf.columns_of(part.filters))
    read = tuple(c for c in part.read_columns if c in needed) or part.read_columns[:1]
    every = part.chunks
    if not every and reading and part.empty is None:  # more chunks than a shard lists
        every = _chunks_of(shard)
    # else the footer alone (to check the file), or chunks not known here: as planned
    listed = part.empty is None and bool(every)
    chunks = tuple(c for c in every if c[0] in read)
    narrowed = dataclasses.replace(
        part,
        columns=out,
        read_columns=read,
        categorical=tuple(c for c in part.categorical if c in out),
        noted=tuple(c for c in part.noted if c in out),
        halves=tuple(c for c in part.halves if c in read),
        casts=tuple(c for c in part.casts if c[0] in read),
        nulls=tuple(c for c in part.nulls if c in out),
        empty=None if part.empty is None else _schema_of(part.empty, out),
        chunks=chunks,
        decoded=sum(n for *_, n in chunks) if listed else part.decoded,
    )
    ranges = _ranges(chunks, part.frame) if listed else shard.ranges
    return dataclasses.replace(shard, ranges=ranges, part=narrowed)


def _chunks_of(shard: Shard) -> tuple[tuple[str, int, int, int], ...]:
    """The column chunks of ``shard``'s row groups and columns, from its file's footer (two
    small reads); none (the ranges as planned) where the file is gone or its footer is not the
    one planned from: the read then says so, naming the file."""
    try:
        footer = _open(shard.path, shard.store)
    except (InputError, OSError):
        return ()
    planned = shard.stamp  # the same bytes, wherever their times differ (a copy per node)
    if planned is None or dataclasses.replace(footer.stamp, mtimes=planned.mtimes) != planned:
        return ()
    wanted = set(shard.part.read_columns)
    groups = footer.row_groups
    return tuple(c for i in shard.part.row_groups for c in groups[i].chunks if c[0] in wanted)


def _schema_of(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names], metadata=schema.metadata)
