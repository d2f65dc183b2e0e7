"""``dask-gpudirect bench read``: loading speed against its baselines, measured in one run.

It writes the data on the machine (``.npy`` shards and a snappy Parquet dataset), then measures,
with the page cache warm and (where it can be dropped) cold:

- the pinned host-to-device copy ceiling (device target);
- the naive path, ``open().read()`` (+ ``cupy.asarray`` on the device target);
- ``cudf.read_parquet`` per file with cuDF's defaults and with 16 kvikio threads (on the host
  target: ``pyarrow.parquet.read_table`` per file);
- ``dask_cudf.read_parquet(dir).persist()`` (host: ``dask.dataframe.read_parquet``);
- ``dd iflag=direct``, the disk's own ceiling;
- ``dg.read_parquet(dir).persist()`` and ``dg.read_binary(dir).persist()``;

and prints GB/s, ratios and the issue's targets, writing JSON and Markdown on request.

With ``--workers N`` (one worker per GPU on the device target) every Dask figure is the aggregate
of all GPUs reading their own shards at once, and the ceiling is the sum of the GPUs' pinned copy
ceilings, each measured alone in a process of its own; all GPUs copying at once is measured too
(``h2d-concurrent``), since they share host memory and maybe PCIe switches. The JSON's
``balance`` records the bytes and partitions each worker held: placement should spread them
evenly. ``--no-baselines`` skips the single-process baselines (one GPU's figures) for such runs.

Process layout (what keeps the numbers honest):

1. The single-process baselines (ceiling, naive, ``cudf.read_parquet``) run in fresh
   subprocesses (``_baselines``) *before* the cluster starts: this process then creates no CUDA
   context before ``LocalCUDACluster`` (dask-cuda's rule), the ceilings are taken on idle GPUs,
   and each kvikio thread setting gets a process of its own. libcudf resets kvikio's thread pool
   to ``KVIKIO_NTHREADS`` (default 4) on its first file read in a process, so a live
   ``kvikio.defaults.set`` before that read does not stick; an environment variable does.
2. One cluster (``dg.LocalCUDACluster`` with ``GPUDirectPlugin``; a CPU ``LocalCluster`` on the
   host target) serves every Dask measurement. ``dg`` is measured first, warm then cold, and
   ``dask_cudf`` last: dask_cudf's first read runs libcudf's kvikio set-up in the worker, which
   would otherwise reset the thread pool that ``GPUDirectPlugin`` configured. The worker's
   kvikio settings are recorded before and after, so the JSON shows what each path ran with.
3. Each Dask measurement times the whole call: planning, ``persist()`` and ``wait``; then the
   result is released and the workers are checked to hold nothing before the next one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import click

from ..cuda import gpu_count
from ._baselines import can_drop_page_cache, drop_page_cache, record, warm_page_cache
from .common import (
    GIB,
    TARGET_OPTION,
    child_env,
    cpu_name,
    footnote,
    held_keys,
    judge,
    log,
    markdown_table,
    output_options,
    print_table,
    progress_bar,
    start_cluster,
    versions,
    visible_devices,
    write_outputs,
)

#: .npy shards: float32 records of 256 values (1 KiB each).
BINARY_DTYPE, BINARY_RECORD = "<f4", (256,)
#: Parquet: on-disk bytes per row of (int64 id, float64 x, float64 y, int32 k), snappy.
PARQUET_BYTES_PER_ROW = 24
PARQUET_ROW_GROUP = 1 << 20
DATA_VERSION = 1

LABELS = {
    "h2d-pinned": {"device": "pinned host->device copy (ceiling)"},
    "h2d-concurrent": {"device": "pinned host->device copies, all GPUs at once"},
    "naive": {"device": "open().read() + cupy.asarray", "host": "open().read()"},
    "cudf-default": {
        "device": "cudf.read_parquet per file (defaults)",
        "host": "pyarrow.parquet.read_table per file",
    },
    "cudf-tuned": {"device": "cudf.read_parquet per file (KVIKIO_NTHREADS=16)"},
    "dask-default": {
        "device": "dask_cudf.read_parquet(dir).persist()",
        "host": "dask.dataframe.read_parquet(dir).persist()",
    },
    "dd-direct": {"device": "dd iflag=direct (disk ceiling)", "host": "dd iflag=direct (disk)"},
    "dg-binary": {
        "device": "dg.read_binary(dir).persist()",
        "host": "dg.read_binary(dir).persist()",
    },
    "dg-parquet": {
        "device": "dg.read_parquet(dir).persist()",
        "host": "dg.read_parquet(dir).persist()",
    },
}
#: Table order.
ORDER = [
    ("h2d-pinned", "-"),
    ("h2d-concurrent", "-"),  # only with several workers
    ("naive", "warm"),
    ("cudf-default", "warm"),
    ("cudf-tuned", "warm"),
    ("dask-default", "warm"),
    ("dg-binary", "warm"),
    ("dg-parquet", "warm"),
    ("dd-direct", "cold"),
    ("naive", "cold"),
    ("cudf-default", "cold"),
    ("cudf-tuned", "cold"),
    ("dask-default", "cold"),
    ("dg-binary", "cold"),
    ("dg-parquet", "cold"),
]
#: (path, cache) measured against (baseline, cache), with the issue's target ratio on the device
#: target; on the host target the same ratios are shown without a target.
CHECKS = [
    ("dg-binary", "warm", "h2d-pinned", "-", 0.85),
    ("dg-binary", "warm", "h2d-concurrent", "-", None),
    ("dg-binary", "warm", "naive", "warm", None),
    ("dg-parquet", "warm", "cudf-tuned", "warm", 1.0),
    ("dg-parquet", "warm", "cudf-default", "warm", None),
    ("dg-parquet", "warm", "dask-default", "warm", 2.0),
    ("dg-binary", "cold", "dd-direct", "cold", 1.5),
    ("dg-parquet", "cold", "dd-direct", "cold", 1.5),
]
#: Baselines measured in one process on one GPU: with several workers a target against them
#: would compare N GPUs with one, so those ratios are shown without a target.
ONE_GPU = {"naive", "cudf-default", "cudf-tuned"}
BASELINE_KEYS = ["naive", "cudf-default"]


def _log(message: str) -> None:
    log("read", message)


# --- data --------------------------------------------------------------------------------------


def _write_npy(path: str, nbytes: int, seed: int) -> None:
    import numpy as np

    dtype = np.dtype(BINARY_DTYPE)
    record_bytes = dtype.itemsize * math.prod(BINARY_RECORD)
    rows = max(1, nbytes // record_bytes)
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (rows, *BINARY_RECORD),
    }
    chunk = np.random.default_rng(seed).random((16 << 20) // dtype.itemsize, dtype=np.float32)
    view = memoryview(chunk).cast("B")
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        left = rows * record_bytes
        while left:
            n = min(left, len(view))
            f.write(view[:n])
            left -= n


def _write_parquet(path: str, rows: int, first_id: int, seed: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema(
        [("id", pa.int64()), ("x", pa.float64()), ("y", pa.float64()), ("k", pa.int32())]
    )
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        for start in range(0, rows, PARQUET_ROW_GROUP):
            n = min(PARQUET_ROW_GROUP, rows - start)
            table = pa.table(
                {
                    "id": np.arange(first_id + start, first_id + start + n, dtype=np.int64),
                    "x": rng.random(n),
                    "y": rng.standard_normal(n),
                    "k": rng.integers(0, 1000, n, dtype=np.int32),
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=PARQUET_ROW_GROUP)


def _dataset(directory: str, kind: str, gib: float, files: int) -> tuple[list[str], dict]:
    """Files of one dataset under ``directory``: reused when its manifest matches, else written."""
    spec = {"version": DATA_VERSION, "kind": kind, "gib": gib, "files": files}
    ext = ".npy" if kind == "binary" else ".parquet"
    paths = [os.path.join(directory, f"part-{i:03d}{ext}") for i in range(files)]
    manifest = os.path.join(directory, "_bench.json")  # '_' files are skipped by every reader
    with contextlib.suppress(OSError, ValueError):
        with open(manifest) as f:
            old = json.load(f)
        if old.get("spec") == spec and all(os.path.isfile(p) for p in paths):
            _log(f"reusing {kind} data in {directory}")
            return paths, old["info"]
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    target = int(gib * GIB)
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(files, os.cpu_count() or 1))) as pool:
        if kind == "binary":
            jobs = [pool.submit(_write_npy, p, target // files, i) for i, p in enumerate(paths)]
        else:
            rows = max(1, target // PARQUET_BYTES_PER_ROW // files)
            jobs = [
                pool.submit(_write_parquet, p, rows, i * rows, 1000 + i)
                for i, p in enumerate(paths)
            ]
        for job in jobs:
            job.result()
    os.sync()  # written back now, so that later drops are quick and warm runs see clean pages
    info = {"bytes": sum(os.path.getsize(p) for p in paths), "files": files}
    if kind == "binary":
        import numpy as np

        record_bytes = np.dtype(BINARY_DTYPE).itemsize * math.prod(BINARY_RECORD)
        info.update(
            dtype=BINARY_DTYPE,
            record_shape=list(BINARY_RECORD),
            records=files * max(1, target // files // record_bytes),
        )
    else:
        import pyarrow.parquet as pq

        metas = [pq.ParquetFile(p).metadata for p in paths]
        info.update(
            rows=sum(m.num_rows for m in metas),
            row_groups=sum(m.num_row_groups for m in metas),
            columns="id int64, x float64, y float64, k int32",
            compression="snappy",
        )
    info["write_seconds"] = round(time.perf_counter() - start, 2)
    with open(manifest, "w") as f:
        json.dump({"spec": spec, "info": info}, f)
    _log(f"wrote {kind} data: {info['bytes'] / 1e9:.2f} GB in {files} files")
    return paths, info


def _filesystem(path: str) -> str:
    """The mount type holding ``path`` (``ext4``, ``tmpfs``...), from /proc/mounts."""
    path, best, fstype = os.path.realpath(path), "", "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (
                    path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")
                ):
                    if len(parts[1]) >= len(best):
                        best, fstype = parts[1], parts[2]
    return fstype


# --- single-process baselines and dd ------------------------------------------------------------


#: ``-c`` rather than ``-m``: runpy warns when ``-m`` runs a module its package already imported.
_BASELINES_MAIN = (
    "import sys; from dask_gpudirect.bench._baselines import main; sys.exit(main(sys.argv[1:]))"
)


def _baselines(spec: dict, env: dict[str, str | None], timeout: float) -> dict:
    """Run ``_baselines`` in a fresh interpreter with ``env`` changes; returns its output."""
    return _baseline_processes([(spec, env)], timeout)[0]


def _baseline_processes(jobs: list[tuple[dict, dict[str, str | None]]], timeout: float) -> list:
    """Run one ``_baselines`` process per (spec, env changes), all at once; their outputs."""
    with tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp:
        procs, outs = [], []
        try:
            for i, (spec, env) in enumerate(jobs):
                spec = {**spec, "out": os.path.join(tmp, f"out-{i}.json")}
                cmd = [sys.executable, "-c", _BASELINES_MAIN, json.dumps(spec)]
                procs.append((subprocess.Popen(cmd, env=child_env(env)), spec["out"]))
            deadline = time.monotonic() + timeout
            for proc, path in procs:
                try:
                    code = proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = f"timed out after {timeout:.0f} s"
                if code == 0 and os.path.exists(path):
                    with open(path) as f:
                        outs.append(json.load(f))
                else:
                    why = f"baseline process failed (exit {code}); see the log above"
                    outs.append({"error": why})
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return outs


def _ceilings(devices: list[str], timeout: float, nbytes: int = 1 << 30) -> list[dict]:
    """The pinned copy ceiling of each of ``devices`` and their sum, and all of them at once.

    One fresh process per GPU (``CUDA_VISIBLE_DEVICES`` set to it), all started together: they
    measure alone in turn, then copy at the same time (``_baselines.copy_group``).
    """
    with tempfile.TemporaryDirectory(prefix="dg-ceiling-") as sync:
        group = {"size": len(devices), "sync_dir": sync, "nbytes": nbytes}
        jobs = [
            (
                {"target": "device", "ceiling_group": {**group, "rank": rank}},
                {"CUDA_VISIBLE_DEVICES": device},
            )
            for rank, device in enumerate(devices)
        ]
        outs = _baseline_processes(jobs, timeout)
    return ceiling_records(devices, outs)


def ceiling_records(devices: list[str], outs: list[dict]) -> list[dict]:
    """``h2d-pinned`` (the sum of the GPUs' ceilings, each alone) and ``h2d-concurrent`` (the
    bytes all GPUs copied at once over the span from the first start to the last end)."""
    per_gpu, spans = [], []
    for device, out in zip(devices, outs, strict=True):
        group = out.get("ceiling_group") or {}
        alone = group.get("alone") or {"status": "error", "gbps": None}
        per_gpu.append(
            {
                "device": device,
                "name": (out.get("device") or {}).get("name"),
                "status": alone["status"],
                "bytes": alone.get("bytes", 0),
                "gbps": alone["gbps"],
                "note": alone.get("note") or out.get("error", "not reported"),
            }
        )
        if group.get("concurrent"):
            span = group["concurrent"]
            spans.append(span)
            per_gpu[-1]["concurrent_gbps"] = span["bytes"] / (span["end"] - span["start"]) / 1e9
    n = len(devices)
    label = f"sum of {n} GPUs' pinned host->device copies (ceiling)"
    failed = [p for p in per_gpu if p["status"] != "ok" or not p["gbps"]]
    if failed:
        why = f"GPU {failed[0]['device']}: {failed[0]['note']}"
        summed = record("h2d-pinned", "-", status="error", note=why, label=label, per_gpu=per_gpu)
    else:
        figures = " + ".join(f"{p['gbps']:.2f}" for p in per_gpu)
        summed = record(
            "h2d-pinned",
            "-",
            bytes=sum(p["bytes"] for p in per_gpu),
            note=f"sum of {n} GPUs' ceilings, each measured alone: {figures} GB/s",
            label=label,
            per_gpu=per_gpu,
        )
        summed["gbps"] = sum(p["gbps"] for p in per_gpu)
    if len(spans) == n:
        seconds = max(s["end"] for s in spans) - min(s["start"] for s in spans)
        concurrent = record(
            "h2d-concurrent",
            "-",
            bytes=sum(s["bytes"] for s in spans),
            seconds=seconds,
            runs=[seconds],
            note=f"{n} GPUs copying at once, {spans[0]['rounds']} x "
            f"{spans[0]['bytes'] / spans[0]['rounds'] / (1 << 30):g} GiB each; bytes over the "
            "span from the first start to the last end",
        )
    else:
        concurrent = record(
            "h2d-concurrent", "-", status="error", note=f"{n - len(spans)} GPU(s) did not copy"
        )
    return [summed, concurrent]


def _dd_direct(path: str, max_bytes: int = GIB) -> dict:
    """``dd if=path of=/dev/null bs=16M iflag=direct``: sequential O_DIRECT read, page cache off."""
    if shutil.which("dd") is None:
        return record("dd-direct", "cold", status="not run", note="no dd on this machine")
    size = os.path.getsize(path)
    count = max(1, min(size, max_bytes) // (16 << 20))
    cmd = ["dd", f"if={path}", "of=/dev/null", "bs=16M", f"count={count}", "iflag=direct"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, timeout=300
    )
    match = re.search(r"^(\d+) bytes.*copied, ([0-9.e+-]+) s", proc.stderr, re.MULTILINE)
    if proc.returncode or not match:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return record("dd-direct", "cold", status="error", note=f"{shlex.join(cmd)}: {tail[0]}")
    nbytes, seconds = int(match.group(1)), float(match.group(2))
    return record(
        "dd-direct",
        "cold",
        bytes=nbytes,
        seconds=seconds,
        runs=[seconds],
        note=shlex.join(cmd),
    )


# --- Dask measurements ---------------------------------------------------------------------------


def _kvikio_state() -> dict:
    import kvikio
    import kvikio.defaults

    out = {}
    for name in ("num_threads", "compat_mode", "task_size", "auto_direct_io_read"):
        try:
            value = kvikio.defaults.get(name)
            out[name] = kvikio.CompatMode(value).name if name == "compat_mode" else str(value)
        except Exception as exc:  # a key this kvikio lacks
            out[name] = f"n/a ({type(exc).__name__})"
    return out


def _persist(client, build, check=None) -> tuple[float, str]:
    """Seconds from ``build()`` to every partition persisted; then release and wait until freed."""
    from distributed import futures_of, wait

    start = time.perf_counter()
    persisted = build().persist()
    wait(persisted)
    seconds = time.perf_counter() - start
    failed = [f for f in futures_of(persisted) if f.status != "finished"]
    if failed:
        raise RuntimeError(f"{len(failed)} partition(s) failed: {failed[0].exception()!r}")
    note = check(persisted) if check else ""
    del persisted, failed
    deadline = time.monotonic() + 30
    while sum(client.run(held_keys).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seconds, note


def _dask_measure(client, key, cache, nbytes, build, repeat, check=None) -> dict:
    if cache == "warm":
        _, note = _persist(client, build, check)  # warm-up (worker imports, pools), checked
        runs = [_persist(client, build)[0] for _ in range(max(1, repeat))]
    else:
        seconds, note = _persist(client, build, check)
        runs = [seconds]
    note = "; ".join(n for n in (note, f"median of {len(runs)}" if len(runs) > 1 else "") if n)
    return record(
        key,
        cache,
        bytes=nbytes,
        seconds=statistics.median(runs),
        runs=runs,
        note=note,
    )


def _rows_check(expected: int):
    def check(frame) -> str:
        rows = int(frame.map_partitions(len).compute().sum())
        if rows != expected:
            raise RuntimeError(f"loaded {rows} rows, the files hold {expected}")
        return f"{rows} rows in {frame.npartitions} partitions"

    return check


def _records_check(expected: int):
    def check(array) -> str:
        if array.shape[0] != expected:
            raise RuntimeError(f"array has {array.shape[0]} records, the files hold {expected}")
        return f"{array.shape[0]} records in {array.numblocks[0]} chunks"

    return check


def _spread_check(client, check, into: dict):
    """``check``, then what each worker holds of the result, kept in ``into``: placement should
    balance the shards' bytes over the workers."""

    def run(persisted) -> str:
        note = check(persisted)
        into.update(_spread(client, persisted))
        share = into["max_over_mean"]
        return f"{note}; bytes per worker max/mean {share:.2f}" if share else note

    return run


def _spread(client, persisted) -> dict:
    """Bytes and partitions of ``persisted`` per worker (every worker, zeros included)."""
    from distributed import futures_of

    futures = futures_of(persisted)
    sizes = client.nbytes([f.key for f in futures], summary=False)
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    nbytes, parts = dict.fromkeys(workers, 0), dict.fromkeys(workers, 0)
    for key, holders in client.who_has(futures).items():
        for worker in holders:
            nbytes[worker] = nbytes.get(worker, 0) + sizes.get(key, 0)
            parts[worker] = parts.get(worker, 0) + 1
    mean = sum(nbytes.values()) / len(nbytes) if nbytes else 0
    return {
        "bytes_per_worker": nbytes,
        "partitions_per_worker": parts,
        "max_over_mean": max(nbytes.values()) / mean if mean else None,
    }


def _cluster_measurements(opts, target, bin_dir, pq_dir, bin_info, pq_info, cold, out) -> None:
    """dg first (warm, then cold), the dask baseline last: see the module docstring."""
    import dask_gpudirect as dg

    recs, repeat = out["records"], opts["repeat"]
    _log(f"starting the cluster ({opts['workers']} worker(s), {opts['protocol']})")
    t0 = time.perf_counter()
    cluster, client = start_cluster(
        target, opts["workers"], opts["threads_per_worker"], opts["protocol"], opts["rmm_pool_size"]
    )
    out["cluster"] = {
        "class": f"{type(cluster).__module__}.{type(cluster).__name__}",
        "workers": opts["workers"],
        "threads_per_worker": opts["threads_per_worker"],
        "protocol": opts["protocol"],
        "start_seconds": round(time.perf_counter() - t0, 2),
    }
    try:
        kvikio_log = out.setdefault("worker_kvikio", {})

        def kvikio_snapshot(when):
            if target == "device":
                with contextlib.suppress(Exception):
                    kvikio_log[when] = client.run(_kvikio_state)

        def binary():
            return dg.read_binary(bin_dir, target=target, client=client)

        def parquet():
            return dg.read_parquet(pq_dir, target=target, client=client)

        def dask_default():
            if target == "device":
                import dask_cudf

                return dask_cudf.read_parquet(pq_dir)
            import dask.dataframe as dd

            return dd.read_parquet(pq_dir)

        runs = [
            ("dg-binary", bin_info["bytes"], binary, _records_check(bin_info["records"])),
            ("dg-parquet", pq_info["bytes"], parquet, _rows_check(pq_info["rows"])),
        ]
        if opts["workers"] > 1:  # and how evenly placement spread the shards
            balance = out.setdefault("balance", {})
            runs = [
                (key, nbytes, build, _spread_check(client, check, balance.setdefault(key, {})))
                for key, nbytes, build, check in runs
            ]
        warm_page_cache(_files(bin_dir) + _files(pq_dir))
        kvikio_snapshot("before dg")
        for key, nbytes, build, check in runs:
            _log(f"measuring {key} (warm)")
            measure = partial(_dask_measure, client, key, "warm", nbytes, build, repeat, check)
            recs.append(_guard(key, "warm", measure))
        if cold is None:
            for key, nbytes, build, check in reversed(runs):
                _log(f"measuring {key} (cold)")
                measure = partial(_cold_dask, client, key, nbytes, build, check)
                recs.append(_guard(key, "cold", measure))
        kvikio_snapshot("after dg")
        with contextlib.suppress(Exception):
            out["ledger"] = dg.report(client).to_dict(orient="records")

        warm_page_cache(_files(pq_dir))
        _log("measuring dask-default (warm)")
        nbytes, check = pq_info["bytes"], _rows_check(pq_info["rows"])
        measure = partial(
            _dask_measure, client, "dask-default", "warm", nbytes, dask_default, repeat, check
        )
        recs.append(_guard("dask-default", "warm", measure))
        kvikio_snapshot("after dask-default")
        if cold is None:
            _log("measuring dask-default (cold)")
            measure = partial(_cold_dask, client, "dask-default", nbytes, dask_default, None)
            recs.append(_guard("dask-default", "cold", measure))
    finally:
        client.close()
        cluster.close()


def _cold_dask(client, key, nbytes, build, check):
    reason = drop_page_cache()
    if reason:
        return record(key, "cold", status="not run", note=reason)
    return _dask_measure(client, key, "cold", nbytes, build, 1, check)


def _guard(key, cache, fn) -> dict:
    try:
        return fn()
    except Exception as exc:  # a failed measurement is reported; the others still run
        _log(f"{key} ({cache}) failed: {type(exc).__name__}: {exc}")
        return record(key, cache, status="error", note=f"{type(exc).__name__}: {exc}")


def _files(directory: str) -> list[str]:
    return sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if not n.startswith(("_", ".")) and os.path.isfile(os.path.join(directory, n))
    )


# --- results ------------------------------------------------------------------------------------


def _checks(records: list[dict], target: str, workers: int = 1) -> list[dict]:
    by = {(r["key"], r["cache"]): r for r in records}
    out = []
    for key, cache, base, base_cache, factor in CHECKS:
        rec, ref = by.get((key, cache)), by.get((base, base_cache))
        if rec is None or ref is None:
            continue
        one_gpu = workers > 1 and base in ONE_GPU
        want = factor if target == "device" and not one_gpu else None
        if want is None and ref.get("status") != "ok":
            continue  # on the host target, ratios only against baselines that ran
        ratio = None
        if rec.get("gbps") and ref.get("gbps"):
            ratio = rec["gbps"] / ref["gbps"]
        verdict = judge(ratio, want)
        out.append(
            {
                "path": key,
                "cache": cache,
                "baseline": base,
                "baseline_cache": base_cache,
                "ratio": ratio,
                "target": want,
                "result": verdict,
            }
        )
    return out


def label_of(key: str, target: str) -> str:
    return LABELS[key].get(target) or LABELS[key]["device"]


def _rows(result: dict) -> tuple[list[tuple[str, ...]], list[str]]:
    """Table rows (path, cache, GB/s, ratio vs baseline, target, result) and footnotes."""
    target = result["target"]
    by = {(r["key"], r["cache"]): r for r in result["records"]}
    checks: dict[tuple[str, str], list[dict]] = {}
    for c in result["checks"]:
        checks.setdefault((c["path"], c["cache"]), []).append(c)
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for key, cache in ORDER:
        rec = by.get((key, cache))
        if rec is None:
            continue
        label = rec.get("label") or label_of(key, target)
        if rec["status"] == "ok" and rec.get("gbps") is not None:
            speed = f"{rec['gbps']:.2f}"
        else:
            speed = f"{rec['status']} [{footnote(notes, rec.get('note') or 'no reason given')}]"
        for i, c in enumerate(checks.get((key, cache)) or [None]):
            first = i == 0
            head = (label, cache, speed) if first else ("", "", "")
            if c is None:
                rows.append((*head, "", "", ""))
                continue
            ratio = f"{c['ratio']:.2f}x {c['baseline']}" if c["ratio"] is not None else "-"
            want = f">= {c['target']:.2f}x" if c["target"] is not None else "-"
            rows.append((*head, ratio, want, c["result"]))
    return rows, [f"[{i + 1}] {n}" for i, n in enumerate(notes)]


HEADER = ("path", "cache", "GB/s", "ratio vs baseline", "target", "result")


def _markdown(result: dict) -> str:
    lines = [
        f"# dask-gpudirect read benchmark: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- device: {result['device']} (target `{result['target']}`)",
        f"- command: `{result['command']}`",
        f"- data: {_data_line(result)}",
        f"- page cache: {result.get('page_cache', 'not reached')}",
        *_workers_lines(result),
        "",
    ]
    rows, notes = _rows(result)
    lines.extend(markdown_table(HEADER, rows))
    lines.append("")
    lines.extend(f"{n}  " for n in notes)
    lines.append("")
    lines.append(
        "GB/s are file bytes per second (Parquet: compressed bytes on disk). Targets apply to the "
        "device target: binary warm >= 0.85x the pinned copy ceiling; Parquet >= 1.0x tuned "
        "cudf.read_parquet and >= 2x dask_cudf defaults; dropped cache >= 1.5x dd iflag=direct."
    )
    if result["options"]["workers"] > 1:
        lines += ["", MULTI_WORKER_NOTE]
    return "\n".join(lines) + "\n"


MULTI_WORKER_NOTE = (
    "With several workers (one per GPU) every GB/s is the aggregate of all of them, reading "
    "their own shards at once. The ceiling row is the sum of the GPUs' pinned copy ceilings, each "
    "measured alone, and the binary target is judged against it; the row after it is all GPUs "
    "copying at once, which shows how much of the sum the host's memory and PCIe links allow. "
    "The single-process baselines (naive, cudf.read_parquet per file) use one GPU: ratios "
    "against them carry no target."
)


def _workers_lines(result: dict) -> list[str]:
    """Markdown lines of a run with several workers: the GPUs and how placement spread bytes."""
    if result["options"]["workers"] == 1:
        return []
    per = "one per GPU" if result["target"] == "device" else "worker processes"
    lines = [f"- workers: {result['options']['workers']}, {per}"]
    devices = result.get("devices")
    if devices:
        lines[0] += " (" + ", ".join(f"{d['device']}: {d['name']}" for d in devices) + ")"
    for key, spread in sorted((result.get("balance") or {}).items()):
        if spread.get("max_over_mean"):
            gbs = ", ".join(f"{b / 1e9:.3g}" for b in spread["bytes_per_worker"].values())
            parts = ", ".join(map(str, spread["partitions_per_worker"].values()))
            lines.append(
                f"- placement of {key}: GB per worker {gbs} (max/mean "
                f"{spread['max_over_mean']:.2f}); partitions per worker {parts}"
            )
    return lines


def _data_line(result: dict) -> str:
    d = result.get("data") or {}
    parts = []
    if d.get("binary"):
        b = d["binary"]
        parts.append(f"binary {b['bytes'] / 1e9:.2f} GB in {b['files']} .npy files")
    if d.get("parquet"):
        p = d["parquet"]
        parts.append(
            f"Parquet {p['bytes'] / 1e9:.2f} GB, {p['rows']} rows, {p['row_groups']} row groups "
            f"in {p['files']} files"
        )
    return "; ".join(parts) + f" on {d.get('filesystem', '?')}"


def _print_table(result: dict) -> None:
    rows, notes = _rows(result)
    title = f"bench read: {result['device']} ({result['target']} target)"
    if result["options"]["workers"] > 1:
        title += f", {result['options']['workers']} workers"
    print_table(title, HEADER, rows, notes)


# --- the command --------------------------------------------------------------------------------


@click.command(name="read")
@click.option(
    "--dir",
    "root",
    default=None,
    type=click.Path(file_okay=False),
    help="Data directory (kept, and reused when it matches); default: a temporary one.",
)
@click.option("--binary-gib", default=0.25, show_default=True, type=float, help=".npy data, GiB")
@click.option("--parquet-gib", default=0.25, show_default=True, type=float, help="Parquet, GiB")
@click.option("--files", default=8, show_default=True, type=click.IntRange(1), help="files each")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1))
@click.option("--threads-per-worker", default=1, show_default=True, type=click.IntRange(1))
@click.option("--protocol", default="tcp", show_default=True, type=click.Choice(["tcp", "ucxx"]))
@click.option(
    "--rmm-pool-size", default=None, help="RMM pool per worker, e.g. 40GB (default: no pool)"
)
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1), help="warm runs")
@click.option(
    "--drop-cache/--no-drop-cache",
    default=True,
    show_default=True,
    help="Also measure with the page cache dropped (echo 3 > /proc/sys/vm/drop_caches).",
)
@click.option(
    "--baselines/--no-baselines",
    default=True,
    show_default=True,
    help="Measure the single-process baselines (naive read, cudf.read_parquet per file); "
    "the pinned copy ceiling, dd and dask_cudf are measured either way.",
)
@output_options
@TARGET_OPTION
def read(
    root,
    binary_gib,
    parquet_gib,
    files,
    workers,
    threads_per_worker,
    protocol,
    rmm_pool_size,
    repeat,
    drop_cache,
    baselines,
    json_path,
    md_path,
    target,
    plot_path,
    progress,
):
    """Loading speed of dg.read_parquet / dg.read_binary against the baselines and ceilings.

    With --workers N (one per GPU) all GPUs read their own shards at once, against the sum of
    their pinned copy ceilings.
    """
    gpus = gpu_count()
    if target == "auto":
        target = "device" if gpus else "host"
    if target == "device" and not gpus:
        raise click.UsageError("--target device needs a GPU, and none is visible here")
    if target == "device" and workers > gpus:
        raise click.UsageError(
            f"--workers {workers}: LocalCUDACluster has one worker per GPU, {gpus} visible"
        )
    if files < 2 * workers:
        _log(f"{files} files for {workers} workers: fewer than 2 per worker")
    opts = {
        "binary_gib": binary_gib,
        "parquet_gib": parquet_gib,
        "files": files,
        "workers": workers,
        "threads_per_worker": threads_per_worker,
        "protocol": protocol,
        "rmm_pool_size": rmm_pool_size,
        "repeat": repeat,
        "drop_cache": drop_cache,
        "baselines": baselines,
    }
    result = {
        "benchmark": "read",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "target": target,
        "gpus": gpus,
        "device": None,
        "host": {"cpu": cpu_name(), "cpus": os.cpu_count(), "hostname": platform.node()},
        "options": opts,
        "versions": versions(),
        "records": [],
    }
    tmp = None
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="dask-gpudirect-bench-")
    try:
        planned = [k for k in ORDER if workers > 1 or k[0] != "h2d-concurrent"]
        with progress_bar("read", result["records"], len(planned), progress):
            _run(result, opts, os.path.abspath(root), target, gpus)
    except KeyboardInterrupt:  # e.g. `timeout -s INT`: keep and write what was measured
        result["interrupted"] = True
        _log("interrupted: writing what was measured so far")
    except Exception as exc:  # data could not be written, say: still report what ran
        result["error"] = f"{type(exc).__name__}: {exc}"
        _log(f"stopped: {result['error']}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    result["device"] = result["device"] or (
        f"CPU {result['host']['cpu']}" if target == "host" else "unknown GPU"
    )
    rank = {k: i for i, k in enumerate(ORDER)}
    result["records"].sort(key=lambda r: rank.get((r["key"], r["cache"]), len(rank)))
    result["checks"] = _checks(result["records"], target, workers)
    write_outputs(result, json_path, md_path, _markdown, plot_path)
    _print_table(result)
    errors = [r for r in result["records"] if r["status"] == "error"]
    if result.get("error") or errors:
        why = f"{len(errors)} measurement(s) failed"
        if result.get("error"):
            why += f"; the run stopped: {result['error']}"
        raise SystemExit(f"{why}: see the table and the log")


def _run(result: dict, opts: dict, root: str, target: str, gpus: int) -> None:
    recs = result["records"]
    device = target == "device"
    bin_dir, pq_dir = os.path.join(root, "binary"), os.path.join(root, "parquet")
    bin_files, bin_info = _dataset(bin_dir, "binary", opts["binary_gib"], opts["files"])
    pq_files, pq_info = _dataset(pq_dir, "parquet", opts["parquet_gib"], opts["files"])
    result["data"] = {
        "dir": root,
        "filesystem": _filesystem(root),
        "binary": bin_info,
        "parquet": pq_info,
    }

    cold = can_drop_page_cache() if opts["drop_cache"] else "not asked (--no-drop-cache)"
    result["page_cache"] = "dropped before each cold run" if cold is None else f"not run: {cold}"
    if cold is not None:
        for key, cache in ORDER:
            if cache == "cold" and key != "dd-direct":
                recs.append(record(key, "cold", status="not run", note=cold))

    # Device-only rows that the host target does not measure.
    if not device:
        why = "no GPU" if not gpus else "--target host"
        recs.append(record("h2d-pinned", "-", status="not run", note=why))
        if opts["workers"] > 1:
            recs.append(record("h2d-concurrent", "-", status="not run", note=why))
        for cache in ("warm", "cold"):
            if cache == "warm" or cold is None:
                recs.append(record("cudf-tuned", cache, status="not run", note=why))
    if not opts["baselines"]:
        for key in BASELINE_KEYS + ["cudf-tuned"] * device:
            for cache in ["warm"] + ["cold"] * (cold is None):
                recs.append(record(key, cache, status="not run", note="not asked (--no-baselines)"))

    timeout = 240 + 60 * (opts["binary_gib"] + opts["parquet_gib"])
    apart = device and opts["workers"] > 1  # a ceiling per GPU, each in a process of its own
    keys = ["h2d-pinned"] * (device and not apart) + BASELINE_KEYS * opts["baselines"]
    result["device_info"] = None
    if keys:
        if opts["baselines"]:
            _log("single-process baselines (fresh process, cuDF defaults)")
            warm_page_cache(bin_files + pq_files)
        else:
            _log("pinned copy ceiling (fresh process)")
        spec = {
            "target": target,
            "binary": bin_files,
            "parquet": pq_files,
            "repeat": opts["repeat"],
            "cold": cold is None,
            "ceiling": device and not apart,
            "naive": opts["baselines"],
            "parquet_key": "cudf-default" if opts["baselines"] else None,
        }
        # 'defaults' means cuDF's own: no KVIKIO_NTHREADS inherited from the caller.
        out = _baselines(spec, {"KVIKIO_NTHREADS": None}, timeout)
        _merge(recs, out, keys, cold is None)
        result["device"] = (out.get("device") or {}).get("name") if device else None
        result["device_info"] = out.get("device")
    if device and opts["baselines"]:
        _log("single-process baselines (fresh process, KVIKIO_NTHREADS=16)")
        warm_page_cache(pq_files)
        spec = {**spec, "ceiling": False, "naive": False, "parquet_key": "cudf-tuned"}
        out = _baselines(spec, {"KVIKIO_NTHREADS": "16"}, timeout)
        _merge(recs, out, ["cudf-tuned"], cold is None)
    if apart:
        devices = visible_devices()[: opts["workers"]]
        _log(
            f"pinned copy ceilings of GPUs {','.join(devices)}: a fresh process each, "
            "alone in turn, then all at once"
        )
        ceilings = _ceilings(devices, timeout)
        recs.extend(ceilings)
        result["devices"] = ceilings[0]["per_gpu"]
        names = [d["name"] for d in result["devices"] if d["name"]]
        result["device"] = result["device"] or (names[0] if names else None)
    if not result["device"]:
        result["device"] = f"CPU {result['host']['cpu']}" if not device else "unknown GPU"

    _log("disk ceiling: dd iflag=direct")
    biggest = max(bin_files, key=os.path.getsize)
    recs.append(_guard("dd-direct", "cold", lambda: _dd_direct(biggest)))

    try:
        _cluster_measurements(opts, target, bin_dir, pq_dir, bin_info, pq_info, cold, result)
    except Exception as exc:  # the cluster did not start (or stop): its rows say why
        _log(f"cluster measurements failed: {type(exc).__name__}: {exc}")
        done = {(r["key"], r["cache"]) for r in recs}
        for key, cache in ORDER:
            if key.startswith(("dg-", "dask-")) and (key, cache) not in done:
                note = f"cluster: {type(exc).__name__}: {exc}"
                recs.append(record(key, cache, status="error", note=note))


def _merge(recs: list[dict], out: dict, keys: list[str], cold: bool) -> None:
    """Records from a baseline process; a key it did not report becomes an error record."""
    got = {(r["key"], r["cache"]): r for r in out.get("records", [])}
    for key in keys:
        caches = ["-"] if key == "h2d-pinned" else ["warm"] + ["cold"] * cold
        for cache in caches:
            recs.append(
                got.get((key, cache))
                or record(key, cache, status="error", note=out.get("error", "not reported"))
            )
