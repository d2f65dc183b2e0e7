"""``dd.read_parquet``'s arguments in ``dg.read_parquet``: accepted with Dask's meaning, or
refused by name with the reason, so that code written for Dask fails clearly, not with
``TypeError: unexpected keyword``.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import re
import sys
from typing import TYPE_CHECKING, Any

from dask.dataframe.utils import pyarrow_strings_enabled

from .errors import InputError, OptionError

if TYPE_CHECKING:
    import pyarrow as pa

#: Dask's default ``parquet_file_extension``: the files a directory read takes.
PARQUET_EXTENSIONS = (".parq", ".parquet", ".pq")

#: ``dd.read_parquet`` arguments with no meaning here (yet), and why.
REFUSED = {
    "engine": "dask-gpudirect decodes with pyarrow (host target) and libcudf (device target)",
    "open_file_options": "dask-gpudirect opens each file itself, to check gpudirect.allowed-roots",
    "ignore_metadata_file": "a _metadata file is never read: each file's own footer is",
    "metadata_task_size": "footers are read by the workers that can read the files",
    "aggregate_files": "small files are always joined up to blocksize, in file order",
    "categories": "dictionary-encoded columns come back as categories already (as Dask's)",
    "arrow_to_pandas": "the host target converts as dd.read_parquet does by default",
    "dataset": "files are planned from their footers, not as a pyarrow dataset",
    "read": "decoding is done by dask-gpudirect's own reader",
}


#: Values of those arguments that ask for nothing different: Dask's defaults, and
#: ``ignore_metadata_file=True``, which is what happens anyway (with Dask's ``False``, a
#: ``_metadata`` file is not read either: every file's footer is). Code that spells them out
#: runs.
AS_DASKS_DEFAULT: dict[str, tuple] = {
    "engine": (None,),
    "open_file_options": (None, {}),
    "ignore_metadata_file": (False, True),
    "metadata_task_size": (None,),
    "aggregate_files": (None,),
    "categories": (None,),
    "arrow_to_pandas": (None, {}),
    "dataset": (None, {}),
    "read": (None, {}),
}


def check_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse ``read_parquet``'s other ``kwargs``: Dask's by name with the reason (unless given
    their default), others as Python would."""
    for name, value in kwargs.items():
        if _is_dasks_default(name, value):
            continue
        if name in REFUSED:
            raise InputError(None, f"read_parquet(): {name}= is not supported: {REFUSED[name]}")
        raise OptionError(f"read_parquet() got an unexpected keyword argument {name!r}")


def _is_dasks_default(name: str, value: Any) -> bool:
    defaults = AS_DASKS_DEFAULT.get(name, ())
    return any(value is d or (type(value) is type(d) and value == d) for d in defaults)


#: ``split_row_groups`` values that mean partitions by bytes (``blocksize``), small files joined.
BY_BYTES = ("infer", "adaptive")


def row_groups_per_partition(split_row_groups: Any) -> int | None:
    """Dask's ``split_row_groups`` as row groups per partition: None for ``"infer"`` and
    ``"adaptive"`` (by ``blocksize``, small files joined), 1 for True, n for n, and for False
    a whole file (its kept row groups) each."""
    if isinstance(split_row_groups, str) and split_row_groups in BY_BYTES:
        return None
    if split_row_groups is True:
        return 1
    if split_row_groups is False:
        return sys.maxsize
    if isinstance(split_row_groups, numbers.Integral) and int(split_row_groups) > 0:  # NumPy too
        return int(split_row_groups)
    raise InputError(
        None,
        f"split_row_groups={split_row_groups!r}: use 'infer', 'adaptive', True, False or a "
        "positive number of row groups per partition",
    )


#: Dask's ``dtype_backend`` values: pandas' nullable types, or pyarrow-backed columns.
BACKENDS = (None, "numpy_nullable", "pyarrow")


@dataclasses.dataclass(frozen=True)
class Conversion:
    """How the host target makes pandas columns of Arrow ones, decided in the client as
    ``dd.read_parquet`` decides it: Dask's ``dtype_backend``, and its ``convert-string`` setting
    (strings as ``string[pyarrow]``, dates and decimals pyarrow-backed)."""

    dtype_backend: str | None = None
    pyarrow_strings: bool = False


#: pyarrow's own conversion (what a plan made without a client's settings uses).
PYARROW_DEFAULTS = Conversion()


def conversion(dtype_backend: Any, target: str) -> Conversion:
    """``dtype_backend`` as Dask takes it, for pandas partitions (the host target) only, with
    the client's ``dataframe.convert-string``."""
    if dtype_backend not in BACKENDS:
        raise InputError(
            None, f"dtype_backend={dtype_backend!r}: use None, 'numpy_nullable' or 'pyarrow'"
        )
    if dtype_backend is not None and target != "host":
        raise InputError(
            None,
            f"dtype_backend={dtype_backend!r} chooses pandas types, and target={target!r} gives "
            "cuDF partitions, whose columns hold nulls in every type already",
        )
    return Conversion(dtype_backend, pyarrow_strings_enabled())


def pandas_types(
    metadata: dict[bytes, bytes] | None, types: dict[str, pa.DataType]
) -> dict[bytes, bytes] | None:
    """``metadata`` with the pandas nullable dtype it stores for a column of ``types``
    (``Int32``) made the one of its type there (``Int64``; ``Float64`` for a float): pyarrow
    gives a column the dtype pandas stored, so a file's ``Int32`` would stay ``Int32`` cast
    to int64. Other dtypes stored are left: pyarrow takes those from the Arrow type."""
    if not metadata or b"pandas" not in metadata:
        return metadata
    stored = json.loads(metadata[b"pandas"])
    for column in stored.get("columns", []):
        kind = types.get(column.get("field_name", column.get("name")))
        if kind is not None and _NULLABLE.fullmatch(str(column.get("numpy_type"))):
            column["numpy_type"] = _nullable_name(kind)
    return {**metadata, b"pandas": json.dumps(stored).encode()}


#: pandas' nullable numeric dtypes, as its metadata names them.
_NULLABLE = re.compile(r"U?Int(8|16|32|64)|Float(32|64)")


def _nullable_name(kind: pa.DataType) -> str:
    """pandas' nullable dtype of a numeric Arrow type (``object``, for pyarrow to choose,
    where there is none)."""
    import pyarrow as pa

    if pa.types.is_integer(kind):
        return f"{'U' if pa.types.is_unsigned_integer(kind) else ''}Int{kind.bit_width}"
    if pa.types.is_floating(kind) and kind.bit_width in (32, 64):
        return f"Float{kind.bit_width}"
    return "object"


def check_filesystem(filesystem: Any) -> None:
    """Accept what names the local file system (None, ``"arrow"``, Dask's default
    ``"fsspec"``, pyarrow's or fsspec's local file system); refuse any other with the
    reason."""
    if filesystem is None or filesystem in ("arrow", "fsspec"):
        return
    kind = type(filesystem)
    if (kind.__module__, kind.__name__) in {
        ("pyarrow._fs", "LocalFileSystem"),
        ("fsspec.implementations.local", "LocalFileSystem"),
    }:
        return
    raise InputError(
        None,
        f"filesystem={filesystem!r} is not supported: dask-gpudirect reads local and "
        "network-mounted files itself (None, 'arrow' or a local file system only)",
    )


def extensions_of(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """``parquet_file_extension`` as suffixes, matched by case as Dask's; None or False:
    every file."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, tuple | list):  # True, 5: no suffixes (iterating them fails)
        raise InputError(None, f"parquet_file_extension={value!r}: give suffixes like '.parquet'")
    suffixes = tuple(str(v) for v in value)
    if not suffixes or not all(suffixes):
        raise InputError(None, f"parquet_file_extension={value!r}: give suffixes like '.parquet'")
    return suffixes
