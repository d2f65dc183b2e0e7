"""Shards: the unit of loading. A shard is some byte ranges of one file plus how to decode them.

Planning (client) turns paths into shards without reading data; :func:`load` (worker) reads a
shard's ranges onto the worker's target and decodes them. Formats add a ``part`` with a
``decode(target, buffer)`` method; everything else about a shard is format-agnostic.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from . import access
from .errors import InputError


class Part(Protocol):
    """What a format knows about one shard: how to turn its bytes into a table or array."""

    def decode(self, target: Any, buffer: Any) -> Any: ...

    def label(self) -> str | None:
        """Which piece of the file this is, where the first byte range does not say."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """Byte ranges of one file, read into one buffer, decoded by ``part``.

    ``ranges`` are ``(file_offset, length)`` pairs; byte ``file_offset`` lands at buffer position
    ``file_offset - base`` in a buffer of ``size`` bytes. ``worker`` is set by placement.
    """

    path: str
    ranges: tuple[tuple[int, int], ...]
    base: int
    size: int
    part: Part
    target: str = "host"
    worker: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes this shard reads from storage."""
        return sum(length for _, length in self.ranges)

    @property
    def name(self) -> str:
        """Short label for logs and the ledger."""
        label = self.part.label() if self.part is not None else None  # the probe's raw reads
        where = label or (self.ranges[0][0] if self.ranges else 0)
        return f"{os.path.basename(self.path)}@{where}"


def load(shard: Shard) -> Any:
    """Task body: read ``shard`` on this worker's target and decode it."""
    from .plugin import current_plugin

    access.check(shard.path)  # the worker's own roots: the client's planning is not trusted
    target = current_plugin().target(shard.target)
    buffer = target.read(shard)
    try:
        return shard.part.decode(target, buffer)
    except InputError:
        raise
    except (OSError, ValueError, RuntimeError) as exc:  # how pyarrow and libcudf report bad data
        raise InputError(
            shard.path, f"cannot decode {shard.name}: {type(exc).__name__}: {exc}"
        ) from exc


def expand_paths(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """A file, a directory (its visible files, sorted), a glob, or a list of those -> file paths."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[str] = []
    for entry in paths:
        entry = os.fspath(entry)
        if glob.has_magic(entry):
            matched = sorted(p for p in glob.glob(entry) if os.path.isfile(p))
            if not matched:
                raise InputError(entry, "no files match this pattern")
            files.extend(matched)
        elif os.path.isdir(entry):
            matched = sorted(
                os.path.join(entry, name)
                for name in os.listdir(entry)
                if not name.startswith((".", "_")) and os.path.isfile(os.path.join(entry, name))
            )
            if not matched:
                raise InputError(entry, "directory holds no data files")
            files.extend(matched)
        elif os.path.exists(entry):
            files.append(entry)
        else:
            raise InputError(entry, "no such file or directory")
    if not files:
        raise InputError(None, "no paths given")
    return [os.path.abspath(f) for f in files]


def coalesce(ranges: Sequence[tuple[int, int]], gap: int = 0) -> tuple[tuple[int, int], ...]:
    """Sort ``(offset, length)`` ranges and merge those that touch or lie within ``gap`` bytes."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset <= merged[-1][0] + merged[-1][1] + gap:
            end = max(merged[-1][0] + merged[-1][1], offset + length)
            merged[-1][1] = end - merged[-1][0]
        else:
            merged.append([offset, length])
    return tuple((o, n) for o, n in merged if n > 0)


def open_error(path: str, exc: OSError) -> InputError:
    """A planning-time OSError as an :class:`InputError` that says what is wrong with the file."""
    if isinstance(exc, FileNotFoundError):
        return InputError(path, "no such file")
    if isinstance(exc, PermissionError):
        return InputError(path, "permission denied: the file is not readable")
    if isinstance(exc, IsADirectoryError):
        return InputError(path, "is a directory, not a file")
    return InputError(path, f"cannot read: {exc.strerror or exc}")
