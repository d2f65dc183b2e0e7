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

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

#: Copies each path costs per byte, as NVIDIA's GPUDirect write-ups count them.
COPIES: dict[str, int] = {
    "gds": 1,  # storage -> GPU by DMA
    "kvikio-compat": 2,  # storage -> pinned bounce buffer -> GPU
    "posix-host": 1,  # storage -> host memory
    "ucx-device": 1,  # GPU -> GPU by UCX: cuda_ipc/NVLink in a node, RDMA between nodes
    "tcp-host-staged": 2,  # GPU -> host -> socket -> host -> GPU (5 across nodes, see below)
    "ucx-host": 1,  # host memory -> host memory by UCX
    "tcp-host": 1,  # host memory -> host memory over a socket
    "local": 0,  # a shuffle piece whose destination is its own worker: it never moves
    "device-to-host": 1,  # a received piece spilled from the GPU to host memory
    "host-to-disk": 1,  # a received piece spilled from host memory to the worker's disk
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


class Ledger:
    """A bounded, thread-safe list of :class:`Record` for one worker."""

    def __init__(self, worker: str, max_records: int):
        self.worker = worker
        self._records: collections.deque[Record] = collections.deque(maxlen=max_records)
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
        with self._lock:
            self._records.append(record)
        return record

    def records(self) -> list[dict]:
        with self._lock:
            return [dataclasses.asdict(r) for r in self._records]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


def _worker_records(dask_worker) -> list[dict]:
    from .plugin import GPUDirectPlugin

    plugin = dask_worker.plugins.get(GPUDirectPlugin.name)
    return plugin.ledger.records() if plugin is not None else []


def records(client: Client | None = None) -> pd.DataFrame:
    """Every ledger record of every worker, one row each."""
    import pandas as pd
    from distributed import default_client

    client = client or default_client()
    rows = [row for rs in client.run(_worker_records).values() for row in rs]
    columns = [f.name for f in dataclasses.fields(Record)]
    return pd.DataFrame(rows, columns=columns)


def report(client: Client | None = None) -> pd.DataFrame:
    """The cluster's ledger summed per worker, op and path.

    Columns: ``worker, op, path, count, bytes, seconds, copies, GB/s``; ``copies`` is what the
    path costs per byte, ``GB/s`` is bytes over the summed seconds of the reads (per reader).
    """
    df = records(client)
    keys = ["worker", "op", "path"]
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
