"""Shards: the unit of loading. A shard is some byte ranges of one file plus how to decode them.

Planning (on workers that see the files) turns paths into shards without reading data;
The task bodies that read shards on a worker are in :mod:`dask_gpudirect.loading`; here is the
data type alone. Formats add a ``part`` that knows how to decode; everything else about a shard
is format-agnostic.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import os
import pickle
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Protocol, Self, TypeVar

from dask.base import normalize_token

from .errors import InputError
from .remote import Store
from .stamps import Stamp


@dataclasses.dataclass(frozen=True)
class Shard:
    """Byte ranges of one file, read end to end into one buffer, decoded by ``part``.

    ``ranges`` are ``(file_offset, length)`` pairs, sorted, and the buffer holds them alone
    (:attr:`nbytes`; :attr:`layout` says where a byte of the file lies in it): a shard of a few
    row groups of a large file costs their bytes, not the file's. ``stamp`` is the file as
    planned, checked again by every read. ``worker`` is set by placement, and ``readers``: the
    workers that found every file of the shard's partition, which may read it when ``worker``
    has left (none where every worker found them: then any worker may). ``store`` says how to
    reach a remote object (``s3://``, ``http(s)://``); its repr leaves the credentials out.
    """

    path: str
    ranges: tuple[tuple[int, int], ...]
    # what the format knows of the shard: how to decode it (formats.binary.BinaryPart,
    # formats.parquet.ParquetPart), and its label()
    part: Any
    target: str = "host"
    worker: str | None = None
    stamp: Stamp | None = None
    store: Store | None = None
    readers: tuple[str, ...] = ()

    def __dask_tokenize__(self) -> bytes:
        """What Dask names a read's tasks by: the pickled shard. Dask's own walk over every
        field of every shard takes a quarter of a second for 256 files; a pickle is one pass
        in C, and equal shards still give equal names."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @property
    def nbytes(self) -> int:
        """Bytes this shard reads from storage."""
        return sum(length for _, length in self.ranges)

    @property
    def layout(self) -> Layout:
        """Where each of ``ranges`` lies in the shard's buffer."""
        return Layout(self.ranges)

    @property
    def decoded_bytes(self) -> int:
        """About this shard's bytes in memory once decoded: what its part says (a Parquet
        part: from its footer), else the bytes it reads."""
        return getattr(self.part, "decoded", 0) or self.nbytes

    @property
    def name(self) -> str:
        """Short label for logs and the ledger."""
        where = self.part.label() or (self.ranges[0][0] if self.ranges else 0)
        return f"{os.path.basename(self.path)}@{where}"


class Layout:
    """Byte ranges of a file laid end to end in one buffer: where each lies in it."""

    def __init__(self, ranges: Sequence[tuple[int, int]]):
        self.ranges = ranges
        self.offsets = list(itertools.accumulate((n for _, n in ranges), initial=0))
        self._starts = [o for o, _ in ranges]

    def at(self, offset: int, length: int) -> int:
        """Where the file's bytes ``offset .. offset + length`` lie in the buffer; ValueError
        unless they lie in one range."""
        k = bisect.bisect_right(self._starts, offset) - 1
        if k < 0 or offset + length > self._starts[k] + self.ranges[k][1]:
            raise ValueError(f"bytes {offset}..{offset + length} lie outside the ranges read")
        return self.offsets[k] + offset - self._starts[k]

    def pieces(self, size: int | None = None) -> list[tuple[int, int, int]]:
        """The reads of at most ``size`` bytes (None: a range each) that fill the buffer:
        ``(file offset, buffer offset, bytes)`` each."""
        return [
            (o + k, at + k, min(size or n, n - k))
            for (o, n), at in zip(self.ranges, self.offsets, strict=False)
            for k in range(0, n, size or max(n, 1))
        ]


class Partition(tuple):
    """The shards one read task loads (a partition), named by Dask as one pickle: what they
    share (a hive key's categories, every folder's value) is then pickled once, where a token
    per shard pickled it once a shard (time that grew with the square of the folders: 1.7 s of
    5,000)."""

    __slots__ = ()


@normalize_token.register(Partition)
def _partition_token(partition: Partition) -> bytes:
    return pickle.dumps(tuple(partition), protocol=pickle.HIGHEST_PROTOCOL)


@contextlib.contextmanager
def decoding(*shards: Shard) -> Iterator[None]:
    """Decode errors as an :class:`InputError` naming the file (of ``shards``, the first)."""
    try:
        yield
    except (InputError, MemoryError):
        raise
    # pyarrow and libcudf report bad data in many types (ArrowException, OSError, ValueError,
    # RuntimeError, TypeError...): whichever it is, the user learns which file and shard
    except Exception as exc:
        names = ", ".join(s.name for s in shards)
        raise InputError(
            shards[0].path, f"cannot decode {names}: {type(exc).__name__}: {exc}"
        ) from exc


class Plan(Protocol):
    """A format's plan of some files: their shards, and what every file must agree on."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # each format's plan is a (frozen) dataclass

    @property
    def shards(self) -> list[Shard]: ...

    @property
    def first(self) -> str:
        """The first file planned: the one the others were checked against."""
        ...

    def check_against(self, head: Self) -> None:
        """Raise an InputError naming ``self.first`` if its files disagree with ``head``'s."""

    def joined(self, plans: Sequence[Self]) -> Self:
        """One plan of ``plans`` (checked against this one, the first), their shards in order."""


#: One format's plan (a :class:`Plan`): what planning a format's files gives back.
P = TypeVar("P", bound=Plan)


def combine(plans: Sequence[P | InputError]) -> P:
    """One plan from the plans of single files, in file order, as if planned in one pass: the
    first file's error, or the first file that disagrees with the first, is raised."""
    checked: list[P] = []
    for plan in plans:
        if isinstance(plan, InputError):
            raise plan
        plan.check_against(checked[0] if checked else plan)
        checked.append(plan)
    return checked[0].joined(checked)


def shared(shards: list[Shard]) -> list[Shard]:
    """``shards`` with their equal parts made one object: the columns and file layout of
    every ``ParquetPart``, the target of every shard, planned apart by the workers, arrive as
    copies. Pickle writes an object once however often it appears, so the shards of a
    partition of 128 small files pickle to about half the bytes and load three times as fast:
    on the client that sends the graph, the scheduler that takes it in, and the worker that
    runs the read."""
    seen: dict[Any, Any] = {}
    names: dict[type, tuple[str, ...]] = {}  # each class's fields, looked up once, not once a shard

    def one(value: Any) -> Any:
        if isinstance(value, tuple):
            try:  # made one already: walked once, not once a shard (a hive key's categories,
                return seen[(tuple, value)]  # every file's value, are in every shard)
            except (KeyError, TypeError):
                value = tuple(one(item) for item in value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            kind = type(value)
            if kind not in names:
                names[kind] = tuple(f.name for f in dataclasses.fields(value) if f.init)
            fields = names[kind]
            return dataclasses.replace(
                value, **{name: one(getattr(value, name)) for name in fields}
            )
        elif not isinstance(value, str):
            return value
        try:
            return seen.setdefault((type(value), value), value)
        except TypeError:  # holds something unhashable (a filter's list)
            return value

    return [one(shard) for shard in shards]


def coalesce(ranges: Sequence[tuple[int, int]], gap: int) -> tuple[tuple[int, int], ...]:
    """Sort ``(offset, length)`` ranges and merge those that touch or lie within ``gap`` bytes."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset <= merged[-1][0] + merged[-1][1] + gap:
            end = max(merged[-1][0] + merged[-1][1], offset + length)
            merged[-1][1] = end - merged[-1][0]
        else:
            merged.append([offset, length])
    return tuple((o, n) for o, n in merged if n > 0)
