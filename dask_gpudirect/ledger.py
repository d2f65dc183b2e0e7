"""The transfer ledger: one record per read or transfer, kept on each worker.

The ledger is what makes the package honest about the path bytes took: every read says which
route it used (``gds``, ``kvikio-compat``, ``posix-host``), every shuffle transfer how it crossed
between workers (``ucx-device``, ``tcp-host-staged``, ...), and how many copies that route costs.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import TYPE_CHECKING

import dask.config
from dask.utils import parse_timedelta

from .connection import connected
from .errors import InputError

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

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

    def records(self) -> list[dict]:
        with self._lock:
            return [dataclasses.asdict(r) for r in self._records]

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


def of(worker) -> Ledger:
    """``worker``'s ledger, made on first use: one per worker, shared by the readers and the
    shuffle, and kept when a plugin is registered again (so its counts never reset)."""
    extension = worker.extensions.get(EXTENSION)
    if extension is None:
        max_records = int(dask.config.get("gpudirect.ledger.max-records"))
        extension = worker.extensions[EXTENSION] = Ledger(worker.address, max_records)
    return extension


def _worker_records(dask_worker) -> list[dict]:
    return of(dask_worker).records()


def records(client: Client | None = None) -> pd.DataFrame:
    """Every ledger record of every worker, one row each."""
    import pandas as pd

    client = connected(client)
    rows = [row for rs in client.run(_worker_records).values() for row in rs]
    columns = [f.name for f in dataclasses.fields(Record)]
    return pd.DataFrame(rows, columns=columns)


def report(
    client: Client | None = None, by: str = "worker", window: str | float | None = None
) -> pd.DataFrame:
    """The cluster's ledger, summed into one of three views.

    - ``by="worker"`` (default): per worker, op and path. Columns ``worker, op, path, count,
      bytes, seconds, copies, GB/s``.
    - ``by="path"``: per op and path over the whole cluster (the same columns less ``worker``).
    - ``by="shard"``: every loaded shard (reads only), slowest first (lowest GB/s). Columns
      ``shard, file, worker, path, count, bytes, seconds, GB/s``; ``count`` is how often that
      worker loaded it.

    ``window`` (``"10s"``, seconds, a timedelta) also splits the worker and path views into
    windows of that length by the time each record was made (when its read or transfer ended);
    a leading ``window`` column holds each window's start (UTC). Windows without records are
    left out.

    ``copies`` is what the path costs per byte; ``GB/s`` is bytes over the summed seconds of the
    reads or transfers (per reader, not the window's throughput).
    """
    import pandas as pd

    if by not in _VIEWS:
        raise InputError(None, f"by={by!r}: use one of {', '.join(map(repr, _VIEWS))}")
    if window is not None and by == "shard":
        raise InputError(None, "window= splits the worker and path views, not by='shard'")
    seconds = None if window is None else parse_timedelta(window)
    if seconds is not None and seconds <= 0:
        raise InputError(None, f"window={window!r}: must be longer than zero")
    df = records(client)
    keys = _VIEWS[by]
    if by == "shard":
        out = _summed(df[df["op"] == "read"], keys).drop(columns="copies")
        return out.sort_values(["GB/s", "seconds"], ascending=[True, False], ignore_index=True)
    if seconds is not None:
        start = (df["time"].astype(float) // seconds) * seconds
        df = df.assign(window=pd.to_datetime(start, unit="s", utc=True))
        keys = ["window", *keys]
    return _summed(df, keys)


#: The keys each view of :func:`report` sums over.
_VIEWS: dict[str, list[str]] = {
    "worker": ["worker", "op", "path"],
    "path": ["op", "path"],
    "shard": ["shard", "file", "worker", "path"],
}


def _summed(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df``'s records summed per ``keys``: count, bytes, seconds, copies (per byte), GB/s."""
    out = (
        df.groupby(keys, as_index=False)
        .agg(
            count=("bytes", "size"),
            bytes=("bytes", "sum"),
            seconds=("seconds", "sum"),
            copies=("copies", "max"),
        )
        .sort_values(keys, ignore_index=True)
    )
    out["GB/s"] = (out["bytes"] / out["seconds"].where(out["seconds"] > 0) / 1e9).fillna(0.0)
    return out
