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
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from ..discovery import data_files
from ..measure import byte_size, start_cluster, stop_cluster
from ._baselines import can_drop_page_cache, drop_page_cache, record, warm_page_cache
from .ceilings import dd_direct, gpu_ceilings, run_baselines
from .common import (
    TARGET_OPTION,
    device_names,
    finish,
    gib_option,
    log,
    output_options,
    progress_bar,
    resolve_target,
    result_head,
    stop_reason,
    unrecorded,
    visible_devices,
)
from .datasets import dataset, filesystem
from .persisting import Check, dask_measure, guarded, records_check, rows_check
from .read_report import ORDER, checks_of, markdown, print_result

if TYPE_CHECKING:
    import dask.array as da
    import dask.dataframe as dd
    from distributed import Client

BASELINE_KEYS = ["naive", "cudf-default"]


def _log(message: str) -> None:
    log("read", message)


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


def _spread_check(client: Client, check: Check, into: dict) -> Check:
    """``check``, then what each worker holds of the result, kept in ``into``: placement should
    balance the shards' bytes over the workers."""

    def run(persisted: Any) -> str:
        note = check(persisted)
        into.update(_spread(client, persisted))
        share = into["max_over_mean"]
        return f"{note}; bytes per worker max/mean {share:.2f}" if share else note

    return run


def _spread(client: Client, persisted: Any) -> dict:
    """Bytes and partitions of ``persisted`` per worker (every worker, zeros included)."""
    from distributed import futures_of

    futures = futures_of(persisted)
    sizes = client.nbytes([f.key for f in futures], summary=False)
    workers = sorted(client.nthreads())
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


def _cluster_measurements(
    opts: dict,
    target: str,
    bin_dir: str,
    pq_dir: str,
    bin_info: dict,
    pq_info: dict,
    cold: str | None,
    out: dict,
) -> None:
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

        def kvikio_snapshot(when: str) -> None:
            if target == "device":
                with contextlib.suppress(Exception):
                    kvikio_log[when] = client.run(_kvikio_state)

        def binary() -> da.Array:
            return dg.read_binary(bin_dir, target=target, client=client)

        def parquet() -> dd.DataFrame | dd.Series:
            return dg.read_parquet(pq_dir, target=target, client=client)

        def dask_default() -> dd.DataFrame:
            if target == "device":
                import dask_cudf

                return dask_cudf.read_parquet(pq_dir)
            import dask.dataframe as dd

            return dd.read_parquet(pq_dir)

        runs = [
            ("dg-binary", bin_info["bytes"], binary, records_check(bin_info["records"])),
            ("dg-parquet", pq_info["bytes"], parquet, rows_check(pq_info["rows"])),
        ]
        if opts["workers"] > 1:  # and how evenly placement spread the shards
            balance = out.setdefault("balance", {})
            runs = [
                (key, nbytes, build, _spread_check(client, check, balance.setdefault(key, {})))
                for key, nbytes, build, check in runs
            ]
        warm_page_cache(data_files(bin_dir) + data_files(pq_dir))
        kvikio_snapshot("before dg")
        for key, nbytes, build, check in runs:
            _log(f"measuring {key} (warm)")
            measure = partial(dask_measure, client, key, "warm", nbytes, build, repeat, check)
            recs.append(guarded(key, "warm", measure))
        if cold is None:
            for key, nbytes, build, check in reversed(runs):
                _log(f"measuring {key} (cold)")
                measure = partial(_cold_dask, client, key, nbytes, build, check)
                recs.append(guarded(key, "cold", measure))
        kvikio_snapshot("after dg")
        with contextlib.suppress(Exception):
            out["ledger"] = dg.report(client).to_dict(orient="records")

        warm_page_cache(data_files(pq_dir))
        _log("measuring dask-default (warm)")
        nbytes, check = pq_info["bytes"], rows_check(pq_info["rows"])
        measure = partial(
            dask_measure, client, "dask-default", "warm", nbytes, dask_default, repeat, check
        )
        recs.append(guarded("dask-default", "warm", measure))
        kvikio_snapshot("after dask-default")
        if cold is None:
            _log("measuring dask-default (cold)")
            measure = partial(_cold_dask, client, "dask-default", nbytes, dask_default, check)
            recs.append(guarded("dask-default", "cold", measure))
    finally:
        stop_cluster(cluster, client, _log)


def _cold_dask(
    client: Client, key: str, nbytes: int, build: Callable[[], Any], check: Check | None
) -> dict:
    reason = drop_page_cache()
    if reason:
        return record(key, "cold", status="not run", note=reason)
    return dask_measure(client, key, "cold", nbytes, build, 1, check)


# --- the command --------------------------------------------------------------------------------


@click.command(name="read")
@click.option(
    "--dir",
    "root",
    default=None,
    type=click.Path(file_okay=False),
    help="Data directory (kept, and reused when it matches; a folder of files the bench did "
    "not write is refused); default: a temporary one.",
)
@gib_option("--binary-gib", ".npy data, GiB")
@gib_option("--parquet-gib", "Parquet, GiB")
@click.option("--files", default=8, show_default=True, type=click.IntRange(1), help="files each")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1))
@click.option("--threads-per-worker", default=1, show_default=True, type=click.IntRange(1))
@click.option("--protocol", default="tcp", show_default=True, type=click.Choice(["tcp", "ucxx"]))
@click.option(
    "--rmm-pool-size",
    default=None,
    callback=byte_size,
    help="RMM pool per worker, e.g. 40GB (default: no pool; device target only)",
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
@click.option(
    "--remote",
    type=click.Choice(["http", "s3"]),
    is_flag=False,
    flag_value="http",
    default=None,
    help="Read the data from object storage on loopback instead (--remote: a ranged HTTP "
    "server; --remote s3: moto's S3 server, which needs moto[server]): dg against "
    "cudf.read_parquet(url) per file and dask_cudf.read_parquet(urls), beside the server's rate.",
)
@output_options
@TARGET_OPTION
def read(
    root: str | None,
    binary_gib: float,
    parquet_gib: float,
    files: int,
    workers: int,
    threads_per_worker: int,
    protocol: str,
    rmm_pool_size: str | None,
    repeat: int,
    drop_cache: bool,
    baselines: bool,
    remote: str | None,
    json_path: str | None,
    md_path: str | None,
    target: str,
    plot_path: str | None,
    progress: bool,
) -> None:
    """Loading speed of dg.read_parquet / dg.read_binary against the baselines and ceilings.

    With --workers N (one per GPU) all GPUs read their own shards at once, against the sum of
    their pinned copy ceilings. With --remote, over HTTP or S3 (see bench/remote_read.py).
    """
    target, gpus = resolve_target(target, rmm_pool_size)
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
        "remote": remote,
    }
    result = {
        **result_head("read", target, gpus, opts),
        "device": None,
        "records": [],
    }
    if remote and plot_path:
        raise click.UsageError("--plot draws the local read's figures; not with --remote")
    tmp = None
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="dask-gpudirect-bench-")
    if remote:
        from . import remote_read

        planned = [(key, "warm") for key in remote_read.KEYS]
    else:
        planned = [k for k in ORDER if workers > 1 or k[0] != "h2d-concurrent"]
    try:
        if remote:
            names = device_names() if target == "device" else []
            result["device"] = names[0] if names else None
            with progress_bar("read", result["records"], len(planned), progress):
                remote_read.run(result, opts, os.path.abspath(root), target)
        else:
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
    if result.get("interrupted") or result.get("error"):  # name what was not measured
        why = stop_reason(result)
        missing = unrecorded(result["records"], planned, ("key", "cache"))
        result["records"] += [
            record(key, cache, status="not run", note=why) for key, cache in missing
        ]
    if remote:
        result["checks"] = remote_read.checks_of(result["records"])
        outputs = (json_path, md_path, remote_read.markdown, None)
        return finish(result, target, remote_read.print_result, outputs)
    rank = {k: i for i, k in enumerate(ORDER)}
    result["records"].sort(key=lambda r: rank.get((r["key"], r["cache"]), len(rank)))
    result["checks"] = checks_of(result["records"], target, workers)
    finish(result, target, print_result, (json_path, md_path, markdown, plot_path))


def _run(result: dict, opts: dict, root: str, target: str, gpus: int) -> None:
    recs = result["records"]
    device = target == "device"
    bin_dir, pq_dir = os.path.join(root, "binary"), os.path.join(root, "parquet")
    bin_files, bin_info = dataset(bin_dir, "binary", opts["binary_gib"], opts["files"])
    pq_files, pq_info = dataset(pq_dir, "parquet", opts["parquet_gib"], opts["files"])
    result["data"] = {
        "dir": root,
        "filesystem": filesystem(root),
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
        out = run_baselines(spec, {"KVIKIO_NTHREADS": None}, timeout)
        _merge(recs, out, keys, cold is None)
        result["device"] = (out.get("device") or {}).get("name") if device else None
        result["device_info"] = out.get("device")
    if device and opts["baselines"]:
        _log("single-process baselines (fresh process, KVIKIO_NTHREADS=16)")
        warm_page_cache(pq_files)
        spec = {**spec, "ceiling": False, "naive": False, "parquet_key": "cudf-tuned"}
        out = run_baselines(spec, {"KVIKIO_NTHREADS": "16"}, timeout)
        _merge(recs, out, ["cudf-tuned"], cold is None)
    if apart:
        devices = visible_devices()[: opts["workers"]]
        _log(
            f"pinned copy ceilings of GPUs {','.join(devices)}: a fresh process each, "
            "alone in turn, then all at once"
        )
        ceilings = gpu_ceilings(devices, timeout)
        recs.extend(ceilings)
        result["devices"] = ceilings[0]["per_gpu"]
        names = [d["name"] for d in result["devices"] if d["name"]]
        result["device"] = result["device"] or (names[0] if names else None)
    if not result["device"]:
        result["device"] = f"CPU {result['host']['cpu']}" if not device else "unknown GPU"

    _log("disk ceiling: dd iflag=direct")
    biggest = max(bin_files, key=os.path.getsize)
    recs.append(guarded("dd-direct", "cold", lambda: dd_direct(biggest)))

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
