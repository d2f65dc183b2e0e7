"""Remote entries listed once, on the client: every worker reads a remote object alike.

A local path is listed by every worker (each sees its own disks, :mod:`.discovery`); an
``s3://`` prefix or glob is the same bucket for all, so one ListObjectsV2 walk here stands for
every worker's view, and placement then balances the objects' bytes over all workers. Listing
follows the rules of a local directory read (:meth:`.discovery.Listing.hidden`, ``takes``; every
read's files are ordered by :func:`.discovery.merge`); a glob matches one key segment per pattern
segment, as ``glob.glob`` does one path component, and ``**`` any number of them. HTTP(S) has
no listing: a URL names one file.
"""

from __future__ import annotations

import fnmatch
import glob
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from . import remote
from .discovery import DIRECTORY, FILE, GLOB, Listing, View
from .errors import InputError

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def views(
    entries: list[str], seen: dict[str, list[View]], listing: Listing, store: remote.Store
) -> dict[str, list[View]]:
    """Every worker's views of ``entries``: ``seen`` holds each worker's views of the local
    ones, in order; each remote entry is listed here once and seen alike by every worker,
    ``gpudirect.remote.connections`` of them at once (a URL each is a request each)."""
    urls = [e for e in entries if remote.is_remote(e)]
    listed: dict[str, View] = {}
    if urls:
        threads = min(len(urls), remote.Settings.current().connections)
        with ThreadPoolExecutor(threads, thread_name_prefix="gpudirect-listing") as pool:
            found = pool.map(lambda entry: view(entry, listing, store), urls)
            listed = dict(zip(urls, found, strict=True))
    merged = {}
    for worker, local in seen.items():
        rest = iter(local)
        merged[worker] = [listed[e] if e in listed else next(rest) for e in entries]
    return merged


def view(entry: str, listing: Listing, store: remote.Store) -> View:
    """What a remote ``entry`` is: one object, a prefix's objects or a glob's matches, each
    ``(url, size, 0, 0)`` (a remote object's version stands for its modification time)."""
    if remote.scheme(entry) != "s3":
        # the path alone: an IPv6 host's brackets are no pattern
        if entry.endswith("/") or glob.has_magic(urllib.parse.urlsplit(entry).path):
            raise InputError(entry, "HTTP(S) has no listing: name each file's URL")
        with remote.opened(entry, store) as obj:
            return View(FILE, ((entry, obj.stat.st_size, 0, 0),))
    import pyarrow.fs as pafs

    path = remote.s3_path(entry).rstrip("/")
    fs = remote.filesystem(store)
    try:
        info = fs.get_file_info(path)
        # a key that exists as written is that object, brackets and all ("a[1].npy"), not a
        # pattern that may match another ("a1.npy"): the rule of a local path
        if info.type == pafs.FileType.NotFound and glob.has_magic(path):
            return View(GLOB, _globbed(entry, fs, path))
        if info.type == pafs.FileType.File and entry.endswith("/"):
            # "p/" names the prefix: where "p" is an object too (S3 holds both), the objects
            # under it; else that object, as a local "file/" names the file
            under = pafs.FileSelector(path, allow_not_found=True)
            if fs.get_file_info(under):
                return View(DIRECTORY, _listed(fs, path, listing))
        if info.type == pafs.FileType.File:
            return View(FILE, ((entry.rstrip("/"), info.size, 0, 0),))
        if info.type == pafs.FileType.Directory:
            return View(DIRECTORY, _listed(fs, path, listing))
    except (OSError, ValueError) as exc:  # ValueError: pyarrow's ArrowInvalid ("a//b")
        raise remote.error(entry, exc, store) from None
    raise remote.error(entry, FileNotFoundError(entry), store)


def _listed(
    fs: pafs.S3FileSystem, prefix: str, listing: Listing
) -> tuple[tuple[str, int, int, int], ...]:
    """The objects under ``prefix`` a read of it takes."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(prefix, recursive=listing.recursive)
    found = []
    for info in fs.get_file_info(selector):
        parts = info.path[len(prefix) + 1 :].split("/")
        if info.type != pafs.FileType.File or any(map(Listing.hidden, parts)):
            continue
        if listing.takes(parts[-1]):
            found.append(("s3://" + info.path, info.size, 0, 0))
    return tuple(found)


def _globbed(
    entry: str, fs: pafs.S3FileSystem, pattern: str
) -> tuple[tuple[str, int, int, int], ...]:
    """The objects matching ``pattern`` (``bucket/a/*/b*.parquet``)."""
    import pyarrow.fs as pafs

    segments = pattern.split("/")
    fixed = next(i for i, s in enumerate(segments) if glob.has_magic(s))
    if fixed == 0:
        raise InputError(entry, "a bucket name cannot be a pattern")
    base, wanted = "/".join(segments[:fixed]), segments[fixed:]
    deep = len(wanted) > 1 or "**" in wanted
    selector = pafs.FileSelector(base, recursive=deep, allow_not_found=True)
    found = []
    for info in fs.get_file_info(selector):
        parts = info.path[len(base) + 1 :].split("/")
        if info.type == pafs.FileType.File and _matched(parts, wanted):
            found.append(("s3://" + info.path, info.size, 0, 0))
    if not found and fs.get_file_info(base.split("/")[0]).type == pafs.FileType.NotFound:
        raise InputError(entry, f"no such bucket {base.split('/')[0]!r}")
    return tuple(found)


def _matched(parts: list[str], wanted: list[str]) -> bool:
    """Whether a key's segments match the pattern's, ``glob.glob(recursive=True)``'s way: a
    ``**`` segment any number of folders (none too), but no hidden one."""
    if not wanted:
        return not parts
    if wanted[0] == "**":
        return _matched(parts, wanted[1:]) or (
            len(parts) > 0 and not parts[0].startswith(".") and _matched(parts[1:], wanted)
        )
    return len(parts) > 0 and _matches(parts[0], wanted[0]) and _matched(parts[1:], wanted[1:])


def _matches(name: str, pattern: str) -> bool:
    """``glob``'s rule for one segment: a hidden name only where the pattern starts with ``.``."""
    return fnmatch.fnmatchcase(name, pattern) and (not name.startswith(".") or pattern[0] == ".")
