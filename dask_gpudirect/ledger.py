"""The transfer ledger: one record per read or transfer, kept on each worker.

The ledger is what makes the package honest about the path bytes took: every read says which
route it used (``gds``, ``kvikio-compat``, ``posix-host``), every shuffle transfer how it crossed
between workers (``ucx-device``, ``tcp-host-staged``, ...), and how many copies that route costs.
This is the worker-side store; the client gathers and sums it
(:mod:`dask_gpudirect.ledger_report`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

from .config import configured

if TYPE_CHECKING:
    from distributed import Worker

#: Where a worker keeps its ledger: ``worker.extensions[EXTENSION]``.
EXTENSION = "gpudirect-ledger"

#: Copies each path costs per byte, as NVIDIA's GPUDirect write-ups count them.
COPIES: dict[str, int] = {
    "gds": 1,  # storage -> GPU by DMA
    "kvikio-compat": 2,  # storage -> pinned bounce buffer -> GPU
    "posix-host": 1,  # storage -> host memory
    "ucx-device": 1,  # GPU -> GPU by UCX: cuda_ipc/NVLink in a node, RDMA between nodes
    "rapidsmpf-ucx": 1,  # GPU -> GPU by RapidsMPF's own UCXX communicator (UCX picks the way)
    "tcp-host-staged": 2,  # GPU -> host -> socket -> host -> GPU (5 across nodes, see below)
    "ucx-host": 1,  # host memory -> host memory by UCX
    "tcp-host": 1,  # host memory -> host memory over a socket
    "local": 0,  # a shuffle piece whose destination is its own worker: it never moves
    "device-to-host": 1,  # a received piece spilled from the GPU to host memory
    "host-to-disk": 1,  # a received piece spilled from host memory to the worker's disk
    # last, so the dashboard's colors of the paths above stay as they were
    "host-remote": 1,  # object storage (s3://, http(s)://) -> host memory by range requests
    "kvikio-remote": 2,  # object storage -> host memory (the HTTP client's) -> GPU, by kvikio
    "in-process": 0,  # a shuffle piece between two workers of one process: handed over as is
}

#: Copies of a host-staged GPU transfer between two nodes: GPU -> host -> NIC -> NIC -> host -> GPU.
STAGED_ACROSS_NODES = 5


@dataclasses.dataclass(frozen=True)
class Record:
    """One read or transfer, as seen by the worker that did it."""

    worker: str
    op: str
    path: str
    bytes: int
    seconds: float
    copies: int
    file: str
    shard: str
    time: float
    peer: str = ""  # the other worker of a transfer


#: The fields of a :class:`Record`, in order: the columns of ``dg.report``'s records.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))


@dataclasses.dataclass(frozen=True)
class Totals:
    """Running sums for one (op, path) of a ledger: unlike the records, they are never dropped.

    ``copied_bytes`` counts each record's bytes once per copy its path cost (a 2-copy read of
    1 MB adds 2 MB), so ``copied_bytes / bytes`` is the path's copies per byte.
    """

    bytes: int = 0
    seconds: float = 0.0
    copied_bytes: int = 0


class Ledger:
    """A bounded, thread-safe list of :class:`Record` for one worker, with running totals.

    The records (what ``dg.report`` sums) drop the oldest past ``max_records``; the totals per
    (op, path) (what the Prometheus counters export) keep counting from the ledger's creation.
    """

    def __init__(self, worker: str, max_records: int):
        self.worker = worker
        self._records: collections.deque[Record] = collections.deque(maxlen=max_records)
        self._totals: dict[tuple[str, str], Totals] = {}
        self._lock = threading.Lock()

    def add(
        self,
        *,
        op: str,
        path: str,
        nbytes: int,
        seconds: float,
        file: str = "",
        shard: str = "",
        peer: str = "",
        copies: int | None = None,
    ) -> Record:
        record = Record(
            worker=self.worker,
            op=op,
            path=path,
            bytes=nbytes,
            seconds=seconds,
            copies=COPIES[path] if copies is None else copies,
            file=file,
            shard=shard,
            time=time.time(),
            peer=peer,
        )
        key = (op, path)
        with self._lock:
            self._records.append(record)
            old = self._totals.get(key, Totals())
            self._totals[key] = Totals(
                bytes=old.bytes + nbytes,
                seconds=old.seconds + seconds,
                copied_bytes=old.copied_bytes + nbytes * record.copies,
            )
        return record

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dataclasses.asdict(r) for r in self._records]

    def columns(self) -> dict[str, list[Any]]:
        """The records as one list per field (what ``dg.report`` gathers): ``dataclasses.asdict``
        of each record, and a dict per record on the wire, cost 25-50 x as much at 100,000
        records."""
        with self._lock:
            held = list(self._records)
        return {name: [getattr(r, name) for r in held] for name in FIELDS}

    def totals(self) -> dict[tuple[str, str], Totals]:
        """The running totals per (op, path) since this ledger began."""
        with self._lock:
            return dict(self._totals)

    def clear(self) -> None:
        """Forget the records; the totals go on, as counters never go down."""
        with self._lock:
            self._records.clear()

    def keep(self, max_records: int) -> None:
        """Keep at most ``max_records`` records from now on (the newest of those held)."""
        with self._lock:
            self._records = collections.deque(self._records, maxlen=max_records)


def of(worker: Worker) -> Ledger:
    """``worker``'s ledger, made on first use: one per worker, shared by the readers and the
    shuffle, and kept when a plugin is registered again (so its counts never reset)."""
    extension = worker.extensions.get(EXTENSION)
    if extension is None:
        # checked as the plugin checks it: a shuffle makes the ledger with no plugin set up
        max_records = configured("max_records")
        extension = worker.extensions[EXTENSION] = Ledger(worker.address, max_records)
    return extension
