"""Finding the files: every worker lists what it sees, so data on one node's own disk is found.

The client makes the user's paths absolute and each worker expands them in its own file system
(a glob, a directory's data files, or a file). A file counts for a worker when its allowed roots
admit it, checked on the file opened (see :mod:`.access`); a path outside them is not even listed,
and gets the same answer whatever lies there. The client merges the views into the files in the
order of the paths, and for each worker the files it can read and when each was modified (the
stamps of the shards, :mod:`.stamps`); the client itself need not see any of them.

One path with different sizes on two workers is two different files that share a name: node-local
datasets need file names unique across nodes (or identical copies), and we say so rather than mix
them up.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import re
import stat
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

from dask.utils import natural_sort_key

from . import access, remote
from .errors import InputError

#: What a path turned out to be on one worker.
GLOB, DIRECTORY, FILE, MISSING, REFUSED = "glob", "directory", "file", "missing", "refused"


@dataclass(frozen=True)
class Listing:
    """Which files a directory read takes: those ending in ``extensions`` (None: any), and with
    ``recursive`` those of its subdirectories too (hive folders like ``year=2024/``), as
    Dask's Parquet reader lists them."""

    extensions: tuple[str, ...] | None = None
    recursive: bool = False

    @staticmethod
    def hidden(name: str) -> bool:
        """Whether a read skips the file or folder ``name``: every name starting with ``.``
        or ``_``, as pyarrow's datasets skip them (hidden files, ``_metadata``, ``_SUCCESS``,
        ``_temporary/``). Dask's reader skips fewer: only ``_SUCCESS``, ``_metadata`` and
        ``.crc`` files, so a ``_x.parquet`` that Dask reads is skipped here."""
        return name.startswith((".", "_"))

    def takes(self, name: str) -> bool:
        """Whether a directory read takes the (not hidden) file ``name``."""
        return self.extensions is None or name.endswith(self.extensions)  # as Dask: by case


FLAT = Listing()


@dataclass(frozen=True)
class View:
    """One path as one worker sees it: what it is there, and its files as
    ``(path, size, mtime_ns, ctime_ns)``."""

    kind: str
    files: tuple[tuple[str, int, int, int], ...] = ()
    refused: tuple[str, ...] = ()  # names inside the roots that lead outside them


@dataclass
class Found:
    """The merged views: ``files`` in the order they are read (a file two entries name, twice),
    the files each worker can read, and the sizes and modification times the workers saw of
    each file (and its status-change times: a file rewritten with its size and modification
    time kept, as ``cp -p`` and ``rsync -t`` keep them, has new ones)."""

    files: list[str] = field(default_factory=list)
    readable: dict[str, set[str]] = field(default_factory=dict)
    mtimes: dict[str, set[int]] = field(default_factory=dict)
    ctimes: dict[str, set[int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # one size a file: merge checks it


#: A URL's scheme, as in ``s3://bucket/key``.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _local(path: str | bytes | os.PathLike) -> str:
    """``path`` as an absolute local path: ``~`` expanded, ``file://`` URLs taken as their path,
    ``s3://`` and ``http(s)://`` URLs kept (:mod:`.remote`), and other URLs refused (they would
    otherwise become local names like ``/cwd/gs:/...``). A ``..`` is left for the workers to
    follow, as the kernel does: after a symlink it leads elsewhere than its name says."""
    try:
        text = os.fsdecode(path)
    except TypeError:
        raise InputError(None, f"not a path: {path!r}") from None
    if remote.is_remote(text):
        return remote.checked_url(text)
    url = _SCHEME.match(text)
    if url:
        if url.group(1).lower() != "file":
            raise InputError(
                text,
                f"{url.group(1)}:// paths are not supported yet: dask-gpudirect reads local and "
                "network-mounted files, s3:// and http(s):// URLs (copy the data to such a "
                "place, or mount it)",
            )
        parts = urllib.parse.urlsplit(text)
        if parts.query or parts.fragment or text.endswith(("?", "#")):
            raise InputError(
                text,
                "a file:// URL's ? and # start its query and fragment, which name no file: "
                "write them %3F and %23, or give the path itself",
            )
        if parts.netloc.lower() not in ("", "localhost"):
            raise InputError(
                text, f"a file:// URL of host {parts.netloc!r}: only this machine's are read"
            )
        # %-escapes are the name's bytes, as Path.as_uri() writes them: one not UTF-8 ("%FF")
        # is that byte (a surrogate escape, as os.fsdecode), where unquote made it U+FFFD
        text = os.fsdecode(urllib.parse.unquote_to_bytes(os.fsencode(parts.path)))
    if "\0" in text:  # each worker's stat raised a ValueError naming no file
        raise InputError(text, "a path cannot hold a NUL character (\\0): no file is named so")
    text = os.path.join(os.getcwd(), os.path.expanduser(text))
    # "." and doubled slashes go, as abspath's would; ".." stays
    tidy = [part for part in text.split(os.sep) if part not in ("", ".")]
    return os.sep + os.sep.join(tidy)


def absolute(
    paths: str | bytes | os.PathLike | Iterable[str | bytes | os.PathLike],
) -> list[str]:
    """The user's paths as absolute strings (relative ones against the client's directory)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, Iterable):
        raise InputError(None, f"paths must be a path, a URL or a list of them, not {paths!r}")
    entries = [_local(p) for p in paths]
    if not entries:
        raise InputError(None, "no paths given")
    return entries


def data_files(directory: str, listing: Listing = FLAT) -> list[str]:
    """The entries a read of ``directory`` takes: not those starting with ``.`` or ``_``
    (hidden files, ``_metadata``, ``_SUCCESS``), with ``listing.extensions`` only those ending
    in one of them (as Dask's ``parquet_file_extension``), and subdirectories' files only where
    ``listing.recursive``. In no set order: :func:`merge` orders every entry's files."""
    files, folders = [], []
    with os.scandir(directory) as listed:  # file types from the listing: no stat per name
        entries = list(listed)
    for entry in entries:
        if listing.hidden(entry.name):
            continue
        if entry.is_dir():
            if not entry.is_symlink():  # a linked folder could lead back up: not followed
                folders.append(entry.path)
        elif listing.takes(entry.name):
            files.append(entry.path)
    if listing.recursive:
        for folder in folders:
            try:
                files.extend(data_files(folder, listing))
            except (FileNotFoundError, NotADirectoryError):  # gone since this one was listed
                continue
    return files


def view(entry: str, listing: Listing = FLAT) -> View:
    """``entry`` as this process sees it (run on each worker)."""
    if not access.admits(entry):  # not even listed: the answer is the same whatever is there
        return View(REFUSED)
    # a name that exists as written is that file or folder, brackets and all ("a[1].npy"),
    # not a pattern that may match another ("a1.npy")
    pattern = glob.has_magic(entry) and not os.path.lexists(entry)
    found = None if pattern else _stat(entry)  # one stat for a file named, not three
    try:
        if pattern:  # "**" any depth of folders, as Dask's (fsspec's) globs
            limited = access.roots() is not None
            kind, candidates = GLOB, _glob(entry) if limited else glob.glob(entry, recursive=True)
        elif found is not None and stat.S_ISDIR(found.st_mode):
            kind, candidates = DIRECTORY, data_files(entry, listing)
        elif found is not None or os.path.lexists(entry):  # a dangling link is a FILE too
            kind, candidates = FILE, [entry]
        else:
            return View(MISSING)
    except OSError:  # a directory this process may not list
        return View(MISSING)
    files, refused = [], []
    if access.roots() is not None:
        seen = _opened
    elif kind == FILE and found is not None:
        seen = functools.partial(_stated, info=found)
    else:
        seen = _stated
    for path in candidates:
        try:
            files.append(seen(path))
        except access.Refused:
            refused.append(path)
        except InputError:  # planning says what is wrong with it (unreadable, a FIFO, a
            # dangling link...), unless a listing found it and it is not a file: a
            # subdirectory a pattern matched, or a file gone meanwhile
            if kind == FILE or (os.path.lexists(path) and not os.path.isdir(path)):
                files.append((path, *_size_and_times(path)))
    if kind == FILE and not files and not refused:
        return View(MISSING)
    return View(kind, tuple(files), tuple(refused))


def _glob(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)`` where allowed roots are set: a folder is listed
    only where the roots admit it by name and real path, so a folder link inside a root that
    leads out (``/data/*/x*`` through ``/data/link -> /elsewhere``) lists nothing outside:
    ``glob.glob`` followed it, the names it found there came back refused (saying what exists
    outside), and ``**`` through a link to ``/`` walked the whole file system."""
    return list(_iglob(pattern, folders_only=False))


def _iglob(pattern: str, folders_only: bool) -> Iterable[str]:
    """As ``glob._iglob`` (hidden names matched only by a pattern starting with ``.``)."""
    folder, name = os.path.split(pattern)
    if not glob.has_magic(pattern):
        if os.path.isdir(pattern) if folders_only else os.path.lexists(pattern):
            yield pattern
        return
    folders = _iglob(folder, folders_only=True) if glob.has_magic(folder) else [folder]
    for base in folders:
        if name == "**":
            names: Iterable[str] = ["", *_below(base, folders_only)]
        elif glob.has_magic(name):
            hidden = name.startswith(".")
            listed = _listed(base, folders_only)
            names = [
                n
                for n, _ in listed
                if (hidden or not n.startswith(".")) and fnmatch.fnmatchcase(n, name)
            ]
        else:  # not even looked up in a folder outside
            found = access.admits(base) and os.path.lexists(os.path.join(base, name))
            names = [name] if found else []
        for match in names:
            yield os.path.join(base, match)


def _below(folder: str, folders_only: bool) -> Iterable[str]:
    """The names under ``folder`` at any depth, relative to it, hidden ones skipped (``**``)."""
    for name, is_dir in _listed(folder, folders_only):
        if not name.startswith("."):
            yield name
            if is_dir:
                for deeper in _below(os.path.join(folder, name), folders_only):
                    yield os.path.join(name, deeper)


def _listed(folder: str, folders_only: bool) -> list[tuple[str, bool]]:
    """``folder``'s entries (name, whether a folder, links followed), none where the roots do
    not admit the folder or it cannot be listed."""
    if not access.admits(folder):
        return []
    entries = []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                try:
                    is_dir = entry.is_dir()
                except OSError:  # a link that cannot be followed (a loop, a folder it may
                    is_dir = False  # not search): a name a pattern matches, as glob.glob's
                if is_dir or not folders_only:
                    entries.append((entry.name, is_dir))
    except OSError:
        return []
    return entries


def _opened(path: str) -> tuple[str, int, int, int]:
    """A file's size, mtime and ctime, from its descriptor, checked against the roots."""
    with access.opened(path) as f:
        return path, f.stat.st_size, f.stat.st_mtime_ns, f.stat.st_ctime_ns


def _stat(path: str) -> os.stat_result | None:
    """``path``'s stat, following links; None where there is nothing to follow or no right to."""
    try:
        return os.stat(path)
    except OSError:
        return None


def _stated(path: str, info: os.stat_result | None = None) -> tuple[str, int, int, int]:
    """A file's size, mtime and ctime where no roots are set (from ``info``, its stat, where given):
    one ``stat`` where an open is three calls (a survey of 256 files: 0.5 against 1.9 ms on
    the 2-core CPU). Whether the file may be read is found when it is planned or read, naming
    it, as after an open."""
    if info is None:
        try:
            info = os.stat(path)
        except OSError as exc:
            raise access.open_error(path, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, "not a regular file")
    return path, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _size_and_times(path: str) -> tuple[int, int, int]:
    info = _stat(path)
    return (0, 0, 0) if info is None else (info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def namespace() -> tuple | None:
    """What two processes share that see the same files under the same paths with the same
    rights: one boot of one machine, one mount namespace and root directory, one user and its
    groups. None where that cannot be told (not Linux): such a worker is always asked."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        mounts = os.stat("/proc/self/ns/mnt").st_ino
        root = os.stat("/")
    except OSError:
        return None
    groups = tuple(sorted(os.getgroups()))
    return (boot, mounts, root.st_dev, root.st_ino, os.geteuid(), os.getegid(), groups)


def views(entries: list[str], listing: Listing = FLAT) -> list[View]:
    """Every entry as this worker sees it (``listing``: see :func:`data_files`)."""
    return [view(entry, listing) for entry in entries]


def merge(entries: list[str], seen: dict[str, list[View]], listing: Listing = FLAT) -> Found:
    """The files of ``entries`` over all workers' views ``seen`` (worker -> one view per entry):
    the entries in the order given, each one's files in the natural order of their paths, as
    Dask orders a dataset's (``part.2`` before ``part.10``, ``month=2/`` before ``month=10/``).
    A file two entries name is read twice, as Dask reads it."""
    found = Found(readable={worker: set() for worker in seen})
    files: list[str] = []
    sizes: dict[str, dict[str, int]] = {}
    for i, entry in enumerate(entries):
        here = {worker: v[i] for worker, v in seen.items()}
        names: set[str] = set()
        for worker, v in here.items():
            for path, size, mtime, ctime in v.files:
                sizes.setdefault(path, {})[worker] = size
                found.mtimes.setdefault(path, set()).add(mtime)
                found.ctimes.setdefault(path, set()).add(ctime)
                found.readable[worker].add(path)
                names.add(path)
            names.update(v.refused)
        if not names:
            raise _nothing_found(entry, {v.kind for v in here.values()}, listing.extensions)
        files += sorted(names, key=natural_sort_key)
    for path in files:
        if path not in sizes:  # only ever refused: inside the roots by name, outside in fact
            raise access.Refused(path)
    for path, by_worker in sizes.items():
        if len(set(by_worker.values())) > 1:
            detail = ", ".join(f"{n} bytes on {w}" for w, n in sorted(by_worker.items()))
            raise InputError(
                path,
                f"differs between workers ({detail}): files on different nodes must have "
                "different names, or be the same file",
            )
    found.files = files
    found.sizes = {path: next(iter(by_worker.values())) for path, by_worker in sizes.items()}
    return found


def _nothing_found(entry: str, kinds: set[str], extensions: tuple[str, ...] | None) -> InputError:
    if GLOB in kinds:
        return InputError(entry, "no files match this pattern on any worker")
    if DIRECTORY in kinds:
        if extensions is not None:
            return InputError(entry, f"directory holds no files ending in {', '.join(extensions)}")
        return InputError(entry, "directory holds no data files")
    if REFUSED in kinds:
        return access.Refused(entry)
    return InputError(entry, "no such file or directory on any worker")
