"""``dask-gpudirect bench shuffle``: dg.shuffle against Dask's shuffles and a raw transfer, one run.

On one cluster and one frame it measures:

- ``dg.shuffle(df, "key")``;
- Dask's task shuffle and P2P shuffle, ``df.shuffle("key", shuffle_method=...).persist()`` (on the
  device target ``df`` is a dask_cudf frame);
- a raw worker-to-worker transfer of one large buffer (CuPy on the device target, NumPy on the
  host), the wire's ceiling for a Dask transfer;

and prints GB/s per GPU, the ratios and the issue's targets (dg >= 3x the faster of Dask's
shuffles, >= 0.5x the raw transfer), plus the ledger's record of the path dg's bytes took.

What keeps the numbers honest:

1. The frame is made on the workers (CuPy or NumPy random, so nothing crosses the wire to build
   it), its partitions placed round-robin on the workers with ``client.submit(workers=...)`` so
   every worker starts with the same share, and persisted before any timing.
2. Each method runs once to warm up (worker imports, UCX endpoints, memory pools), then
   ``--repeat`` more times; a run is the whole call, graph building included, until every output
   partition is in memory. The output is checked (rows, and the sum of ``z``) outside the timing,
   then released, and the workers are seen to hold only the input before the next run.
3. Each method has a time budget (``--method-timeout``, cut to what ``--time-limit`` leaves). No
   run starts that the fastest run so far says cannot finish in it; a run that overruns is
   abandoned and recorded as timed out. After a timeout or an error the cluster is restarted (and
   the frame made again), so that leftover work or memory cannot slow the methods after it.
4. The raw transfer's time is the receiving worker's own record of it
   (``Worker.transfer_incoming_log``: the comm's read and deserialisation, without scheduling).
5. Between runs the workers are given up to 30 s to release the previous run's output.

The client holds a CUDA context on the device target (dask_cudf builds its graphs with cuDF
objects) but makes it only after the cluster has started, as dask-cuda asks.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from ..measure import pair_transfer, start_cluster, stop_cluster
from .common import (
    GIB,
    TARGET_OPTION,
    cluster_options,
    device_names,
    device_only,
    finish,
    log,
    output_options,
    progress_bar,
    resolve_run,
    result_head,
    stage_phases,
    ucx_record,
    wait_released,
)
from .shuffle_report import DEVICE_ONLY, METHODS, checks_of, markdown, print_result
from .timing import _Interrupted, _measure, _record

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client, Worker

    from ..targets import Frame

#: Bytes per row of the frame: int64 key, float64 x and y, int64 z.
ROW_BYTES = 32
KEY_RANGE = 1 << 62
#: Measurement order: the raw transfer before the frame exists; P2P, the slowest, last.
RUN_ORDER = ("raw", "gpudirect", "rapidsmpf", "tasks", "p2p")
#: Seconds kept back from --time-limit to write the outputs and close the cluster.
RESERVE_S = 15.0
#: What --time-limit must still leave for a method to start.
MIN_BUDGET_S = 5.0


def _log(message: str) -> None:
    log("shuffle", message)


# --- on the workers ---------------------------------------------------------------------------


def _partition(rows: int, seed: int, target: str) -> Frame:
    """One partition of the frame: cuDF from CuPy random on the device target, else pandas."""
    if target == "device":
        import cudf
        import cupy as xp

        frame = cudf.DataFrame
    else:
        import numpy as xp
        import pandas

        frame = pandas.DataFrame
    rs = xp.random.RandomState(seed)
    return frame(
        {
            "key": rs.randint(0, KEY_RANGE, size=rows, dtype="int64"),
            "x": rs.random_sample(rows),
            "y": rs.standard_normal(rows),
            "z": rs.randint(0, 1000, size=rows, dtype="int64"),
        }
    )


def _meta(target: str) -> Frame:
    """The frame's empty meta, cut from one row: CuPy's generators are not asked for zero."""
    return _partition(1, 0, target).iloc[:0]


def _clear_ledger(dask_worker: Worker) -> None:
    from ..plugin import current_plugin

    current_plugin(dask_worker).ledger.clear()


# --- measuring ----------------------------------------------------------------------------------


class _Frame:
    """The input frame, made on the workers; made again after a restart."""

    def __init__(self, client: Client, target: str, gib: float, partitions: int, workers: int):
        self.client, self.target, self.workers = client, target, workers
        self.rows = max(partitions, int(gib * GIB) // ROW_BYTES)
        self.partitions = partitions
        self.df: dd.DataFrame | None = None
        self.nbytes = self.z_sum = self.held = 0

    def make(self) -> dict:
        """Build, persist and measure the frame; returns its description."""
        from dask.dataframe.dask_expr._collection import new_collection
        from distributed import wait

        from ..shuffle.api import Computed

        client = self.client
        if self.target == "device":
            import dask_cudf  # noqa: F401  (registers the cuDF backend before the frame exists)
        self.df = None
        # every worker first (after a restart too): the partitions are spread over those listed
        client.wait_for_workers(self.workers)
        workers = sorted(client.nthreads())
        base, extra = divmod(self.rows, self.partitions)
        name = f"bench-frame-{uuid.uuid4().hex}"
        futures = [
            client.submit(
                _partition,
                base + (i < extra),
                1000 + i,
                self.target,
                workers=[workers[i % len(workers)]],
                allow_other_workers=False,
                pure=False,
                key=(name, i),
            )
            for i in range(self.partitions)
        ]
        meta = client.submit(_meta, self.target, pure=False).result()
        wait(futures)
        failed = [f for f in futures if f.status != "finished"]
        if failed:
            raise RuntimeError(f"{len(failed)} input partition(s) failed: {failed[0].exception()}")
        # the partitions themselves, where they were made: a collection of tasks that alias
        # them (dd.from_delayed) lets the scheduler run some of those, and so move partitions,
        # on the other worker (seen: 8 and 24 of 32)
        keys = [f.key for f in futures]
        self.df = new_collection(
            Computed(
                layer=dict(zip(keys, futures, strict=True)),
                _meta=meta,
                divisions=(None,) * (self.partitions + 1),
                keys=keys,
                name_prefix=name,
                _determ_token=name,
            )
        )
        self.nbytes = sum(client.nbytes(keys, summary=False).values())
        rows, self.z_sum = _counts(client, self.df)
        if rows != self.rows:
            raise RuntimeError(f"the frame has {rows} rows, {self.rows} were made")
        self.held = len(futures)
        wait_released(client, self.held)
        placed: dict[str, int] = {}
        for holders in client.who_has(futures).values():
            for worker in holders:
                placed[worker] = placed.get(worker, 0) + 1
        return {
            "kind": "cuDF" if self.target == "device" else "pandas",
            "bytes": self.nbytes,
            "rows": self.rows,
            "partitions": self.partitions,
            "columns": f"key int64 uniform over [0, 2^{KEY_RANGE.bit_length() - 1}), "
            "x float64, y float64, z int64",
            "partitions_per_worker": placed,
        }


def _counts(client: Client, df: dd.DataFrame) -> tuple[int, int]:
    """Rows of ``df`` and the sum of its ``z`` column, computed on the cluster."""
    rows, z_sum = client.compute([df.map_partitions(len).sum(), df["z"].sum()], sync=True)
    return int(rows), int(z_sum)


def _shuffle_run(client: Client, frame: _Frame, method: str) -> Callable[[], dict]:
    """One timed shuffle of ``frame`` by ``method``, checked after the clock stops."""
    from distributed import futures_of, wait

    def run() -> dict:
        df = frame.df
        assert df is not None, "the frame is made before the shuffles"
        if method == "gpudirect":
            client.run(_clear_ledger)  # so that the ledger read after the runs holds the last one
        start = time.perf_counter()
        if method in ("gpudirect", "rapidsmpf"):
            import dask_gpudirect as dg

            engine = "rapidsmpf" if method == "rapidsmpf" else "distributed"
            out = dg.shuffle(df, "key", client=client, engine=engine)
        else:
            out = df.shuffle("key", shuffle_method=method).persist()
        wait(out)
        seconds = time.perf_counter() - start
        failed = [f for f in futures_of(out) if f.status != "finished"]
        if failed:
            raise RuntimeError(f"{len(failed)} partition(s) failed: {failed[0].exception()!r}")
        rows, z_sum = _counts(client, out)
        if (rows, z_sum) != (frame.rows, frame.z_sum):
            raise RuntimeError(
                f"the shuffle lost data: {rows} rows and sum(z) {z_sum}, "
                f"the input has {frame.rows} and {frame.z_sum}"
            )
        note = f"{df.npartitions} -> {out.npartitions} partitions; rows and sum(z) checked"
        if method not in ("gpudirect", "rapidsmpf"):
            return {"seconds": seconds, "note": note}
        phases = stage_phases(client)  # where dg's stage spent the time, the slowest worker's
        _log(
            "stage: "
            + ", ".join(f"{k.removeprefix('shuffle: ')} {s:.2f} s" for k, s in phases.items())
        )
        return {"seconds": seconds, "note": note, "phases": phases}

    return run


# --- the run --------------------------------------------------------------------------------------


def _ledger(client: Client) -> list[dict]:
    """dg's ledger rows of the shuffle (``op`` shuffle or spill), per worker and path."""
    import dask_gpudirect as dg

    report = dg.report(client)
    if report.empty:
        return []
    return report[report["op"].isin(["shuffle", "spill"])].to_dict(orient="records")


def _sweep(result: dict, opts: dict, target: str) -> None:
    """Each partition count in turn, each in a fresh cluster; with ``--time-limit`` the counts
    share it, a later one getting what the earlier ones left."""
    counts = opts["partitions"]
    start = time.monotonic()
    for i, n in enumerate(counts):
        limit = opts["time_limit"]
        if limit is not None:
            limit = (limit - (time.monotonic() - start)) / (len(counts) - i)
        into = result if len(counts) == 1 else {"partitions": n}
        if into is not result:
            result["sweep"].append(into)
        _run(result, {**opts, "partitions": n, "time_limit": limit}, target, into)


def _run(result: dict, opts: dict, target: str, into: dict) -> None:
    """Measure every method on ``opts["partitions"]`` partitions in a cluster of its own: the
    records into ``result["records"]`` (each with its partition count), the frame and the ledger
    into ``into``."""

    def add(record: dict) -> None:
        result["records"].append({**record, "partitions": opts["partitions"]})

    methods = [m for m in RUN_ORDER if m in opts["methods"]]
    workers = opts["workers"]
    deadline = time.monotonic() + opts["time_limit"] - RESERVE_S if opts["time_limit"] else None

    def budget() -> float:
        if deadline is None:
            return opts["method_timeout"]
        return min(opts["method_timeout"], deadline - time.monotonic())

    cuda_options = {}
    if opts["ucx_transports"] == "nvlink":
        cuda_options = {"enable_tcp_over_ucx": True, "enable_nvlink": True}
    _log(f"starting the cluster ({workers} worker(s), {opts['protocol']}, {target} target)")
    t0 = time.perf_counter()
    cluster, client = start_cluster(
        target,
        workers,
        opts["threads_per_worker"],
        opts["protocol"],
        opts["rmm_pool_size"],
        **cuda_options,
    )
    try:
        client.wait_for_workers(workers)
        addresses = sorted(client.nthreads())
        result["cluster"] = {
            "class": f"{type(cluster).__module__}.{type(cluster).__name__}",
            "workers": workers,
            "threads_per_worker": opts["threads_per_worker"],
            "protocol": opts["protocol"],
            "rmm_pool_size": opts["rmm_pool_size"],
            "ucx_transports": opts["ucx_transports"] if opts["protocol"] == "ucxx" else None,
            "start_seconds": round(time.perf_counter() - t0, 2),
        }
        if opts["protocol"] == "ucxx":
            result["cluster"].update(ucx_record(client))
        frame = _Frame(client, target, opts["gib"], opts["partitions"], workers)
        for method in methods:
            if deadline is not None and deadline - time.monotonic() < MIN_BUDGET_S:
                add(_record(method, "not run", note="--time-limit reached"))
                continue
            try:
                rec, timed_out = _one_method(client, method, frame, addresses, opts, budget, into)
            except _Interrupted as stop:
                add(stop.record)
                raise
            except Exception as exc:  # one failed method is reported; the others still run
                why = f"{type(exc).__name__}: {exc}"
                _log(f"{method} failed: {why}")
                rec, timed_out = _record(method, "error", note=why), False
            add(rec)
            if (timed_out or rec["status"] == "error") and method != methods[-1]:
                # abandoned or failed work (a shuffle mid-way, memory held) must not slow the rest
                _log(f"restarting the cluster after {method} ({rec['status']})")
                client.restart()
                frame.df = None
    finally:
        stop_cluster(cluster, client, _log)


def _one_method(
    client: Client,
    method: str,
    frame: _Frame,
    addresses: list[str],
    opts: dict,
    budget: Callable[[], float],
    into: dict,
) -> tuple[dict, bool]:
    """Measure ``method`` within ``budget()`` seconds; (record, whether a run timed out)."""
    if method == "raw":
        if len(addresses) < 2:
            return _record("raw", "not run", note="needs two workers"), False
        nbytes = opts["raw_mib"] << 20
        _log(f"measuring raw: a {nbytes / 1e9:.2f} GB buffer, budget {budget():.0f} s")
        run = pair_transfer(client, addresses[0], addresses[1], nbytes, frame.target)
        after = partial(wait_released, client, 0)  # the raw transfer runs before the frame
        return _measure("raw", run, nbytes, 1, opts["repeat"], budget(), after)
    if frame.df is None:
        _log(f"making the frame ({frame.rows} rows, {frame.partitions} partitions)")
        into["data"] = frame.make()
        _log(f"frame: {frame.nbytes / 1e9:.3f} GB")
    _log(f"measuring {method}: budget {budget():.0f} s")
    run = _shuffle_run(client, frame, method)
    after = partial(wait_released, client, frame.held)
    out = _measure(method, run, frame.nbytes, opts["workers"], opts["repeat"], budget(), after)
    if method == "gpudirect" and out[0]["status"] == "ok" and not out[1]:
        into["ledger"] = _ledger(client)
    return out


def _counts_option(value: str | None) -> list[int] | None:
    """``--partitions``: one count or a comma-separated list of them, each at least 1."""
    if value is None:
        return None
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise click.BadParameter(f"{value!r}: use a count (>= 1) or distinct counts like 8,64,256")
    return sorted(counts)


# --- the command --------------------------------------------------------------------------------


@click.command(name="shuffle")
@TARGET_OPTION
@click.option("--gib", default=0.25, show_default=True, type=float, help="frame size, GiB")
@cluster_options
@click.option(
    "--ucx-transports",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "nvlink"]),
    help="ucxx only. auto: dask-cuda's default, UCX picks every transport it finds (cuda_ipc "
    "over NVLink among them); nvlink: enable_nvlink=True (UCX_TLS=tcp,cuda_copy,cuda_ipc).",
)
@click.option(
    "--partitions",
    default=None,
    callback=lambda ctx, param, value: _counts_option(value),
    help="input partitions, or a comma-separated sweep of counts (8,64,256,1024: the same bytes "
    "at each, each in a fresh cluster); default max(32, 4 per worker, 4 per GiB)",
)
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(0), help="warm runs")
@click.option(
    "--methods",
    default=None,
    help="comma-separated: gpudirect, rapidsmpf (dg.shuffle's RapidsMPF engine), tasks, p2p, "
    "raw; default: all (rapidsmpf on the device target only)",
)
@click.option(
    "--raw-mib",
    default=None,
    type=click.IntRange(1),
    help="raw transfer buffer, MiB (default: 1024 on the device target, 64 on the host)",
)
@click.option(
    "--method-timeout",
    default=150.0,
    show_default=True,
    type=click.FloatRange(1),
    help="seconds each method may take, all its runs together",
)
@click.option(
    "--time-limit",
    default=None,
    type=click.FloatRange(30),
    help="seconds for the whole run: the last methods get what is left",
)
@output_options
def shuffle(
    target: str,
    gib: float,
    workers: int | None,
    threads_per_worker: int,
    protocol: str | None,
    ucx_transports: str,
    partitions: list[int] | None,
    repeat: int,
    rmm_pool_size: str | None,
    methods: str | None,
    raw_mib: int | None,
    method_timeout: float,
    time_limit: float | None,
    json_path: str | None,
    md_path: str | None,
    plot_path: str | None,
    progress: bool,
) -> None:
    """Shuffle speed of dg.shuffle against Dask's task and P2P shuffles and a raw transfer."""
    target, gpus, chosen, workers, protocol = resolve_run(
        target, methods or ",".join(METHODS), METHODS, workers, protocol
    )
    chosen = device_only(chosen, DEVICE_ONLY, target, methods is None)
    if ucx_transports != "auto" and (protocol != "ucxx" or target != "device"):
        raise click.UsageError("--ucx-transports nvlink needs --protocol ucxx on the device target")
    opts: dict[str, Any] = {
        "gib": gib,
        "workers": workers,
        "threads_per_worker": threads_per_worker,
        "protocol": protocol,
        "ucx_transports": ucx_transports,
        "partitions": partitions or [max(32, 4 * workers, math.ceil(4 * gib))],
        "repeat": repeat,
        "rmm_pool_size": rmm_pool_size,
        "methods": chosen,
        "raw_mib": raw_mib or (1024 if target == "device" else 64),
        "method_timeout": method_timeout,
        "time_limit": time_limit,
    }
    import dask

    import dask_gpudirect  # noqa: F401  (loads the gpudirect.* defaults into dask.config)

    names = device_names() if target == "device" else []
    result = {
        **result_head("shuffle", target, gpus, opts),
        "device": names[0] if names else None,
        "device_names": names,
        "gpudirect_config": dask.config.get("gpudirect.shuffle", default={}),
        "records": [],
        **({"sweep": []} if len(opts["partitions"]) > 1 else {}),
    }
    try:
        total = len(chosen) * len(opts["partitions"])
        with progress_bar("shuffle", result["records"], total, progress):
            _sweep(result, opts, target)
    except KeyboardInterrupt:  # e.g. `timeout -s INT`: keep and write what was measured
        result["interrupted"] = True
        _log("interrupted: writing what was measured so far")
    except Exception as exc:  # the cluster did not start, say: still report what ran
        result["error"] = f"{type(exc).__name__}: {exc}"
        _log(f"stopped: {result['error']}")
    done = {(r["key"], r["partitions"]) for r in result["records"]}
    why = "interrupted" if result.get("interrupted") else result.get("error", "not reached")
    for n in opts["partitions"]:
        for key in opts["methods"]:
            if (key, n) not in done:
                result["records"].append({**_record(key, "not run", note=why), "partitions": n})
    result["records"].sort(key=lambda r: (r["partitions"], METHODS.index(r["key"])))
    result["checks"] = checks_of(result["records"], target, workers)
    finish(result, target, print_result, (json_path, md_path, markdown, plot_path))
