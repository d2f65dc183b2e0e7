"""Row filters in pyarrow's DNF form, checked at planning time and applied to decoded frames.

One evaluator serves pandas and cuDF frames alike, so both targets filter rows the same way.
Nulls follow ``dd.read_parquet`` (its ``_filters_to_expression``): a null never matches ``==``,
``<``, ``<=``, ``>`` or ``>=``, but ``!=`` and ``not in`` keep it (and a float column's NaNs);
``in`` matches a null only when None is among the values. ``(column, "is", None)`` keeps the
nulls (and NaNs) and ``"is not"`` the others, and a comparison with None is refused: it would
keep no row.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import numbers
import operator
from typing import Any

import numpy as np
import pandas as pd

from .errors import InputError

COMPARE = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
OPERATORS = frozenset(COMPARE) | {"in", "not in", "is", "is not"}
KEEP_NULLS = frozenset({"!=", "not in"})  # Dask keeps the nulls these leave undecided
_TIMES = (datetime.datetime, np.datetime64)  # pd.Timestamp is a datetime

Filters = list[list[tuple[str, str, Any]]]


def normalize(filters: Any, columns: list[str], path: str | None = None) -> Filters | None:
    """Check ``filters`` against the schema's ``columns`` (of the file ``path``, named in the
    error for an unknown column); return them as a list of AND-lists (None for none: an
    empty list filters nothing, as in Dask)."""
    if filters is None:
        return None
    if not isinstance(filters, (list, tuple)):
        raise InputError(None, f"bad filters {filters!r}: expected a list of tuples")
    if not filters:
        return None
    if all(isinstance(f, tuple) for f in filters):
        filters = [filters]
    out: Filters = []
    for conjunction in filters:
        if not (isinstance(conjunction, (list, tuple)) and conjunction):
            # an empty AND-list would keep every row, whatever the others say (pyarrow and
            # Dask call it malformed)
            raise InputError(
                None, f"bad filters {filters!r}: each AND-list needs a (column, op, value)"
            )
        terms = []
        for term in conjunction:
            if not (isinstance(term, (tuple, list)) and len(term) == 3):
                raise InputError(None, f"bad filter term {term!r}: expected (column, op, value)")
            column, op, value = term
            if column not in columns:
                raise InputError(path, f"filter on unknown column {column!r}; columns: {columns}")
            if op not in OPERATORS:
                raise InputError(
                    None, f"bad filter operator {op!r}; use one of {sorted(OPERATORS)}"
                )
            if op in ("in", "not in") and not isinstance(value, (list, tuple, set, frozenset)):
                raise InputError(None, f"filter {term!r}: {op!r} needs a list of values")
            if op in ("is", "is not") and not _null(value):
                raise InputError(None, f"filter {term!r}: {op!r} compares with None only")
            if op in COMPARE and _null(value):
                what = "None" if value is None else "NaN"
                raise InputError(
                    None,
                    f"filter {term!r}: nothing equals {what}; use ({column!r}, 'is', None) or "
                    f"({column!r}, 'is not', None) for nulls and NaNs",
                )
            terms.append((column, op, value))
        out.append(terms)
    return out


def columns_of(filters: Filters | None) -> list[str]:
    """Columns that ``filters`` reads, in first-seen order."""
    seen: dict[str, None] = {}
    for conjunction in filters or ():
        for column, _, _ in conjunction:
            seen[column] = None
    return list(seen)


def to_expression(filters: Filters | None, schema: Any = None) -> Any:
    """The pyarrow expression for ``filters``, used to prune a file's row groups by their
    statistics; ``schema``: that file's (a ``pa.Schema``). It may keep more rows than the
    filter (the exact one, :func:`apply`, runs after), never fewer. So a term no statistic
    decides prunes nothing: ``"is"``, ``!=``, ``not in`` and ``in`` with None on floats (a NaN
    counts as null and no statistic counts NaNs; Dask's own pruning drops a group's NaNs), a
    float16 column (pyarrow has no kernel for it), a time with nanoseconds (pyarrow's scalar
    drops them) and a float past 2**53 on integers (pandas rounds the column to compare). An
    integer column compares with a float below it as with the whole numbers it means (``x <
    2.5`` as ``x < 3``: pyarrow cast the statistics to float32 and failed past 2**24), an
    unsigned one with an int as uint64 (pyarrow casts a uint64 statistic past int64's range to
    int64 for an int, and fails), ``in`` and ``not in`` take None apart (pyarrow types a list
    of None alone, or none, as null), and a column of nulls alone in this file decides each
    term on it without statistics: ``"is"``, ``!=`` and ``not in`` keep its rows, others none.
    """
    if filters is None:
        return None
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    types = {} if schema is None else {f.name: f.type for f in schema}
    floats = {c for c, t in types.items() if pa.types.is_floating(t)}
    integers = {c for c, t in types.items() if pa.types.is_integer(t)}
    unsigned = {c for c, t in types.items() if pa.types.is_unsigned_integer(t)}
    nulls = {c for c, t in types.items() if pa.types.is_null(t)}
    times = {c for c, t in types.items() if pa.types.is_timestamp(t)}
    # pyarrow has no kernel to compare float16 with
    unpruned = {c for c, t in types.items() if pa.types.is_float16(t)}

    def term(column: str, op: str, value: Any) -> Any:
        if column in nulls:
            return ds.scalar(op == "is" or op in KEEP_NULLS)
        values = list(value) if op in ("in", "not in") else [value]
        present = [v for v in values if v is not None]
        with_null = len(present) < len(values)
        if (
            column in unpruned
            or (column in floats and (op == "is" or op in KEEP_NULLS or with_null))
            or (column in times and any(map(_has_nanoseconds, present)))
            or (column in integers and any(_unsure_as_int(v) for v in present))
        ):  # no statistic says (a NaN counted as null; nanoseconds pyarrow drops): keep all
            return ds.scalar(True)
        null = ds.field(column).is_null(nan_is_null=True)
        if op in ("is", "is not"):  # pyarrow's DNF has no null test
            return null if op == "is" else ~null
        if column in floats and op == "in" and any(map(_zero, present)):
            # a row group of zeros has the statistics -0.0 and 0.0, which pyarrow takes for
            # the one value -0.0, that its is_in finds in no set of 0.0 (apache/arrow#46183):
            # it pruned the group. With both zeros in the set it is kept (pandas' isin and
            # pyarrow's == take them for one value)
            present = [*present, -0.0, 0.0]
        if column in integers and _has_float(present):
            # whole numbers as they compare with the float (below 2**53: as pandas does)
            op, present = _as_integers(op, present)
            value = present if op in ("in", "not in") else present[0]
        try:
            if op in ("in", "not in") and not present:
                compared = ds.scalar(False)  # no value but None: pyarrow types [] as null
            else:
                listed = present if op in ("in", "not in") else value
                typed = _as_uint64(listed) if column in unsigned else _past_int64(listed)
                compared = pq.filters_to_expression(
                    [[(column, "in" if op == "not in" else op, typed)]]
                )
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise InputError(
                None, f"filter {(column, op, value)!r}: pyarrow takes no such value: {exc}"
            ) from None
        if op == "in":
            return compared | null if with_null else compared
        if op == "not in":
            return null | ~compared
        return null | compared if op in KEEP_NULLS else compared

    return functools.reduce(
        operator.or_,
        (functools.reduce(operator.and_, (term(*t) for t in c)) for c in filters),
    )


def _has_float(value: Any) -> bool:
    """Whether ``value`` (or one of a list of values) is a float: Python's or NumPy's."""
    values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    return any(isinstance(v, (float, np.floating)) for v in values)


def _zero(value: Any) -> bool:
    """Whether ``value`` is a number equal to zero (a bool is none)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0


def _unsure_as_int(value: Any) -> bool:
    """Whether an integer column's statistics cannot decide a comparison with ``value``: a
    float past 2**53 (pandas rounds the column's values to compare them with it)."""
    return isinstance(value, (float, np.floating)) and not abs(float(value)) < 2**53


def _as_integers(op: str, values: list) -> tuple[str, list]:
    """``op`` and ``values`` (numbers below 2**53, a float among them) as an integer column
    compares with them: ``x < 2.5`` is ``x < 3``, ``x == 2.5`` and ``x in [2.5]`` hold for
    none (``x != 2.5`` for all), pyarrow's cast of its statistics to floats aside (float32:
    it failed past 2**24)."""
    whole = [int(v) for v in values if float(v).is_integer()]
    if op in ("in", "not in"):
        return op, whole
    value = float(values[0])
    if op in ("=", "==", "!="):
        if whole:
            return op, whole
        return ("in" if op != "!=" else "not in"), []  # nothing equals it
    bound = {"<": math.ceil, ">=": math.ceil, "<=": math.floor, ">": math.floor}[op](value)
    return op, [bound]


def _has_nanoseconds(value: Any) -> bool:
    """Whether ``value`` is a time with nanoseconds, which pyarrow drops when it types it."""
    try:
        return bool(pd.Timestamp(value).nanosecond) if isinstance(value, _TIMES) else False
    except (ValueError, TypeError):
        return False


def _as_uint64(value: Any) -> Any:
    """``value`` as uint64 where it is a non-negative int (or a list of them alone)."""
    import pyarrow as pa

    def natural(v: Any) -> bool:
        return isinstance(v, numbers.Integral) and not isinstance(v, bool) and 0 <= int(v) < 1 << 64

    if natural(value):
        return pa.scalar(int(value), pa.uint64())
    if isinstance(value, (list, tuple, set, frozenset)) and value and all(map(natural, value)):
        return pa.array([int(v) for v in value], pa.uint64())
    return value


def _past_int64(value: Any) -> Any:
    """``value`` with Python ints past int64's range as uint64 (a uint64 column's largest
    values): pyarrow types an int it is given alone as int64, and overflowed."""
    import pyarrow as pa

    def big(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1 << 63

    if big(value):
        return pa.scalar(value, pa.uint64())
    if isinstance(value, (list, tuple, set, frozenset)) and any(map(big, value)):
        return pa.array(list(value), pa.uint64())
    return value


def apply(frame: Any, filters: Filters | None, halves: tuple[str, ...] = ()) -> Any:
    """Rows of a pandas or cuDF ``frame`` that satisfy ``filters``. ``halves``: the columns
    the file stores as float16 (the device target decodes them as float32), whose ``in``
    values are cast to float16 on both targets."""
    if filters is None:
        return frame
    keep = None
    for conjunction in filters:
        mask = None
        for column, op, value in conjunction:
            series = frame[column]
            if op in ("in", "not in"):
                term = _isin(series, value, half=column in halves)
                term = ~term if op == "not in" else term
            elif op in ("is", "is not"):
                term = _missing(series) if op == "is" else ~_missing(series)
            else:
                term = _compared(series, op, value, column)
            if op in KEEP_NULLS:
                term = term | _missing(series)
            mask = term if mask is None else mask & term
        keep = mask if keep is None else keep | mask
    return frame[keep]


def _compared(series: Any, op: str, value: Any, column: str) -> Any:
    """``series op value``, where a null never matches. A value the decoded column cannot be
    compared with (a ``Timestamp`` with pandas' ``datetime.date`` objects, say, which the
    footer's statistics took) is an InputError naming no file: the caller knows it. A
    category column is ordered by its values, as pyarrow orders a dictionary's (pandas
    orders only an ordered categorical, and by its categories' order)."""
    if op not in ("=", "==", "!=") and str(series.dtype) == "category":
        kind = series.cat.categories.dtype
        if isinstance(series, pd.Series) and kind.kind in "iu" and series.hasnans:
            # pandas' integers hold no null (NaN): compare them as its nullable integers
            kind = "Int64" if kind.kind == "i" else "UInt64"
        series = series.astype(kind)
    series = _widened(_unarrowed(series))
    value = _as_decoded(series, value)
    scale = _device_decimal(series)
    if scale is not None and _decimal_value(value):
        # cuDF makes the value a scalar of the column's type, which fails for a finer one
        # (ArrowInvalid: 'Rescaling Decimal value would cause data loss'): compare with the
        # bound of the column's scale that keeps the same rows, as pandas' Decimals compare
        decided, op, value = _on_decimal_scale(op, value, *scale)
        if decided is not None:
            return series.notna() & decided
    if _inexact_int(series, value):
        # no float equals it; the nearest float below or above it bounds it exactly (NumPy
        # would round it to one of them: 2**53 + 1 compared as 2**53)
        if op in ("=", "==", "!="):
            return series.notna() & (op == "!=")
        nearest = float(value)  # on one side of it
        if op in ("<", "<="):
            op, value = "<=", nearest if nearest < value else np.nextafter(nearest, -np.inf)
        else:
            op, value = ">=", nearest if nearest > value else np.nextafter(nearest, np.inf)
    try:
        term = COMPARE[op](series, value)
    except TypeError as exc:
        raise InputError(
            None, f"filter {(column, op, value)!r} does not apply to the column's values: {exc}"
        ) from None
    return term.fillna(False).astype(bool) & series.notna()


def _isin(series: Any, values: Any, half: bool = False) -> Any:
    """pyarrow's ``is_in`` on a pandas or cuDF series: a null is in ``values`` iff None is.
    ``half``: the file stores the column as float16, whatever type it was decoded to."""
    values = list(values)
    series = _unarrowed(series)
    wanted: Any = [v for v in values if v is not None and not _inexact_int(series, v)]
    if half or _narrow_float(series):  # pyarrow casts the values to the column's type
        kind = np.float16 if half else getattr(series.dtype, "numpy_dtype", series.dtype).type
        wanted = [float(kind(v)) if isinstance(v, numbers.Real) else v for v in wanted]
        series = _widened(series)  # pandas hashes no float16
    wanted = [_as_decoded(series, v) for v in wanted]
    if any(isinstance(v, bytes) for v in wanted):  # not NumPy bytes, which drop trailing NULs
        wanted = np.array(wanted, dtype=object)
    scale = _device_decimal(series)
    if scale is not None:
        # cuDF's isin matches only values of the column's very dtype (a decimal(3, 2) of
        # [Decimal('1.50')] matched no row of a decimal(12, 2)): the values it can hold, as it
        # holds them
        exact = [
            d
            for v in wanted
            if (_decimal_value(v) or isinstance(v, float)) and (d := _held(v, *scale)) is not None
        ]
        wanted = type(series)(exact, dtype=series.dtype) if exact else []
    found = series.isin(wanted).fillna(False).astype(bool)
    if any(v is None for v in values):
        return found | _missing(series)
    return found & series.notna()


def _as_decoded(series: Any, value: Any) -> Any:
    """``value`` as the decoded column holds it, where libcudf decodes a file's type as
    another (the plan checked ``value`` against the file's type): an undeclared binary column
    as strings (bytes matched no row), a time-zone-aware timestamp as a naive one in UTC (an
    aware value could not be compared with it)."""
    if isinstance(value, bytes) and _of_cudf(series):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InputError(
                None,
                f"filter value {value!r} is not UTF-8, which bytes must be to be filtered on "
                "by the device target (libcudf reads a column of bytes as strings); "
                "target='host' takes any",
            ) from None
    aware = isinstance(value, datetime.datetime) and value.tzinfo is not None
    if aware and getattr(series.dtype, "kind", None) == "M" and not _zoned(series.dtype):
        return pd.Timestamp(value).tz_convert("UTC").tz_localize(None)
    return value


def _unarrowed(series: Any) -> Any:
    """A pyarrow-backed ``series`` (``dtype_backend="pyarrow"``) in pandas' own type where
    pandas hands pyarrow values it takes wrongly: integers as ``Int64``, ``UInt64``... (a
    Python int past int64's range, a uint64 column's largest values, overflowed), float16 as
    float64 (pyarrow has no ``is_in`` for it) and times as NumPy's (``isin`` dropped a value's
    nanoseconds, and kept the time before it). Any other column as it is."""
    dtype = series.dtype
    if not isinstance(dtype, pd.ArrowDtype):
        return series
    import pyarrow as pa

    kind = dtype.pyarrow_dtype
    if pa.types.is_integer(kind):
        signed = "UInt" if pa.types.is_unsigned_integer(kind) else "Int"
        return series.astype(f"{signed}{kind.bit_width}")
    if pa.types.is_float16(kind):
        return series.astype(pd.ArrowDtype(pa.float64()))
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        return series.astype(pd.DatetimeTZDtype(kind.unit, kind.tz))
    if pa.types.is_timestamp(kind):
        return series.astype(f"datetime64[{kind.unit}]")
    if pa.types.is_duration(kind):
        return series.astype(f"timedelta64[{kind.unit}]")
    return series


def _zoned(dtype: Any) -> bool:
    """Whether ``dtype`` holds times in a zone: pandas' (or cuDF's) zone-aware type, or a
    pyarrow-backed one (``dtype_backend="pyarrow"``), whose zone is its Arrow type's."""
    if isinstance(dtype, pd.ArrowDtype):
        return getattr(dtype.pyarrow_dtype, "tz", None) is not None
    return hasattr(dtype, "tz")


def _missing(series: Any) -> Any:
    """The nulls of ``series``, and a float column's NaNs, as Dask's null test
    (``nan_is_null``) takes them: pandas' pyarrow-backed floats hold a NaN apart from null."""
    missing = series.isna()
    dtype = series.dtype
    if isinstance(dtype, pd.ArrowDtype) and dtype.kind == "f":
        missing = missing | (series != series).fillna(False).astype(bool)
    return missing


def _of_cudf(obj: Any) -> bool:
    """Whether ``obj`` (a column or a dtype) is cuDF's: the device target's decoded data."""
    return type(obj).__module__.partition(".")[0] == "cudf"


def _device_decimal(series: Any) -> tuple[int, int] | None:
    """A cuDF decimal column's (precision, scale); None for any other column (pandas holds
    Decimal objects, and pyarrow-backed decimals compare as pyarrow does)."""
    dtype = series.dtype
    if not _of_cudf(dtype) or not hasattr(dtype, "scale"):
        return None
    return int(dtype.precision), int(dtype.scale)


def _decimal_value(value: Any) -> bool:
    """Whether ``value`` compares with decimals exactly: an int or a Decimal."""
    return isinstance(value, (decimal.Decimal, numbers.Integral)) and not isinstance(value, bool)


def _held(value: Any, precision: int, scale: int) -> decimal.Decimal | None:
    """``value`` as a decimal of ``scale`` digits after the point, or None where no such
    decimal of ``precision`` digits equals it."""
    exact = decimal.Decimal(value)
    if not exact.is_finite():  # a NaN or an infinity: no decimal equals it
        return None
    held = _to_scale(exact, precision, scale, decimal.ROUND_DOWN)
    if held != exact or held.copy_abs() >= decimal.Decimal(10) ** (precision - scale):
        return None
    return held


def _to_scale(exact: decimal.Decimal, precision: int, scale: int, rounding: str) -> decimal.Decimal:
    """``exact`` rounded to ``scale`` digits after the point, with every digit it needs kept
    (the default context's 28 would round a decimal of 38 digits)."""
    with decimal.localcontext() as context:
        context.prec = max(precision, exact.adjusted() + scale + 1, 1) + 2
        return exact.quantize(decimal.Decimal(1).scaleb(-scale), rounding=rounding)


def _on_decimal_scale(
    op: str, value: Any, precision: int, scale: int
) -> tuple[bool | None, str, Any]:
    """``(decided, op, value)``: ``op value`` on a decimal column of ``precision`` and
    ``scale``, as a comparison with a value the column's type holds, or ``decided`` (True or
    False for every non-null row) where none is needed."""
    held = _held(value, precision, scale)
    if held is not None:
        return None, op, held
    exact = decimal.Decimal(value)
    if op in ("=", "==", "!="):
        return op == "!=", op, value
    largest = decimal.Decimal(10) ** (precision - scale) - decimal.Decimal(1).scaleb(-scale)
    if exact > largest:  # above every value the column holds
        return op in ("<", "<="), op, value
    if exact < -largest:
        return op in (">", ">="), op, value
    rounding = decimal.ROUND_CEILING if op in ("<", ">=") else decimal.ROUND_FLOOR
    return None, op, _to_scale(exact, precision, scale, rounding)


def _narrow_float(series: Any) -> bool:
    """Whether ``series`` holds floats narrower than float64 in NumPy's types or pandas'
    nullable ones (pandas' Arrow types compare as pyarrow does already)."""
    dtype = series.dtype
    return (
        getattr(dtype, "kind", None) == "f"
        and dtype.itemsize < 8
        and not isinstance(dtype, pd.ArrowDtype)
    )


def _widened(series: Any) -> Any:
    """``series`` compared as pyarrow compares a float32 column with a Python float: in
    float64 (NumPy 2 would cast the value down: ``0.1f == 0.1``, ``1/3 > 1/3f``)."""
    if not _narrow_float(series):
        return series
    return series.astype(
        "Float64" if isinstance(series.dtype, pd.api.extensions.ExtensionDtype) else np.float64
    )


def _inexact_int(series: Any, value: Any) -> bool:
    """Whether ``value`` is an integer that a float ``series`` (an integer column that holds
    a null, decoded as float64) holds no float equal to: past 2**53, between two floats."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral | np.integer):
        return False
    # cuDF's categorical and decimal types have no NumPy kind
    return getattr(series.dtype, "kind", None) == "f" and int(float(value)) != int(value)


def _null(value: Any) -> bool:
    """None, or a float NaN (Dask's null test takes either)."""
    return value is None or (isinstance(value, float) and value != value)
