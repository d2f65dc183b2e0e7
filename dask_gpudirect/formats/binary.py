"""Binary shards: raw fixed-size records or ``.npy`` files, records along axis 0.

Raw files need ``dtype`` and a per-record ``shape``; ``.npy`` files carry both in their header.
C-order data is cut into runs of whole records of about ``blocksize`` bytes; a Fortran-order
``.npy`` file is one shard, since its records are not contiguous. Small local C-order files are
joined into chunks of about ``blocksize`` (:func:`joins`), read into one buffer.
"""

from __future__ import annotations

import dataclasses
import io
import math
import operator
import tokenize
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from .. import remote, stamps
from ..access import Source
from ..errors import InputError
from ..shards import Shard

if TYPE_CHECKING:
    from ..targets import Order, Target

NPY_MAGIC = b"\x93NUMPY"


@dataclasses.dataclass(frozen=True)
class BinaryPart:
    """Dtype, shape and memory order of the array a shard's bytes hold."""

    dtype: np.dtype
    shape: tuple[int, ...]
    order: Order = "C"

    def label(self) -> None:
        """None: a binary shard's first byte range is where its records start."""

    def decode(self, target: Target, buffer: Any) -> Any:
        return target.as_array(buffer, self.dtype, self.shape, self.order)


def joins(shard: Shard) -> bool:
    """Whether ``shard`` may share a chunk with its neighbours: its records read end to end
    with theirs into one buffer are one C-order array. A Fortran-order file's records are not
    contiguous; a remote object is read alone, by its own range requests."""
    return shard.part.order == "C" and not remote.is_remote(shard.path)


def joined(parts: Sequence[BinaryPart]) -> BinaryPart:
    """The part of a chunk of C-order shards (:func:`joins`): their records, end to end."""
    first = parts[0]
    records = sum(part.shape[0] for part in parts)
    return BinaryPart(first.dtype, (records, *first.shape[1:]), first.order)


@dataclasses.dataclass(frozen=True)
class BinaryPlan:
    shards: list[Shard]
    dtype: np.dtype
    record_shape: tuple[int, ...]
    first: str  # the file the others were checked against
    npy: bool  # .npy files, not raw ones

    def check_against(self, head: BinaryPlan) -> None:
        _check_kind(self.first, self.npy, head.first, head.npy)
        _check_records(
            self.first, self.dtype, self.record_shape, head.first, head.dtype, head.record_shape
        )

    def joined(self, plans: Sequence[BinaryPlan]) -> BinaryPlan:
        return dataclasses.replace(self, shards=[s for p in plans for s in p.shards])


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where a file's array data lies and what it holds."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    order: Order
    npy: bool  # from a .npy header, not from dtype= and shape=


def fixed_dtype(dtype: DTypeLike, path: str | None) -> np.dtype:
    """``dtype`` as a NumPy dtype of fixed-size records, or an InputError naming ``path``."""
    try:
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:  # ("f4", -1): a ValueError
        raise InputError(path, f"bad dtype {dtype!r}: {exc}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise InputError(path, f"dtype {dtype} is not a fixed-size type")
    return dtype


def _read_header_3_0(
    f: IO[bytes], version: tuple[int, int], max_header_size: int
) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Header of a version 3.0 ``.npy`` (utf-8 field names): NumPy has no public reader for it,
    and NumPy 2 moved the private one from ``np.lib.format`` to ``np.lib._format_impl``."""
    read = getattr(np.lib.format, "_read_array_header", None)
    if read is None:
        from numpy.lib import _format_impl

        read = _format_impl._read_array_header  # type: ignore[attr-defined]  # private: untyped
    return read(f, version, max_header_size=max_header_size)


def _npy_header(file: Source) -> bytes:
    """The magic, version, length and header dict of a ``.npy`` file (what its layout is
    planned from), or as much of it as the file holds."""
    start = file.pread(12, 0)
    if start[6:7] == b"\x01":  # version 1: a 2-byte length; later versions: 4 bytes
        end = 10 + int.from_bytes(start[8:10], "little")
    else:
        end = 12 + int.from_bytes(start[8:12], "little")
    return file.pread(min(end, file.stat.st_size), 0)


def _npy_layout(path: str, size: int, header: bytes) -> _Layout:
    f = io.BytesIO(header)
    # NumPy's readers refuse headers over 10,000 bytes (np.load's guard against untrusted
    # files, lifted there by max_header_size=): a structured dtype of a few hundred fields,
    # which np.save writes, has one. The header is in memory already, read to its end.
    limit = max(len(header), 10000)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, limit)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, limit)
        else:
            shape, fortran, dtype = _read_header_3_0(f, version, limit)
    except (ValueError, SyntaxError, TypeError, EOFError, tokenize.TokenError) as exc:
        raise InputError(path, f"bad .npy header: {exc}") from None
    offset = f.tell()
    dtype = fixed_dtype(dtype, path)
    if len(shape) == 0:
        raise InputError(path, "0-d .npy array has no records along axis 0")
    if any(n < 0 for n in shape):
        raise InputError(path, f"bad .npy header: shape {shape} has a negative size")
    data = math.prod(shape) * dtype.itemsize
    if size - offset < data:
        raise InputError(
            path, f"truncated .npy: header says {data} data bytes, file holds {size - offset}"
        )
    order: Order = "F" if fortran and len(shape) > 1 else "C"
    return _Layout(offset, dtype, tuple(shape), order, npy=True)


def _raw_layout(path: str, size: int, dtype: np.dtype, record_shape: tuple[int, ...]) -> _Layout:
    record = dtype.itemsize * math.prod(record_shape)
    if size == 0:
        raise InputError(path, "empty file (0 bytes)")
    if record == 0 or size % record:
        raise InputError(
            path,
            f"{size} bytes is not a whole number of {record}-byte records "
            f"(dtype={dtype}, shape={record_shape})",
        )
    return _Layout(0, dtype, (size // record, *record_shape), "C", npy=False)


def _layout(
    path: str,
    dtype: DTypeLike | None,
    shape: tuple[int, ...] | None,
    store: remote.Store | None,
) -> tuple[_Layout, stamps.Stamp]:
    """What ``path`` holds, from one open (allowed roots checked on it; a remote object's
    ``store``), and its stamp."""
    with remote.opened(path, store) as f:
        # a file of another name is a .npy by its magic, unless dtype= says to read it raw
        # (records that happen to start with those bytes, or a .npy's bytes as np.fromfile)
        if path.endswith(".npy") or (dtype is None and f.pread(len(NPY_MAGIC), 0) == NPY_MAGIC):
            header = _npy_header(f)
            layout = _npy_layout(path, f.stat.st_size, header)
            stamp = stamps.take(f, (0, len(header)), header)
        else:
            if dtype is None:
                raise InputError(
                    path,
                    "raw binary file (no .npy header): pass dtype= (and shape= for each "
                    "record) to read raw files; one read takes .npy files or raw ones, not both",
                )
            fixed = fixed_dtype(dtype, path)
            # a subarray dtype (("f4", (3, 4))) adds its shape to each record's, as NumPy's
            record_shape = (*(shape or ()), *fixed.shape)
            layout = _raw_layout(path, f.stat.st_size, fixed.base, record_shape)
            return layout, stamps.take(f)
    if dtype is not None and np.dtype(dtype) != layout.dtype:
        raise InputError(path, f".npy holds {layout.dtype}, but dtype={np.dtype(dtype)} was given")
    if shape is not None and tuple(shape) != layout.shape[1:]:
        raise InputError(path, f".npy records have shape {layout.shape[1:]}, not {tuple(shape)}")
    return layout, stamp


def plan(
    files: list[str],
    dtype: DTypeLike | None,
    shape: int | Sequence[int] | None,
    blocksize: int,
    target: str,
    store: remote.Store | None = None,
) -> BinaryPlan:
    """Shards of whole records per file; all files must hold one dtype and record shape.
    ``store``: how to reach remote objects."""
    record_shape = checked_shape(shape)
    shards: list[Shard] = []
    first: _Layout | None = None
    for path in files:
        layout, stamp = _layout(path, dtype, record_shape, store)
        first = first or layout
        _check_kind(path, layout.npy, files[0], first.npy)
        _check_records(path, layout.dtype, layout.shape[1:], files[0], first.dtype, first.shape[1:])
        shards.extend(_file_shards(path, layout, stamp, blocksize, target, store))
    assert first is not None, "plan takes one file or more"
    return BinaryPlan(shards, first.dtype, first.shape[1:], files[0], first.npy)


def checked_shape(shape: int | Sequence[int] | None) -> tuple[int, ...] | None:
    """``shape=`` as a record shape (a size, or a sequence of them), or an InputError."""
    if shape is None:
        return None
    sizes: tuple[Any, ...]
    try:
        if isinstance(shape, bool):  # not the size 1
            raise TypeError
        sizes = (operator.index(shape),)  # type: ignore[arg-type]
    except TypeError:
        try:
            sizes = tuple(shape)  # type: ignore[arg-type]
        except TypeError:  # a float, a 0-d array
            sizes = (shape,)
    if any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0 for n in sizes):
        raise InputError(None, f"bad shape {shape!r}: a record shape is a tuple of sizes >= 0")
    return tuple(int(n) for n in sizes)


def _check_kind(path: str, npy: bool, first: str, first_npy: bool) -> None:
    """One read takes .npy files or raw ones: a raw file among .npy files is most likely a
    stray one (a checksum, a README) that ``dtype=`` would read as records."""
    if npy != first_npy:
        raw, npy_file = (first, path) if npy else (path, first)
        raise InputError(
            raw,
            f"a raw file (no .npy header) read with .npy files ({npy_file}): one read "
            "takes one kind",
        )


def _check_records(
    path: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    first: str,
    first_dtype: np.dtype,
    first_shape: tuple[int, ...],
) -> None:
    if (dtype, shape) != (first_dtype, first_shape):
        raise InputError(
            path,
            f"holds {dtype} records of shape {shape}, but {first} "
            f"holds {first_dtype} records of shape {first_shape}",
        )


def _file_shards(
    path: str,
    layout: _Layout,
    stamp: stamps.Stamp,
    blocksize: int,
    target: str,
    store: remote.Store | None,
) -> list[Shard]:
    n, record_shape = layout.shape[0], layout.shape[1:]
    record = layout.dtype.itemsize * math.prod(record_shape)
    store = remote.store_of(path, store)
    step = n if layout.order == "F" else max(1, blocksize // max(record, 1))
    shards = []
    for start in range(0, max(n, 1), max(step, 1)):
        count = min(step, n - start)
        offset = layout.offset + start * record
        shards.append(
            Shard(
                path=path,
                ranges=((offset, count * record),),
                part=BinaryPart(layout.dtype, (count, *record_shape), layout.order),
                target=target,
                stamp=stamp,
                store=store,
            )
        )
    return shards
