"""Where loaded bytes land: the only place where host and device code differ.

``host``: a POSIX thread pool reads into NumPy; pyarrow decodes Parquet; arrays are NumPy.
``device``: kvikio reads into an ``rmm.DeviceBuffer`` (libcudf reads Parquet itself, through the
same kvikio); pylibcudf decodes; arrays are CuPy.
Both share :class:`Target` (timing, short-read checks, the ledger) and are imported lazily,
so the CPU install never imports CUDA libraries.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from .. import remote, stamps
from ..access import Opened, opened
from ..errors import InputError
from ..ledger import Ledger
from ..shards import Shard

if TYPE_CHECKING:
    import numpy as np

#: Where bytes land: the GPU (cuDF, CuPy) or host memory (pandas, NumPy).
TargetName = Literal["device", "host"]
#: How an array lies in memory: C order (records contiguous) or Fortran order.
Order = Literal["C", "F"]
#: A partition on either target: a pandas or a cuDF DataFrame (Any: cuDF ships no types).
Frame: TypeAlias = Any

#: target name -> module holding its ``Target`` class and client-side ``empty_*`` helpers.
MODULES = {"host": "dask_gpudirect.targets.host", "device": "dask_gpudirect.targets.device"}


def module(name: str) -> ModuleType:
    """The module of target ``name``, with an install hint when its libraries are missing."""
    if name not in MODULES:
        raise InputError(None, f"unknown target {name!r}; use 'device', 'host' or None")
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as exc:
        raise ImportError(
            f"the {name!r} target needs {exc.name}: pip install 'dask-gpudirect[cuda13]'"
        ) from exc


#: Files a read keeps open at once (each with its reads in flight): a worker's descriptors
#: are few, and a chunk of small files may join thousands.
FILES_AT_ONCE = 64

#: target name -> the ledger path of its ``s3://`` and ``http(s)://`` reads.
REMOTE_ROUTES = {"host": "host-remote", "device": "kvikio-remote"}


def holding(obj: Any) -> TargetName:
    """The target an object lives on: ``device`` for cuDF and CuPy objects, else ``host``."""
    return "device" if type(obj).__module__.partition(".")[0] in ("cudf", "cupy") else "host"


class Target:
    """Reads shards into one buffer each and records every read in the ledger."""

    name: str
    route: str  # the ledger path: "posix-host", "kvikio-compat" or "gds"

    def __init__(self, options: dict[str, Any], ledger: Ledger):
        self.options = options
        self.ledger = ledger
        self._users = 0  # read tasks using this target now
        self._closing = False
        self._users_lock = threading.Lock()

    @contextlib.contextmanager
    def used(self) -> Iterator[Target]:
        """This target, for one read task: a :meth:`close` meanwhile (the plugin registered
        again, for new options) waits for the task to end before it releases the threads."""
        with self._users_lock:
            self._users += 1
        try:
            yield self
        finally:
            with self._users_lock:
                self._users -= 1
                last = self._closing and not self._users
            if last:
                self._release()

    def close(self) -> None:
        """Release threads and handles, once the read tasks using this target have ended."""
        with self._users_lock:
            self._closing = True
            idle = not self._users
        if idle:
            self._release()

    def _allocate(self, size: int, scratch: bool = False) -> tuple[Any, Any]:
        """A new buffer of ``size`` bytes on this target, and a byte view of it to slice.
        ``scratch``: the buffer is let go as soon as it is decoded (a Parquet shard's bytes),
        never handed out as a result."""
        raise NotImplementedError

    def _start_read(
        self,
        shard: Shard,
        file: Opened,
        view: Any,
        stack: contextlib.ExitStack,
        alone: bool = False,
    ) -> list[Callable[[], int]]:
        """Start reading ``shard``'s ranges from ``file`` into ``view`` (``shard.nbytes``;
        a handle the reads need open goes on ``stack``): a call for each read started, which
        waits for it and gives the bytes it read. ``alone``: no other file's reads are in
        flight beside this shard's (a target may then make a lone read in the caller's
        thread, when its call is made)."""
        raise NotImplementedError

    def read(self, shard: Shard, scratch: bool = False) -> Any:
        """``shard``'s ranges end to end in one buffer on this target (``Shard.layout``);
        ``scratch``: see :meth:`_allocate`."""
        return self.read_run((shard,), scratch)

    def read_run(self, shards: Sequence[Shard], scratch: bool = False) -> Any:
        """``shards``' ranges end to end in one buffer of their summed sizes (small files
        joined into one chunk: ``formats.binary.joins``), the reads of :data:`FILES_AT_ONCE`
        files in flight at once, so that many small files read about as fast as one large one.

        Each file is opened once and checked (allowed roots, then the shard's stamp) on that
        descriptor, read through it, and its stamp checked again after the read. A remote
        object, never joined, is read by :meth:`_read_remote`, its stamp checked by the same
        rules. The ledger gives each shard its share of the time (:meth:`record_shares`).
        """
        start = time.perf_counter()
        if remote.is_remote(shards[0].path):
            (shard,) = shards
            buffer, nread = self._read_remote(shard)
            _check_count(shard, nread)
            self.record(shard, time.perf_counter() - start, REMOTE_ROUTES[self.name])
            return buffer
        buffer, view = self._allocate(sum(shard.nbytes for shard in shards), scratch)
        counts: list[int] = []
        at = 0
        for first in range(0, len(shards), FILES_AT_ONCE):
            batch = shards[first : first + FILES_AT_ONCE]
            size = sum(shard.nbytes for shard in batch)
            counts += self._read_files(batch, view[at : at + size])
            at += size
        for shard, nread in zip(shards, counts, strict=True):
            _check_count(shard, nread)
        self.record_shares(shards, time.perf_counter() - start)
        return buffer

    def _read_files(self, shards: Sequence[Shard], view: Any) -> list[int]:
        """Each local shard's bytes read into its slice of ``view``, end to end. Every read
        has ended before an error is raised, so that none writes into a freed buffer."""
        with contextlib.ExitStack() as stack:
            started, at = [], 0
            alone = len(shards) == 1
            try:
                for shard in shards:
                    file = stack.enter_context(self.checked(shard))
                    view_of = view[at : at + shard.nbytes]
                    started.append(self._start_read(shard, file, view_of, stack, alone))
                    at += shard.nbytes
            except BaseException:  # a later file missing, changed or refused: the reads of
                for waits in started:  # the files before it end before their files close
                    _settle(waits)
                raise
            counts = [_settle(waits) for waits in started]
            for shard, count in zip(shards, counts, strict=True):
                if not isinstance(count, int):
                    raise _unreadable(shard.path, count)
        return [count for count in counts if isinstance(count, int)]

    def _read_remote(self, shard: Shard) -> tuple[Any, int]:
        """A remote shard's buffer and the bytes read into it (targets of REMOTE_ROUTES): the
        object's size and version checked against the stamp before (on the open) and after
        (a fresh request), and where the version is weak, as planned or now (a Last-Modified
        second, a weak ETag, which the weak comparison finds equal to its strong one), the
        bytes planned from as well."""
        with remote.opened(shard.path, shard.store) as obj:
            assert isinstance(obj, remote.Object) and shard.stamp is not None
            stamps.check_version(shard.stamp, shard.path, obj.size, obj.version)
            read = self._read_object(shard, obj)
            stamps.check_version(shard.stamp, shard.path, *obj.head())
            if obj.weak_version or remote.weak(shard.stamp.version):
                stamps.check_probe(shard.stamp, obj)
        return read

    def _read_object(self, shard: Shard, obj: remote.Object) -> tuple[Any, int]:
        """``shard``'s ranges of the opened remote object into a new buffer, and the bytes
        read."""
        raise NotImplementedError

    @contextlib.contextmanager
    def checked(self, shard: Shard) -> Iterator[Opened]:
        """``shard``'s file, opened once and checked on that descriptor (allowed roots, the
        stamp), to be read only through it; its stamp checked again when the read is done."""
        try:
            with opened(shard.path) as file:
                stamps.check(shard.stamp, file)
                yield file
                stamps.check(shard.stamp, file)  # not rewritten while we read
        except (OSError, RuntimeError) as exc:
            raise _unreadable(shard.path, exc) from None

    def record(self, shard: Shard, seconds: float, route: str | None = None) -> None:
        """``shard``'s planned bytes in the ledger, read by ``route`` (default: this target's)."""
        self.ledger.add(
            op="read",
            path=route or self.route,
            nbytes=shard.nbytes,
            seconds=seconds,
            file=shard.path,
            shard=shard.name,
        )

    def record_shares(self, shards: Sequence[Shard], seconds: float) -> None:
        """``shards``, read by one call of ``seconds``, in the ledger: each its share of the
        time by bytes."""
        total = sum(shard.nbytes for shard in shards) or 1
        for shard in shards:
            self.record(shard, seconds * shard.nbytes / total)

    def read_parquet(self, runs: Sequence[Sequence[Shard]]) -> list[Any]:
        """Each run of Parquet shards (``formats.parquet.runs``) decoded end to end: their row
        groups and columns, one frame per run, for the parts to finish (None for a footer-only
        shard, read only to check that the file is the one planned)."""
        decoded: list[Any] = []
        for run in runs:
            if run[0].part.empty is not None:  # footer-only: read to check the file
                self.read(run[0], scratch=True)
                decoded.append(None)
            else:
                decoded.append(self.decode_run(run))
        return decoded

    def decode_run(self, shards: Sequence[Shard]) -> Any:
        """One run of Parquet shards with rows, read and decoded end to end as one frame."""
        raise NotImplementedError

    def as_array(self, buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: Order) -> Any:
        raise NotImplementedError

    def _release(self) -> None:
        """Release threads and handles (no read uses them)."""


def _settle(waits: list[Callable[[], int]]) -> int | OSError | RuntimeError:
    """The bytes that all of ``waits`` read, or the first one's error, once all have ended."""
    count, error = 0, None
    for wait in waits:
        try:
            count += wait()
        except (OSError, RuntimeError) as exc:
            error = error or exc
    return count if error is None else error


def _unreadable(path: str, exc: OSError | RuntimeError) -> InputError:
    """A failed read as the error that names its file (kvikio reports C++ I/O errors as
    RuntimeError)."""
    reason = exc.strerror if isinstance(exc, OSError) else None
    return InputError(path, f"cannot read: {reason or exc}")


def _check_count(shard: Shard, nread: int) -> None:
    """Raise unless a read gave every byte planned for ``shard``."""
    if nread != shard.nbytes:
        raise InputError(
            shard.path,
            f"read {nread} of {shard.nbytes} planned bytes: the file is shorter than when "
            "it was planned (truncated or changed)",
        )
