"""What a shard was planned from, checked again on the open file before and after each read.

A plan is made from a file's size, its footer or header and its statistics. If the file is
rewritten afterwards, reading the old plan's byte ranges out of the new file gives wrong rows
without any error (or a misleading one), and a persisted result recomputed after a worker loss
would mix two versions. So each shard carries a :class:`Stamp`: the size, the modification
times seen when it was planned (one per copy where nodes hold copies), and a checksum of the
bytes the plan was made from (a Parquet footer, a ``.npy`` header). A read that finds any of them
changed fails with an InputError naming the file.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import zlib
from collections.abc import Iterable

from .access import Opened, Source, pread_exact
from .errors import InputError

CHANGED = "changed since it was planned ({}): read it again with dg.read_* to plan the new version"


@dataclasses.dataclass(frozen=True)
class Stamp:
    """A file as it was planned: ``size`` bytes, modified at one of ``mtimes`` (ns), and the
    ``probe`` range ``(offset, length)`` whose CRC-32 was ``crc`` (none for raw files); a
    remote object's ``version`` is its ETag (or Last-Modified)."""

    size: int
    mtimes: frozenset[int]
    probe: tuple[int, int] | None = None
    crc: int | None = None
    version: str | None = None

    def seen_as(self, mtimes: Iterable[int]) -> Stamp:
        """This stamp, also admitting the modification times other workers saw (copies of the
        file on other nodes)."""
        return dataclasses.replace(self, mtimes=self.mtimes | frozenset(mtimes))


def take(file: Source, probe: tuple[int, int] | None = None, data: bytes | None = None) -> Stamp:
    """The stamp of ``file``; ``data`` is the probe's bytes if the caller already read them."""
    crc = None
    if probe is not None:
        crc = zlib.crc32(pread_exact(file, probe[1], probe[0]) if data is None else data)
    return Stamp(
        size=file.stat.st_size,
        mtimes=frozenset({file.stat.st_mtime_ns}),
        probe=probe,
        crc=crc,
        version=getattr(file, "version", None),  # a remote object's (remote.Object)
    )


def check_version(stamp: Stamp, url: str, size: int, version: str) -> None:
    """Raise an InputError if the remote object ``url`` is no longer the one ``stamp`` was
    taken of (its size or version differ)."""
    if size != stamp.size:
        raise InputError(url, CHANGED.format(f"{stamp.size} bytes then, {size} now"))
    if not same_version(stamp.version, version):
        raise InputError(url, CHANGED.format(f"{stamp.version} then, {version} now"))


def same_version(then: str | None, now: str | None) -> bool:
    """Whether a remote object's versions ``then`` and ``now`` are one: ETags by RFC 9110's
    weak comparison, their opaque tags equal whether or not ``W/`` marks either weak (nginx and
    CDNs give a HEAD ``W/"abc"`` where the GET gets ``"abc"``)."""
    return _opaque(then) == _opaque(now)


def _opaque(version: str | None) -> str | None:
    return version.removeprefix("W/") if version else version


def check_probe(stamp: Stamp, file: Source) -> None:
    """Raise an InputError if the bytes the plan was made from (a footer, a header) differ
    now: what tells a rewrite that kept the size and the modification time (or, on an HTTP
    server without ETags, its second)."""
    if stamp.probe is not None:
        offset, length = stamp.probe
        if zlib.crc32(pread_exact(file, length, offset)) != stamp.crc:
            raise InputError(file.path, CHANGED.format(f"bytes {offset}-{offset + length} differ"))


def check(stamp: Stamp | None, file: Opened) -> None:
    """Raise an InputError if ``file`` is no longer what ``stamp`` was taken of."""
    if stamp is None:  # a raw range read, not planned from the file (the probe's)
        return
    now = os.fstat(file.fd)
    if now.st_size != stamp.size:
        raise InputError(file.path, CHANGED.format(f"{stamp.size} bytes then, {now.st_size} now"))
    if now.st_mtime_ns not in stamp.mtimes:
        then = ", ".join(_when(t) for t in sorted(stamp.mtimes))
        now_at = _when(now.st_mtime_ns)
        raise InputError(file.path, CHANGED.format(f"modified at {then}, now at {now_at}"))
    check_probe(stamp, file)


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(
        timespec="microseconds"
    )
