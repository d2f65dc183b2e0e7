"""``gpudirect.allowed-roots``, and the one way workers open a file: open once, check what opened.

A Dask client can ask workers to read any path their process can open. Where workers serve
several users, ``allowed-roots`` keeps them to the datasets they are meant to serve. A file is
opened once; the check is made on the open descriptor (the real path the kernel opened, not the
name given), and every later read goes through that same descriptor, so no symlink swapped in
between the check and the read can lead outside. Outside the roots, a path gets one error,
whatever exists there, naming only the path the user gave.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple, Protocol

import dask.config

from .errors import ConfigError, InputError

KEY = "gpudirect.allowed-roots"
#: The environment variable of ``KEY``, taken where the configuration sets no roots: a
#: ``LocalCluster(env={ENV: ...})`` worker is handed the client's whole configuration by its
#: nanny, whose null would otherwise override the limit the worker's environment asks for.
ENV = "DASK_GPUDIRECT__ALLOWED_ROOTS"

#: Set while this thread lists paths as workers without roots would (:mod:`.known_workers`):
#: the roots of this process, in its config or its environment, are not theirs.
_UNLIMITED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "gpudirect_unlimited", default=False
)

#: The one answer for a path outside the roots: it says nothing of what lies there.
REFUSED = "outside gpudirect.allowed-roots: the workers do not read or list it"


class Refused(InputError):
    """A path outside the allowed roots (after symlinks and ``..``)."""

    def __init__(self, path: str | os.PathLike | None, problem: str = REFUSED):
        super().__init__(path, problem)


def roots() -> tuple[str, ...] | None:
    """This process's ``gpudirect.allowed-roots`` as absolute real paths; None: no limit.

    Takes a list of paths, or a string holding one path or several joined by ``os.pathsep``
    (what ``DASK_GPUDIRECT__ALLOWED_ROOTS=/data:/scratch`` gives); anything else is a
    :class:`~dask_gpudirect.errors.ConfigError`, so a mistyped value never admits everything.
    """
    limits = _limits()
    return None if limits is None else limits.real


def _configured() -> tuple[str, ...] | None:
    """The roots as configured, checked (see :func:`roots`); None: no limit."""
    value = dask.config.get(KEY, default=None)
    if value is None and ENV in os.environ:
        value = dask.config.interpret_value(os.environ[ENV])
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        entries = os.fspath(value).split(os.pathsep)
    elif isinstance(value, (list, tuple)):
        entries = list(value)
    else:
        raise ConfigError(
            f"{KEY} must be a list of directories or a {os.pathsep!r}-separated string, "
            f"not {type(value).__name__} {value!r}"
        )
    for entry in entries:
        if not isinstance(entry, (str, os.PathLike)) or not os.path.isabs(os.fspath(entry)):
            raise ConfigError(f"{KEY}: {entry!r} in {value!r} is not an absolute directory path")
    return tuple(os.fspath(entry) for entry in entries)


def _within(path: str, limits: tuple[str, ...]) -> bool:
    return any(os.path.commonpath([path, root]) == root for root in limits)


@dataclasses.dataclass(frozen=True)
class _Limits:
    """The roots, resolved (``real``) and as configured (``given``: ``/data`` admits the name
    ``/data/x`` when ``/data`` is itself a link)."""

    real: tuple[str, ...]
    given: tuple[str, ...]

    def admit(self, path: str) -> bool:
        # the real path of the name as given, its ".." kept: the kernel follows a link before
        # the ".." after it ("/data/link/.." is the link's target's parent, not "/data").
        # The working directory only for a relative name: a process whose directory was
        # removed (a worker started in a scratch folder) has none, and getcwd() raises
        if not os.path.isabs(path):
            path = os.path.join(os.getcwd(), path)
        named = os.path.normpath(path)
        return _within(named, self.real + self.given) and _within(os.path.realpath(path), self.real)


@contextlib.contextmanager
def unlimited() -> Iterator[None]:
    """No roots in this thread for the block, whatever this process's config or environment
    says: for listing as workers that have none."""
    token = _UNLIMITED.set(True)
    try:
        yield
    finally:
        _UNLIMITED.reset(token)


def _limits() -> _Limits | None:
    if _UNLIMITED.get():
        return None
    entries = _configured()
    if entries is None:
        return None
    real = tuple(os.path.realpath(e) for e in entries)
    return _Limits(real, tuple(os.path.normpath(e) for e in entries))


def admits(path: str | os.PathLike) -> bool:
    """Whether the roots admit ``path`` by name: as written (``..`` folded) and with symlinks
    resolved (a ``..`` after the link it follows, as the kernel takes it), both inside. Only
    for listing; reads check the descriptor (:func:`opened`)."""
    limits = _limits()
    return limits is None or limits.admit(os.fspath(path))


@dataclasses.dataclass(frozen=True)
class Opened:
    """A file opened for reading and checked against the roots: read only through ``fd``."""

    path: str  # as the user gave it
    fd: int
    stat: os.stat_result

    @property
    def same_file_path(self) -> str:
        """A name that opens this very file again (not whatever ``path`` names now): for
        readers such as kvikio that take a name, not a descriptor."""
        return f"/proc/self/fd/{self.fd}"

    def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end of the file)."""
        return os.pread(self.fd, length, offset)


def _opened_path(fd: int) -> str:
    """The real path of the file open on ``fd``, as the kernel knows it."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: macOS and the BSDs answer F_GETPATH
        import fcntl

        # typeshed has F_GETPATH on macOS only, where it exists
        name = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024))  # type: ignore[attr-defined]
        return os.fsdecode(name).rstrip("\0")


@contextlib.contextmanager
def opened(path: str | os.PathLike) -> Iterator[Opened]:
    """``path`` open for reading, a regular file inside the roots, closed on exit.

    Raises :class:`Refused` for anything outside the roots (existing or not), or an
    :class:`InputError` saying what is wrong with a file inside them.
    """
    path = os.fspath(path)
    limits = _limits()
    if limits is not None and not limits.admit(path):
        raise Refused(path)
    try:
        # O_NONBLOCK: a FIFO must not hang the worker; regular files ignore it
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if limits is not None and not limits.admit(path):  # a link swapped to lead out
            raise Refused(path) from None
        raise open_error(path, exc) from None
    try:
        if limits is not None and not _within(_opened_path(fd), limits.real):
            raise Refused(path)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(path, "is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, "not a regular file")
        yield Opened(path, fd, info)
    finally:
        os.close(fd)


class Stat(NamedTuple):
    """The fields of ``os.stat_result`` that planning and stamps read, for remote objects."""

    st_size: int
    st_mtime_ns: int


class Source(Protocol):
    """What planning reads: a local :class:`Opened` file or a remote object (``remote.Object``)."""

    @property
    def path(self) -> str: ...

    @property
    def stat(self) -> os.stat_result | Stat: ...

    def pread(self, length: int, offset: int) -> bytes: ...


def pread_exact(file: Source, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` of ``file``, or an InputError if the file ends first."""
    data = file.pread(length, offset)
    if len(data) != length:
        raise InputError(file.path, f"ends at byte {offset + len(data)}, before {offset + length}")
    return data


def open_error(path: str, exc: OSError) -> InputError:
    """An OSError from opening ``path`` as an :class:`InputError` that says what is wrong."""
    if isinstance(exc, FileNotFoundError):
        return InputError(path, "no such file")
    if isinstance(exc, PermissionError):
        return InputError(path, "permission denied: the file is not readable")
    if isinstance(exc, IsADirectoryError):
        return InputError(path, "is a directory, not a file")
    return InputError(path, f"cannot read: {exc.strerror or exc}")
