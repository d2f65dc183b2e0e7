"""Finding the files: every worker lists what it sees, so data on one node's own disk is found.

The client makes the user's paths absolute and each worker expands them in its own file system
(a glob, a directory's data files, or a file). A file counts for a worker when its allowed roots
admit it. The client merges the views into the files in the order of the paths, and for each
worker the files it can read; the client itself need not see any of them.

One path with different sizes on two workers is two different files that share a name: node-local
datasets need file names unique across nodes (or identical copies), and we say so rather than mix
them up.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from .access import allowed
from .errors import InputError

#: What a path turned out to be on one worker.
GLOB, DIRECTORY, FILE, MISSING = "glob", "directory", "file", "missing"


@dataclass(frozen=True)
class View:
    """One path as one worker sees it: what it is there, and its files as ``(path, size)``."""

    kind: str
    files: tuple[tuple[str, int], ...] = ()
    refused: tuple[str, ...] = ()  # files that exist there but lie outside the allowed roots


@dataclass
class Found:
    """The merged views: ``files`` in path order, and the files each worker can read."""

    files: list[str] = field(default_factory=list)
    readable: dict[str, set[str]] = field(default_factory=dict)


def absolute(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The user's paths as absolute strings (relative ones against the client's directory)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    entries = [os.path.abspath(os.fspath(p)) for p in paths]
    if not entries:
        raise InputError(None, "no paths given")
    return entries


def data_files(directory: str) -> list[str]:
    """The files a read of ``directory`` takes, sorted: not those starting with ``.`` or ``_``
    (hidden files, ``_metadata``, ``_SUCCESS``)."""
    return sorted(
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if not name.startswith((".", "_")) and os.path.isfile(os.path.join(directory, name))
    )


def view(entry: str) -> View:
    """``entry`` as this process sees it (run on each worker)."""
    try:
        if glob.has_magic(entry):
            kind, candidates = GLOB, sorted(p for p in glob.glob(entry) if os.path.isfile(p))
        elif os.path.isdir(entry):
            kind, candidates = DIRECTORY, data_files(entry)
        elif os.path.exists(entry):
            kind, candidates = FILE, [entry]
        else:
            return View(MISSING)
        files = tuple((p, os.path.getsize(p)) for p in candidates if allowed(p))
    except OSError:  # a directory this process may not list, a file gone meanwhile
        return View(MISSING)
    return View(kind, files, tuple(p for p in candidates if not allowed(p)))


def views(entries: list[str]) -> list[View]:
    """Every entry as this worker sees it."""
    return [view(entry) for entry in entries]


def merge(entries: list[str], seen: dict[str, list[View]]) -> Found:
    """The files of ``entries`` over all workers' views ``seen`` (worker -> one view per entry)."""
    found = Found(readable={worker: set() for worker in seen})
    files: dict[str, None] = {}  # an ordered set
    sizes: dict[str, dict[str, int]] = {}
    for i, entry in enumerate(entries):
        here = {worker: v[i] for worker, v in seen.items()}
        names: set[str] = set()
        for worker, v in here.items():
            for path, size in v.files:
                sizes.setdefault(path, {})[worker] = size
                found.readable[worker].add(path)
                names.add(path)
            names.update(v.refused)
        if not names:
            raise _nothing_found(entry, {v.kind for v in here.values()})
        files.update(dict.fromkeys(sorted(names)))
    for path, by_worker in sizes.items():
        if len(set(by_worker.values())) > 1:
            detail = ", ".join(f"{n} bytes on {w}" for w, n in sorted(by_worker.items()))
            raise InputError(
                path,
                f"differs between workers ({detail}): files on different nodes must have "
                "different names, or be the same file",
            )
    found.files = list(files)
    return found


def _nothing_found(entry: str, kinds: set[str]) -> InputError:
    if GLOB in kinds:
        return InputError(entry, "no files match this pattern on any worker")
    if DIRECTORY in kinds:
        return InputError(entry, "directory holds no data files")
    return InputError(entry, "no such file or directory on any worker")
