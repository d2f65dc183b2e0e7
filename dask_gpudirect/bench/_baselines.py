"""Single-process baselines of ``bench read``, each run in a fresh Python process.

``bench read`` starts this module's ``main`` with a JSON ``SPEC`` in a fresh interpreter and reads
its records back from the JSON file that ``SPEC`` names. Why a fresh process:

- the bench's own process must create no CUDA context before its ``LocalCUDACluster`` starts;
- libcudf configures kvikio once per process, on its first file read
  (``cudf::io::kvikio_integration::set_up_kvikio``: thread pool from ``KVIKIO_NTHREADS``, default
  4; compat mode from ``KVIKIO_COMPAT_MODE``, default ON), overwriting any earlier
  ``kvikio.defaults.set``. A process started with or without ``KVIKIO_NTHREADS=16`` measures
  ``cudf.read_parquet`` tuned or with its defaults for sure, and one cannot leak into the other;
- the pinned copy ceiling is measured while no other process uses the GPU; with several GPUs,
  one process per GPU (``CUDA_VISIBLE_DEVICES``), which take turns, then copy all at once.

Every measurement is guarded: one that fails becomes an ``error`` record and the rest still run.
This module imports no GPU library at import time.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..measure import pinned_copy, timed_runs

DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> str | None:
    """Flush dirty pages and drop the page cache; None when done, else why it could not be."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"cannot write {DROP_CACHES} ({exc.strerror or exc}): needs root"
    return None


def can_drop_page_cache() -> str | None:
    """None when the page cache can be dropped here, else why not (nothing is written)."""
    if not os.path.exists(DROP_CACHES):
        return f"{DROP_CACHES} does not exist"
    if not os.access(DROP_CACHES, os.W_OK):
        return f"{DROP_CACHES} is not writable: needs root and a writable /proc/sys"
    return None


def _read_through(path: str, chunk: int = 16 << 20) -> int:
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total


def warm_page_cache(files: list[str]) -> int:
    """Read ``files`` once so that the page cache holds them; returns the bytes read."""
    with ThreadPoolExecutor(max(1, min(16, len(files)))) as pool:
        return sum(pool.map(_read_through, files))


def record(key: str, cache: str, **fields: Any) -> dict:
    """One measurement: ``status`` is ``ok``, ``not run`` or ``error``."""
    rec: dict[str, Any] = {
        "key": key,
        "cache": cache,
        "status": "ok",
        "bytes": 0,
        "seconds": None,
        "runs": [],
    }
    rec.update(fields)
    if rec["status"] == "ok" and rec["seconds"]:
        rec["gbps"] = rec["bytes"] / rec["seconds"] / 1e9
    else:
        rec["gbps"] = None
    return rec


def guarded(key: str, cache: str, fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as exc:  # a failed measurement is a result too; the rest still run
        return record(key, cache, status="error", note=f"{type(exc).__name__}: {exc}")


# --- the measurements --------------------------------------------------------------------------


def _sync() -> None:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def device_info() -> dict:
    import cupy

    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "memory_bytes": int(props["totalGlobalMem"]),
        "cuda_driver": rt.driverGetVersion(),
        "cuda_runtime": rt.runtimeGetVersion(),
    }


def pinned_ceiling(nbytes: int = 1 << 30, repeat: int = 5) -> dict:
    """Pinned host buffer -> device buffer with one ``cudaMemcpy``: median of ``repeat``."""
    return _ceiling_record(pinned_copy(nbytes), nbytes, repeat)


def _ceiling_record(copy: Callable[[], int], nbytes: int, repeat: int) -> dict:
    _, runs = timed_runs(copy, repeat)
    return record(
        "h2d-pinned",
        "-",
        bytes=nbytes,
        seconds=statistics.median(runs),
        runs=runs,
        note=f"{nbytes / (1 << 30):g} GiB cudaMemcpy from pinned memory, median of {len(runs)}",
    )


class _Turns:
    """Step files in a directory shared by the processes of a group, one process per GPU.

    A rank that failed leaves a ``failed`` file and counts as done for every later step, so that
    one broken GPU does not hold the others up.
    """

    def __init__(self, sync_dir: str, rank: int, timeout: float):
        self.dir, self.rank, self.deadline = sync_dir, rank, time.monotonic() + timeout

    def mark(self, step: str) -> None:
        open(os.path.join(self.dir, f"{step}-{self.rank}"), "w").close()

    def wait(self, step: str, ranks: range) -> None:
        def done(r: int) -> bool:
            return any(os.path.exists(os.path.join(self.dir, f"{s}-{r}")) for s in (step, "failed"))

        while not all(done(r) for r in ranks):
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"the group's other processes did not reach '{step}'")
            time.sleep(0.0005)


def copy_group(
    copy: Callable[[], int],
    nbytes: int,
    rank: int,
    size: int,
    sync_dir: str,
    repeat: int = 5,
    rounds: int = 20,
    timeout: float = 120.0,
) -> dict:
    """``copy`` timed alone (the group's ranks in turn, the others idle), then all at once.

    Returns ``alone``, this GPU's ceiling record, and ``concurrent``: the ``start`` and ``end``
    (``time.monotonic``, one clock for every process of the host) of ``rounds`` copies made while
    every rank copies, and their ``bytes``.
    """
    turns = _Turns(sync_dir, rank, timeout)
    try:
        turns.mark("ready")
        turns.wait("ready", range(size))  # every process set up: no page faulting beside a timing
        turns.wait("alone", range(rank))
        alone = _ceiling_record(copy, nbytes, repeat)
        turns.mark("alone")
        turns.wait("alone", range(size))
        start = time.monotonic()
        for _ in range(rounds):
            copy()
        end = time.monotonic()
    except BaseException:
        turns.mark("failed")
        raise
    return {
        "alone": alone,
        "concurrent": {"start": start, "end": end, "bytes": rounds * nbytes, "rounds": rounds},
    }


def pinned_ceiling_group(rank: int, size: int, sync_dir: str, nbytes: int = 1 << 30) -> dict:
    """This process's GPU in a group of ``size`` (one process each): see :func:`copy_group`."""
    try:
        copy = pinned_copy(nbytes)
    except BaseException:
        _Turns(sync_dir, rank, 0).mark("failed")
        raise
    return copy_group(copy, nbytes, rank, size, sync_dir)


def naive(files: list[str], device: bool, cache: str) -> dict:
    """``open().read()`` of each file, then ``cupy.asarray`` (device) or nothing more (host)."""
    import numpy as np

    if device:
        import cupy

        cupy.asarray(np.zeros(8, dtype=np.uint8))  # context and memory pool exist before timing

    def run() -> int:
        total = 0
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            if device:
                arr = cupy.asarray(np.frombuffer(data, dtype=np.uint8))
                del arr
            total += len(data)
            del data
        if device:
            _sync()
        return total

    nbytes, runs = timed_runs(run, 1)
    return record(
        "naive", cache, bytes=nbytes, seconds=runs[0], runs=runs, note="one pass, file by file"
    )


def parquet_per_file(key: str, files: list[str], device: bool, cache: str, repeat: int) -> dict:
    """``cudf.read_parquet`` (device) or ``pyarrow.parquet.read_table`` (host), file by file."""
    total = sum(os.path.getsize(f) for f in files)
    if device:
        import cudf

        def read(path: str) -> Any:
            return cudf.read_parquet(path)
    else:
        import pyarrow.parquet as pq

        def read(path: str) -> Any:
            return pq.read_table(path)

    def run() -> int:
        for path in files:
            frame = read(path)
            del frame
        if device:
            _sync()
        return total

    if cache == "warm":
        run()  # warm-up: library start-up (kvikio set-up, nvCOMP, memory pools) is not timed
    nbytes, runs = timed_runs(run, repeat if cache == "warm" else 1)
    rec = record(
        key,
        cache,
        bytes=nbytes,
        seconds=statistics.median(runs),
        runs=runs,
        note=f"file bytes/s, median of {len(runs)}" if len(runs) > 1 else "file bytes/s",
    )
    if device:
        import kvikio
        import kvikio.defaults

        rec["kvikio"] = {
            "num_threads": kvikio.defaults.get("num_threads"),
            "compat_mode": kvikio.CompatMode(kvikio.defaults.get("compat_mode")).name,
        }
        rec["note"] += f"; kvikio threads {rec['kvikio']['num_threads']} in this process"
    return rec


def run_spec(spec: dict) -> dict:
    """Measure what ``spec`` asks for: warm first, then (if asked) each cold after a drop."""
    device = spec["target"] == "device"
    repeat = int(spec.get("repeat", 3))
    out: dict = {"records": []}
    recs = out["records"]
    if device:
        try:
            out["device"] = device_info()
        except Exception as exc:
            out["device"] = {"error": f"{type(exc).__name__}: {exc}"}
    if spec.get("ceiling"):
        recs.append(guarded("h2d-pinned", "-", pinned_ceiling))
    if spec.get("ceiling_group"):
        try:
            out["ceiling_group"] = pinned_ceiling_group(**spec["ceiling_group"])
        except Exception as exc:  # reported to the parent, which sums the GPUs that ran
            out["error"] = f"{type(exc).__name__}: {exc}"
    if spec.get("naive"):
        recs.append(guarded("naive", "warm", lambda: naive(spec["binary"], device, "warm")))
    pq_key = spec.get("parquet_key")
    if pq_key:
        recs.append(
            guarded(
                pq_key,
                "warm",
                lambda: parquet_per_file(pq_key, spec["parquet"], device, "warm", repeat),
            )
        )
    if spec.get("cold"):
        if spec.get("naive"):
            recs.append(guarded("naive", "cold", lambda: _cold_naive(spec["binary"], device)))
        if pq_key:
            recs.append(
                guarded(pq_key, "cold", lambda: _cold_parquet(pq_key, spec["parquet"], device))
            )
    return out


def _dropped(key: str) -> dict | None:
    reason = drop_page_cache()
    return None if reason is None else record(key, "cold", status="not run", note=reason)


def _cold_naive(files: list[str], device: bool) -> dict:
    return _dropped("naive") or naive(files, device, "cold")


def _cold_parquet(key: str, files: list[str], device: bool) -> dict:
    return _dropped(key) or parquet_per_file(key, files, device, "cold", 1)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    result = run_spec(spec)
    with open(spec["out"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
