"""What the tools measure with: a local cluster, the pinned-copy ceiling and the pair transfer
(and the check of a size option they both take).

``bench`` and ``probe`` both start a local cluster, time a copy from pinned host memory to the
GPU and time one buffer sent from a worker to another; here once, so that each tool imports the
library and this module, never the other tool. Nothing here imports a GPU library at import
time.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .cuda import gpu_count

if TYPE_CHECKING:
    from distributed import Client, SpecCluster, Worker
    from tornado.ioloop import IOLoop

#: Seconds a tool's cluster gets to close before its processes are killed.
CLOSE_TIMEOUT = 60


def byte_size(ctx: Any, param: Any, value: str | None) -> str | None:
    """A click callback for a size option (``--size 256MiB``, ``--rmm-pool-size 40GB``): a
    usage error before anything starts where it is no positive size."""
    import click

    from .config import size_in_bytes

    if value is None:
        return None
    if (size_in_bytes(value) or 0) <= 0:
        raise click.BadParameter(f"{value!r}: use a positive size, like 256MiB")
    return value


# --- a local cluster ------------------------------------------------------------------------------


@functools.cache
def tool_loop() -> IOLoop:
    """The one event loop every cluster a tool starts runs on (a synchronous cluster otherwise
    starts a loop of its own). A tool makes UCXX progress in a thread, which completes requests
    through futures of the loop its first comm ran on, until every UCXX comm of the process is
    gone: a comm of the last cluster not yet collected when the next one starts on a new loop
    failed that start ("got Future attached to a different loop", bench shuffle on an H200)."""
    from distributed.utils import LoopRunner

    runner = LoopRunner()
    runner.start()
    return runner.loop


def start_cluster(
    target: str,
    workers: int | None,
    threads: int,
    protocol: str,
    rmm_pool_size: str | None,
    **cuda_options: Any,
) -> tuple[SpecCluster, Client]:
    """A local cluster and its client, with ``GPUDirectPlugin`` on every worker.

    Device target: ``dg.LocalCUDACluster`` (one worker per GPU; ``cuda_options`` go to it, e.g.
    ``enable_nvlink``); with more workers than GPUs, :func:`_shared_gpu_cluster`. Host target:
    a ``LocalCluster`` of worker processes.

    The scheduler, in this process, times Python's garbage collections by a ``gc`` callback:
    a Ctrl-C that lands in it is printed as "Exception ignored" and lost, and the tool then
    waited on the workers the same Ctrl-C had stopped. The callback goes once it is started.
    """
    from distributed import Client, LocalCluster
    from distributed.gc import disable_gc_diagnosis

    import dask_gpudirect as dg
    from dask_gpudirect.cluster import ucx_progress_env

    cluster: SpecCluster
    if target == "device" and workers and workers > gpu_count():
        cluster, client = _shared_gpu_cluster(workers, threads, protocol, rmm_pool_size)
    elif target == "device":
        cluster = dg.LocalCUDACluster(
            n_workers=workers,
            threads_per_worker=threads,
            protocol=protocol,
            rmm_pool_size=rmm_pool_size,
            dashboard_address=None,
            plugins={dg.GPUDirectPlugin()},
            loop=tool_loop(),
            **cuda_options,
        )
        client = Client(cluster)
    else:
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            protocol=protocol,
            processes=True,
            dashboard_address=None,
            env=ucx_progress_env(),
            loop=tool_loop(),
        )
        client = Client(cluster)
        client.register_plugin(dg.GPUDirectPlugin())
    disable_gc_diagnosis(force=True)
    return cluster, client


def stop_cluster(cluster: SpecCluster | None, client: Client, log: Callable[[str], None]) -> None:
    """Close ``client``, then ``cluster`` within CLOSE_TIMEOUT: a close that hangs (seen with
    UCXX on a loaded CPU machine, after every measurement was taken) must not hang the tool."""
    client.close()
    if cluster is None:
        return
    try:
        cluster.close(timeout=CLOSE_TIMEOUT)
    except TimeoutError:  # workers slow to stop after the measurements: not a failed run
        log(f"the cluster did not close in {CLOSE_TIMEOUT} s; its processes were killed")


def _shared_gpu_cluster(
    workers: int, threads: int, protocol: str, rmm_pool_size: str | None
) -> tuple[SpecCluster, Client]:
    """Worker processes that share the GPUs round-robin: two workers on one GPU stand in for
    two GPUs on a machine with one. dask-cuda names its workers by GPU and so starts one per
    GPU; this is a SpecCluster of Nannies, each given its GPU by ``CUDA_VISIBLE_DEVICES``, with
    the RMM pool and CuPy's RMM allocator set up as dask-cuda sets them."""
    from distributed import Client, Nanny, Scheduler, SpecCluster
    from distributed.worker_memory import parse_memory_limit

    import dask_gpudirect as dg
    from dask_gpudirect.cluster import ucx_progress_env

    gpus = gpu_count()
    spec = {
        f"gpu{i % gpus}-{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": threads,
                "protocol": protocol,
                # as dask-cuda: the host's memory shared by the workers (a Nanny's default, a
                # share by threads, is 8 GiB of a 16-core host: Dask then spills device frames)
                "memory_limit": parse_memory_limit(
                    "auto", 1, total_cores=workers, logger=logging.getLogger(__name__)
                ),
                "env": {**ucx_progress_env(), "CUDA_VISIBLE_DEVICES": str(i % gpus)},
                # as dask-cuda starts its workers: a CUDA context before UCX starts, so that
                # UCX sees GPU memory (without it device buffers cross by slow host staging)
                "preload": ["dask_cuda.initialize"],
                "preload_argv": ["--create-cuda-context"],
            },
        }
        for i in range(workers)
    }
    scheduler = {"cls": Scheduler, "options": {"protocol": protocol, "dashboard_address": None}}
    cluster = SpecCluster(
        workers=spec, scheduler=scheduler, silence_logs=logging.WARNING, loop=tool_loop()
    )
    client = Client(cluster)
    client.run(_use_rmm, rmm_pool_size)
    client.register_plugin(dg.GPUDirectPlugin())
    return cluster, client


def _use_rmm(pool_size: str | None, maximum: str | None = None) -> None:
    """RMM for cuDF and CuPy in this worker, with a pool of ``pool_size`` where given (that
    may grow to ``maximum``)."""
    import cupy
    import rmm
    from dask.utils import parse_bytes
    from rmm.allocators.cupy import rmm_cupy_allocator

    if pool_size:
        rmm.reinitialize(
            pool_allocator=True,
            initial_pool_size=parse_bytes(pool_size),
            maximum_pool_size=parse_bytes(maximum) if maximum else None,
        )
    cupy.cuda.set_allocator(rmm_cupy_allocator)


# --- the pinned-copy ceiling ----------------------------------------------------------------------


def timed_runs(fn: Callable[[], int], repeat: int) -> tuple[int, list[float]]:
    """Call ``fn`` ``repeat`` times; returns its byte count and the wall times."""
    runs, nbytes = [], 0
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        nbytes = fn()
        runs.append(time.perf_counter() - start)
    return nbytes, runs


def pinned_copy(nbytes: int) -> Callable[[], int]:
    """A warmed-up copy of ``nbytes`` from a pinned host buffer to a device buffer, waited for."""
    import cupy
    import numpy as np

    rt = cupy.cuda.runtime
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
    host.fill(1)  # fault the pages in before timing
    dev = cupy.empty(nbytes, dtype=cupy.uint8)

    def copy() -> int:
        rt.memcpy(dev.data.ptr, pinned.ptr, nbytes, rt.memcpyHostToDevice)
        rt.deviceSynchronize()
        return nbytes

    copy()  # warm-up
    return copy


def pinned_gbps(nbytes: int, repeat: int) -> float:
    """GB/s of :func:`pinned_copy` on this process's GPU: the median of ``repeat`` copies."""
    _, runs = timed_runs(pinned_copy(nbytes), repeat)
    return nbytes / statistics.median(runs) / 1e9


# --- the pair transfer ----------------------------------------------------------------------------


def pair_transfer(
    client: Client, a: str, b: str, nbytes: int, target: str, timeout: float | None = None
) -> Callable[[], dict[str, Any]]:
    """One buffer made on ``a``, then fetched by a task on ``b``: the fetch as ``b`` logged it
    (``Worker.transfer_incoming_log``: the comm's read and deserialisation, no scheduling).
    ``timeout``: the longest wait for each of the two tasks (a worker paused, stopped or gone
    runs none), else a TimeoutError naming the worker; None: no limit."""
    from distributed import wait

    def run() -> dict[str, Any]:
        buf = client.submit(
            _buffer, nbytes, target, workers=[a], allow_other_workers=False, pure=False
        )
        try:
            wait(buf, timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"{a} made no buffer within {timeout:g} s") from None
        start = time.perf_counter()
        fetch = client.submit(_size, buf, workers=[b], allow_other_workers=False, pure=False)
        try:
            size = fetch.result(timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"{b} did not fetch the buffer within {timeout:g} s") from None
        round_trip = time.perf_counter() - start
        fetches = client.run(_incoming, buf.key, workers=[b])[b]
        del buf
        if size != nbytes or len(fetches) != 1:
            raise RuntimeError(f"{b} logged {len(fetches)} fetches of the buffer, size {size}")
        return {
            "seconds": fetches[0]["duration"],
            "round_trip_seconds": round_trip,
            "note": f"{a} -> {b}; time from {b}'s transfer_incoming_log",
        }

    return run


def _buffer(nbytes: int, target: str) -> Any:
    """The transfer's buffer, written once so that its memory is really there."""
    if target == "device":
        import cupy

        return cupy.full(nbytes, 1, dtype=cupy.uint8)
    import numpy

    return numpy.full(nbytes, 1, dtype=numpy.uint8)


def _size(buffer: Any) -> int:
    return int(buffer.nbytes)


def _incoming(key: str, dask_worker: Worker) -> list[dict[str, Any]]:
    """This worker's logged fetches of ``key``: seconds and bytes, as the worker measured them."""
    return [
        {"duration": e["duration"], "total": e["total"], "who": e["who"]}
        for e in dask_worker.transfer_incoming_log
        if key in e["keys"]
    ]
