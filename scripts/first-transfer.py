"""The first device transfer between two GPU workers, and the first ``dg.shuffle``, against
the size of the workers' RMM pools.

A fresh cluster's first ``dg.shuffle`` took 0.93-1.53 s on the H200 against 0.17-0.56 s warm:
its stage's ``send`` 0.56-0.78 s against 0.01 s, its ``split`` 0.44-0.65 s against 0.05-0.18 s.
The suspect was UCX's CUDA IPC transport, which maps the whole allocation a peer's buffer lies
in (``cuIpcOpenMemHandle``) on its first transfer from it, an RMM pool being one allocation
(RapidsMPF's issue 206 saw the cost grow with ``rmm_pool_size`` on H100s). On one H200 the first
64 MiB transfer took 566 ms with 40 GB pools against 86 ms with 4 GB or none
(``docs/benchmarks/2026-12-03-h200-first-transfer-07544ab.log``). For each pool size
given (``none``: no pool, RMM's plain allocations; ``4GB:40GB``: a pool of 4 GB that may grow
to 40), in fresh clusters of two workers over UCXX
(sharing the GPU where there is one), this times:

- a 64 MiB CuPy array fetched by one worker from the other, three times each way, a new array
  each time, against the same task run where the array lies (no transfer);
- ``dg.shuffle`` of 1 GiB in 8 partitions, three times, with the slowest stage's phases.

    python3 scripts/first-transfer.py none 4GB 40GB 1GB:40GB
"""

from __future__ import annotations

import sys
import time
from typing import Any

from distributed import Client, wait

import dask_gpudirect as dg
from dask_gpudirect.bench.common import stage_phases
from dask_gpudirect.bench.shuffle import _Input
from dask_gpudirect.measure import _use_rmm, start_cluster, stop_cluster

NBYTES = 64 << 20


def _array(nbytes: int, fill: int) -> Any:
    import cupy

    return cupy.full(nbytes // 8, fill, dtype=cupy.int64)


def _nbytes(array: Any) -> int:
    return int(array.nbytes)


def fetch_ms(client: Client, source: str, dest: str, fill: int) -> float:
    """Milliseconds for ``dest`` to run a task on a new array held by ``source``."""
    array = client.submit(_array, NBYTES, fill, workers=[source], pure=False)
    wait(array)
    began = time.perf_counter()
    client.submit(_nbytes, array, workers=[dest], allow_other_workers=False, pure=False).result()
    return (time.perf_counter() - began) * 1e3


def cluster_with(pool: str) -> tuple[Any, Client]:
    """Two workers with ``pool`` (``none``, a size, or ``initial:maximum``) as their RMM."""
    initial, _, maximum = pool.partition(":")
    cluster, client = start_cluster(
        "device", 2, 1, "ucxx", None if pool == "none" or maximum else initial
    )
    if maximum:
        client.run(_use_rmm, initial, maximum)
    return cluster, client


def transfers(pool: str) -> None:
    cluster, client = cluster_with(pool)
    try:
        a, b = sorted(client.nthreads())
        print(f"  same worker (no transfer): {fetch_ms(client, a, a, 0):.1f} ms", flush=True)
        for name, source, dest in (("a -> b", a, b), ("b -> a", b, a)):
            times = [fetch_ms(client, source, dest, fill) for fill in range(3)]
            print(f"  64 MiB {name}: " + " / ".join(f"{ms:.1f}" for ms in times) + " ms")
    finally:
        stop_cluster(cluster, client, print)


def shuffles(pool: str) -> None:
    cluster, client = cluster_with(pool)
    try:
        frame = _Input(client, "device", 1.0, 8, 2)
        frame.make()
        for run in range(3):
            began = time.perf_counter()
            out = dg.shuffle(frame.collection, "key", client=client)
            wait(out)
            seconds = time.perf_counter() - began
            phases = {k.removeprefix("shuffle: "): s for k, s in stage_phases(client).items()}
            shown = ", ".join(
                f"{k} {s * 1e3:.0f}" for k, s in phases.items() if not k.startswith("client")
            )
            print(f"  dg.shuffle {run + 1}: {seconds:.3f} s (stage ms: {shown})", flush=True)
            del out
    finally:
        stop_cluster(cluster, client, print)


def main() -> None:
    for pool in sys.argv[1:] or ["none", "40GB"]:
        print(f"== RMM pool {pool}", flush=True)
        transfers(pool)
        shuffles(pool)


if __name__ == "__main__":
    main()
