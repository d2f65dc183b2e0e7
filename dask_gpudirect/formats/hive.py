"""Hive-partitioned folders: ``year=2024/month=1/part-0.parquet`` gives each row of that file
the columns ``year`` and ``month``, as Dask's Parquet reader gives them.

The keys come from every ``key=value`` folder in a file's path, as Dask takes them (pyarrow's
hive partitioning of each whole path): for a directory, a glob, a list of files or one file
alike, folders above the one named included; a key found twice in one path takes its outermost
value. As Dask types them, each is a category column whose categories are every value found,
integers (int32) where all of them are, else strings; ``__HIVE_DEFAULT_PARTITION__`` is a null.
Filters on them are decided per file at planning, so folders ruled out are never opened.
"""

from __future__ import annotations

import dataclasses
import decimal
import numbers
import os
import posixpath
import re
import urllib.parse
from typing import Any

from .. import filters, remote
from ..errors import InputError
from ..filters import Filters

#: What Hive (and Spark, and pyarrow) write for a null partition value.
NULL = "__HIVE_DEFAULT_PARTITION__"
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only, as pyarrow and Dask
_INT32 = (-(2**31), 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Partitioning:
    """The partition columns of a read, their categories, and each file's values."""

    names: tuple[str, ...]
    categories: dict[str, tuple]  # name -> every value found, sorted (ints or strs)
    integer: dict[str, bool]  # name -> whether its values are int32
    values: dict[str, dict[str, Any]]  # file -> name -> its value (None: null)

    def of(self, path: str) -> tuple[tuple[str, Any], ...]:
        """``path``'s (name, value) pairs, in column order."""
        return tuple((name, self.values[path][name]) for name in self.names)


#: The partitioning of files in no ``key=value`` folder.
UNPARTITIONED = Partitioning((), {}, {}, {})


def keys_of(path: str) -> list[tuple[str, str]]:
    """The ``key=value`` folders of ``path`` (of an HTTP(S) URL's path: not its query; of an
    S3 object's key, all of it), outermost first, each key once; of a local path, those of the
    folder the read opens (``y=1/../y=2/`` is ``y=2/``, ``link/..`` the link target's parent)."""
    if remote.scheme(path) == "s3":  # the key as stored: "#" and "?" are its letters too
        folders = posixpath.dirname(remote.s3_path(path)).split("/")
    elif remote.is_remote(path):  # http(s): each folder's name percent-encoded
        folders = posixpath.dirname(urllib.parse.urlsplit(path).path).split("/")
        folders = [urllib.parse.unquote(f) for f in folders]
    else:
        folders = _walked(os.path.dirname(path)).split(os.sep)
    pairs = [f.split("=", 1) for f in folders if "=" in f]
    keys: dict[str, str] = {}
    for k, v in pairs:
        keys.setdefault(urllib.parse.unquote(k), urllib.parse.unquote(v))
    return list(keys.items())


def _walked(folder: str) -> str:
    """``folder`` as the kernel walks it, by name: a ``..`` leaves the folder before it, or
    where that is a link, the link's target (as access.py takes it); the path keeps its
    ``..`` for the read, so the keys must be those of the folder the read opens."""
    if ".." not in folder.split(os.sep) or not os.path.isabs(folder):
        return os.path.normpath(folder)
    walked = os.sep
    for part in folder.split(os.sep):
        if part == "..":
            walked = os.path.dirname(os.path.realpath(walked) if os.path.islink(walked) else walked)
        elif part not in ("", "."):
            walked = os.path.join(walked, part)
    return walked


def partitioning(files: list[str]) -> Partitioning | None:
    """The partitioning of ``files``, or None where no file lies in a ``key=value`` folder.
    Every file must have the same keys, in any order (taken by name, as pyarrow and Dask take
    them): the columns come in the first file's."""
    found = {path: keys_of(path) for path in files}
    if not any(found.values()):
        return None
    first = files[0]
    names = tuple(k for k, _ in found[first])
    for path in files:
        keys = tuple(k for k, _ in found[path])
        if sorted(keys) != sorted(names):
            raise InputError(
                path,
                f"hive partition keys {list(keys)} differ from {list(names)} of {first}: every "
                "file must lie in folders of the same keys",
            )
    raw = {name: {v for pairs in found.values() for k, v in pairs if k == name} for name in names}
    integer = {name: _all_int32(values - {NULL}) for name, values in raw.items()}
    typed = {path: {k: _typed(v, integer[k]) for k, v in pairs} for path, pairs in found.items()}
    categories = {name: tuple(sorted({t[name] for t in typed.values()} - {None})) for name in names}
    return Partitioning(names, categories, integer, typed)


def _all_int32(values: set[str]) -> bool:
    return bool(values) and all(
        _INTEGER.fullmatch(v) and _INT32[0] <= int(v) <= _INT32[1] for v in values
    )


def _typed(value: str, integer: bool) -> Any:
    if value == NULL:
        return None
    return int(value) if integer else value


def keep(pairs: tuple[tuple[str, Any], ...], filters: Filters | None) -> tuple[bool, Any]:
    """Whether a file whose partition values are ``pairs`` can hold rows ``filters`` keep, and
    the filters its rows still need (terms on partition columns decided here; None: all rows).

    A conjunction with a false partition term is dropped; one whose terms were all partition
    terms keeps every row of the file.
    """
    if filters is None:
        return True, None
    values = dict(pairs)
    left = []
    for conjunction in filters:
        decided = [t for t in conjunction if t[0] in values]
        if not all(_holds(values[c], op, v) for c, op, v in decided):
            continue
        rest = [t for t in conjunction if t[0] not in values]
        if not rest:
            return True, None
        left.append(rest)
    return bool(left), left or None


def _holds(value: Any, op: str, operand: Any) -> bool:
    """One filter term on a partition value, with Dask's null rules (see filters.py)."""
    if op in ("is", "is not"):  # with None: the null partition, or every other
        return (value is None) == (op == "is")
    if value is None and op in filters.KEEP_NULLS:
        return True
    operands = list(operand) if op in ("in", "not in") else [operand]
    for o in operands:
        if value is not None and o is not None and not _comparable(value, o):
            kind = "strings" if isinstance(value, str) else "integers"
            raise InputError(
                None, f"filter ({op!r}, {operand!r}) on a partition column whose values are {kind}"
            )
    if op in ("in", "not in"):
        found = value in operands if value is not None else None in operands
        return found if op == "in" else not found
    return value is not None and bool(filters.COMPARE[op](value, operand))


def _comparable(value: Any, operand: Any) -> bool:
    """Whether a filter's ``operand`` compares with a partition value (a str or an int): a
    str with a str, an int with a number, numpy's too. A bool is no number here, as pyarrow
    and Dask refuse it (True, numpy's too, matched the value 1); nor is a timestamp (it failed
    the planning with a TypeError)."""
    if isinstance(value, str):
        return isinstance(operand, str)
    return isinstance(operand, (numbers.Real, decimal.Decimal)) and not isinstance(operand, bool)
