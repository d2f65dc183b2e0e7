"""``dask-gpudirect bench etl``: Parquet -> shuffle on a key -> group-by sum, end to end.

The pipeline users run, from Parquet files this command writes, in one cluster and one run:

- ``dg``: ``dg.read_parquet`` -> ``dg.shuffle(df, key, ignore_index=True, keep_order=False,
  then=...)`` (a group-by needs neither row labels nor the rows' order; Dask's own group-by
  shuffles drop the labels too), ``then`` summing each output partition by key as its worker
  builds it, on each shuffle engine
  (``gpudirect``: the package's own exchange; ``rapidsmpf``: RapidsMPF's);
  and ``combine``: each read partition summed by key first, then those partial sums shuffled
  (the package's exchange) and summed again, as Dask's and cudf-polars' group-bys do: fewer
  rows to move where keys repeat, one more group-by where they do not;
- Dask: ``dd.read_parquet(...).groupby(key).sum(split_out=N, shuffle_method=...)`` with the task
  shuffle, (host target) P2P, and ``dask-gpudirect``: the package's exchange as Dask's method
  (``shuffle_method="gpudirect"``), a user's Dask code unchanged; on the device target ``dd``
  reads with the cuDF backend, which is what ``dask_cudf.read_parquet`` does; and ``dg-dask``:
  the same group-by of ``dg.read_parquet``'s partitions, as the README writes it (Dask sums
  each partition by key before it shuffles, as ``combine`` does by hand);
- cudf-polars' ``DaskEngine`` (device target): ``pl.scan_parquet(...).group_by(key).agg(sums)``
  run by NVIDIA's multi-GPU streaming engine on RapidsMPF, in a cluster of its own started the
  same way (it replaces each worker's RMM memory resource), its result kept on the GPUs
  (``engine.execute``) as the others' are persisted.

Group-by queries: one per count of ``--keys`` (2^24 by default; several, comma-separated, sweep
the key's cardinality, each count a key column of its own in the same files) and one by a nearly
unique key; and the read alone (``scan``: dg.read_parquet, Dask's read_parquet and
cudf-polars' scan_parquet, the four columns kept in memory), so that the read's share is seen.
Each pipeline runs once to warm up and ``--repeat`` more times; a run is the
whole pipeline, graph building included, until every output partition is in memory. After the
clock stops each result is reduced to a fingerprint (groups, sum of z, a key-weighted sum of z,
sum of x), and every method of a query must give the same one: rows lost or a key split over two
output partitions change it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import click

from ..cuda import gpu_count
from ..measure import start_cluster, stop_cluster
from .common import (
    DASK_ON_EXCHANGE,
    TARGET_OPTION,
    cluster_options,
    counts_option,
    dask_shuffle_method,
    device_names,
    device_only,
    finish,
    gib_option,
    log,
    output_options,
    progress_bar,
    resolve_run,
    result_head,
    shuffle_engine,
    stage_phases,
    stop_reason,
    ucx_record,
    unrecorded,
    wait_released,
)
from .datasets import dataset, key_column
from .etl_report import (
    DEVICE_ONLY,
    DG_METHODS,
    METHODS,
    READ_SHUFFLE_GROUP_BY,
    SCAN,
    SCAN_METHODS,
    UNIQUE,
    checks_of,
    disagreeing,
    markdown,
    print_result,
    same,
)
from .timing import _Interrupted, _measure, _record

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client, Future, Worker

    from ..targets import Frame

#: Measurement order per query: P2P, the slowest, after the others of Dask's shuffles.
RUN_ORDER = ("gpudirect", "combine", "rapidsmpf", "tasks", "dask-gpudirect", "dg-dask", "p2p")
#: The methods whose group-by shuffles through the package's exchange.
EXCHANGED = (*DG_METHODS, *DASK_ON_EXCHANGE)
#: Measured in a cluster of their own, before the others: cudf-polars is the bar of dg's
#: targets, and a run cut short by its time limit (Dask's task shuffle takes a minute a query)
#: keeps it.
OWN_CLUSTER = ("polars",)
#: The fingerprint's key weight: keys are folded below this prime so the weighted sum fits int64.
FOLD = 1_000_003


def _log(message: str) -> None:
    log("etl", message)


def queries(keys: Sequence[int]) -> dict[str, str]:
    """Query name -> its key column: a group-by sum by a key of each count of ``keys`` distinct
    values, one by a nearly unique key, and ``scan``, the read alone (the four columns of the
    first key's query, kept in memory): dg.read_parquet against dask_cudf's read and cudf-polars'
    scan of the same files."""
    by_count = {f"{_power(n)} keys": key_column(n) for n in keys}
    return {**by_count, UNIQUE: "unique", SCAN: key_column(keys[0])}


def _power(n: int) -> str:
    """``n`` as a power of two where it is one (2^24), else as it is."""
    return f"2^{n.bit_length() - 1}" if n > 1 and n & (n - 1) == 0 else str(n)


# --- on the workers -----------------------------------------------------------------------------


def _sum_by(part: Frame, key: str) -> Frame:
    """One output partition of dg's pipeline: the group-by sum of the rows the shuffle put here,
    its groups unsorted as every other method leaves them (cudf-polars' ``group_by``, Dask's
    group-by with ``split_out``): sorting a nearly unique key's groups is work the peers skip."""
    return part.groupby(key, sort=False).sum()


def _partial_sums(part: Frame, key: str) -> Frame:
    """One read partition's sums by key, the key a column again: what ``combine`` shuffles."""
    return part.groupby(key, sort=False).sum().reset_index()


def _fingerprint(part: Frame, key: str) -> dict:
    """What two correct results of one query share, from one partition of group-by sums."""
    flat = part.reset_index()
    return {
        "groups": int(len(flat)),
        "z": int(flat["z"].sum()),
        "kz": int(((flat[key] % FOLD) * (flat["z"] % FOLD)).sum()),
        "x": float(flat["x"].sum()),
    }


# --- measuring ----------------------------------------------------------------------------------


def _pipeline(
    client: Client, method: str, paths: list[str], key: str, query: str
) -> tuple[int, dd.DataFrame, dict, dict]:
    """The read's partition count, the query's collection, persisted, and for dg the seconds
    of each phase (planning; then reading, shuffling and grouping, one step: the shuffle of an
    unpersisted read starts while the reads run, as a user's ``dg.shuffle(dg.read_parquet(...))``
    does, and sums each output as its worker builds it, ``then=``; so that a missed target
    says where the time went) and the read's partitions (futures) for the scan. Each library
    cuts the files into partitions its own way. ``combine``'s partial sums run in the read's
    tasks (Dask fuses them), so its shuffle too starts while they run."""
    from distributed import futures_of, wait

    import dask_gpudirect as dg
    from dask_gpudirect.collections import last_phases as read_phases

    columns = [key, "x", "y", "z"]
    if method in DG_METHODS:
        clock = _Clock()
        engine = "rapidsmpf" if method == "rapidsmpf" else "distributed"
        df = cast("dd.DataFrame", dg.read_parquet(paths, columns=columns, client=client))
        clock("plan")
        clock.seconds.update({f"plan: {k}": s for k, s in read_phases.items()})
        if query == SCAN:
            df = df.persist()
            wait(df)
            clock("read")
            return df.npartitions, df, clock.seconds, {"read": futures_of(df)}
        if method == "combine":
            df = df.map_partitions(_partial_sums, key, meta=_partial_sums(df._meta, key))
        sums = partial(_sum_by, key=key)
        out = dg.shuffle(
            df, key, client=client, engine=engine, ignore_index=True, keep_order=False, then=sums
        )
        clock(READ_SHUFFLE_GROUP_BY)
        return df.npartitions, out, clock.seconds, {}
    import dask.dataframe as dd

    if method == "dg-dask":
        df = cast("dd.DataFrame", dg.read_parquet(paths, columns=columns, client=client))
    else:
        df = dd.read_parquet(paths, columns=columns)
    if query == SCAN:
        return df.npartitions, df.persist(), {}, {}
    out = df.groupby(key).sum(split_out=df.npartitions, shuffle_method=dask_shuffle_method(method))
    return df.npartitions, out.persist(), {}, {}


def compute_spans(dask_worker: Worker, keys: list) -> list[tuple[float, float]]:
    """When this worker computed each of ``keys`` it holds, as ``(start, stop)`` on its clock:
    the task's own time, without the scheduling around it."""
    return [
        (span["start"], span["stop"])
        for key in keys
        if (ts := dask_worker.state.tasks.get(key)) is not None
        for span in ts.startstops
        if span["action"] == "compute"
    ]


def _longest_task(dask_worker: Worker, keys: list) -> float:
    """The longest this worker took to compute one of ``keys``, 0 where it ran none."""
    return max((stop - start for start, stop in compute_spans(dask_worker, keys)), default=0.0)


def _task_phases(client: Client, tasks: dict[str, list[Future]]) -> dict[str, float]:
    """Per phase of ``tasks``, its longest task on any worker, as ``"<phase>: longest task"``:
    what of the phase was the work itself. Asked after the clock stopped."""
    return {
        f"{phase}: longest task": max(
            client.run(_longest_task, keys=[f.key for f in futures]).values(), default=0.0
        )
        for phase, futures in tasks.items()
    }


class _Clock:
    """Seconds since the last call, by phase name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = now - self.last
        self.last = now


def _fingerprint_of(client: Client, out: dd.DataFrame, key: str) -> dict:
    """The fingerprint of a whole result, summed from its partitions' on the workers. From the
    persisted futures themselves: ``out.to_delayed()`` of a persisted ``dd.read_parquet`` of
    some of a file's columns names other keys than those persisted, and its tasks fail for lost
    dependencies (dask/dask#12488, open in Dask 2026.7.1)."""
    from distributed import futures_of

    parts = client.map(partial(_fingerprint, key=key), futures_of(out), pure=False)
    total = {"groups": 0, "z": 0, "kz": 0, "x": 0.0}
    for fp in client.gather(parts):
        for name in total:
            total[name] += fp[name]
    return total


def _etl_run(
    client: Client, method: str, paths: list[str], key: str, query: str, seen: dict
) -> Callable[[], dict]:
    """One timed run; its fingerprint goes into ``seen[method]``, checked across methods later."""
    from distributed import futures_of, wait

    def run() -> dict:
        start = time.perf_counter()
        inputs, out, phases, tasks = _pipeline(client, method, paths, key, query)
        wait(out)
        seconds = time.perf_counter() - start
        if phases:  # dg's: the work itself in the read and the group-by, ...
            phases = {**phases, **_task_phases(client, tasks)}
        del tasks
        exchanged = query != SCAN and method in EXCHANGED
        if exchanged:  # where the package's exchange spent the time, and which engine it took
            phases = {**phases, **stage_phases(client)}
        failed = [f for f in futures_of(out) if f.status != "finished"]
        if failed:
            raise RuntimeError(f"{len(failed)} partition(s) failed: {failed[0].exception()!r}")
        fp = _fingerprint_of(client, out, key)
        if not same(seen.setdefault(method, fp), fp):
            raise RuntimeError(f"two runs gave different results: {seen[method]} and {fp}")
        note = f"{inputs} -> {out.npartitions} partitions"
        if exchanged:
            note += f", engine {shuffle_engine()}"
        return {"seconds": seconds, "note": note, "phases": phases, **fp}

    return run


def _polars_run(
    engine: Any, paths: list[str], key: str, query: str, seen: dict
) -> Callable[[], dict]:
    """One timed cudf-polars query, its result left on the GPUs; fingerprinted there after."""
    import polars as pl

    def run() -> dict:
        sums = [pl.col(c).sum() for c in ("x", "y", "z")]
        plan = pl.scan_parquet(paths).select([key, "x", "y", "z"])
        if query != SCAN:
            plan = plan.group_by(key).agg(sums)
        start = time.perf_counter()
        out = engine.execute(plan)
        seconds = time.perf_counter() - start
        with out:
            fp = (
                out.lazy()
                .select(
                    pl.len().alias("groups"),
                    pl.col("z").sum(),
                    ((pl.col(key) % FOLD) * (pl.col("z") % FOLD)).sum().alias("kz"),
                    pl.col("x").sum(),
                )
                .collect(engine=engine)
                .row(0, named=True)
            )
        fp = {"groups": int(fp["groups"]), "z": int(fp["z"]), "kz": int(fp["kz"]), "x": fp["x"]}
        if not same(seen.setdefault("polars", fp), fp):
            raise RuntimeError(f"two runs gave different results: {seen['polars']} and {fp}")
        return {"seconds": seconds, "note": "RapidsMPF streaming partitions", **fp}

    return run


def read_bytes(paths: list[str], columns: list[str]) -> int:
    """The compressed bytes of ``columns``' chunks in ``paths``: what a query that reads those
    columns reads of the files (a query reads four of their five or more columns)."""
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema in columns:
                    total += chunk.total_compressed_size
    return total


def _run(result: dict, opts: dict, target: str, paths: list[str], nbytes: dict) -> None:
    """cudf-polars' methods in a cluster of their own, then the Dask-run methods in one;
    ``nbytes``: each query's bytes read."""
    if any(m in opts["methods"] for m in OWN_CLUSTER):
        try:
            _run_polars(result, opts, paths, nbytes)
        except Exception as exc:  # its cluster or engine did not start: the others still run
            why = f"{type(exc).__name__}: {exc}"
            _log(f"cudf-polars failed: {why}")
            planned = [("polars", query) for query in result["queries"]]
            for _, query in unrecorded(result["records"], planned, ("key", "query")):
                result["records"].append({**_record("polars", "error", note=why), "query": query})
    _run_dask(result, opts, target, paths, nbytes)


def _run_polars(result: dict, opts: dict, paths: list[str], nbytes: dict) -> None:
    """cudf-polars' DaskEngine on a fresh cluster of the same shape, both queries."""
    try:
        from cudf_polars.engine.dask import DaskEngine
        from cudf_polars.engine.hardware_binding import HardwareBindingPolicy
    except ImportError as exc:
        for query in result["queries"]:
            note = f"cudf-polars is not installed ({exc.name})"
            result["records"].append({**_record("polars", "not run", note=note), "query": query})
        return
    workers = opts["workers"]
    _log(f"starting a cluster for cudf-polars ({workers} worker(s))")
    cluster, client = start_cluster(
        "device", workers, opts["threads_per_worker"], opts["protocol"], opts["rmm_pool_size"]
    )
    try:
        client.wait_for_workers(workers)
        # LocalCUDACluster has bound each worker to its GPU and CPUs already; more workers than
        # GPUs share them, which cudf-polars refuses unless told
        options = {
            "hardware_binding": HardwareBindingPolicy(enabled=False),
            "allow_gpu_sharing": workers > gpu_count(),
        }
        with DaskEngine(dask_client=client, engine_options=options) as engine:
            for query, key in result["queries"].items():
                seen = result["fingerprints"].setdefault(query, {})
                _log(f"{query}: measuring polars")
                run = _polars_run(engine, paths, key, query, seen)
                rec = _measured("polars", query, run, nbytes[query], opts, lambda: None)
                result["records"].append({**rec, "query": query})
    finally:
        stop_cluster(cluster, client, _log)


def _run_dask(result: dict, opts: dict, target: str, paths: list[str], nbytes: dict) -> None:
    """Every query by every method in one cluster; records into ``result["records"]``."""
    workers = opts["workers"]
    _log(f"starting the cluster ({workers} worker(s), {opts['protocol']}, {target} target)")
    cluster, client = start_cluster(
        target, workers, opts["threads_per_worker"], opts["protocol"], opts["rmm_pool_size"]
    )
    try:
        client.wait_for_workers(workers)
        if target == "device":
            client.run(_cudf_backend)
            _cudf_backend()
        result["cluster"] = {
            "workers": workers,
            "threads_per_worker": opts["threads_per_worker"],
            "protocol": opts["protocol"],
            "rmm_pool_size": opts["rmm_pool_size"],
        }
        if opts["protocol"] == "ucxx":
            result["cluster"].update(ucx_record(client))
        for query, key in result["queries"].items():
            seen = result["fingerprints"].setdefault(query, {})
            for method in _methods(opts["methods"], query, RUN_ORDER):
                try:
                    rec = _one(client, method, query, key, paths, nbytes[query], opts, seen, target)
                except _Interrupted as stop:  # keep the runs it finished
                    result["records"].append({**stop.record, "query": query})
                    raise
                result["records"].append({**rec, "query": query})
                if rec["status"] == "timed out":
                    _log(f"restarting the cluster after {method} timed out")
                    client.restart()
    finally:
        stop_cluster(cluster, client, _log)


def _methods(chosen: list[str], query: str, order: tuple[str, ...]) -> list[str]:
    """The chosen methods that run ``query``, in ``order``: the scan has no shuffle to choose."""
    return [m for m in order if m in chosen and (query != SCAN or m in SCAN_METHODS)]


def _cudf_backend() -> None:
    """Dask's DataFrame backend set to cuDF (as ``dask_cudf`` does), in this process."""
    import dask
    import dask_cudf  # noqa: F401  (registers the backend)

    dask.config.set({"dataframe.backend": "cudf"})


def _one(
    client: Client,
    method: str,
    query: str,
    key: str,
    paths: list[str],
    nbytes: int,
    opts: dict,
    seen: dict,
    target: str,
) -> dict:
    """One method on one query, or why it was not run."""
    if method == "p2p" and target == "device":
        return _record(method, "not run", note="Dask's P2P group-by takes pandas only")
    _log(f"{query}: measuring {method}")
    run = _etl_run(client, method, paths, key, query, seen)
    return _measured(method, query, run, nbytes, opts, partial(wait_released, client, 0))


def _measured(
    method: str,
    query: str,
    run: Callable[[], dict],
    nbytes: int,
    opts: dict,
    after: Callable[[], None],
) -> dict:
    """``run`` measured within the method's time budget; a failure recorded, not raised."""
    try:
        rec, _ = _measure(
            method,
            run,
            nbytes,
            opts["workers"],
            opts["repeat"],
            opts["method_timeout"],
            after,
            bench="etl",
        )
    except Exception as exc:  # one failed method is reported; the others still run
        why = f"{type(exc).__name__}: {exc}"
        _log(f"{query}: {method} failed: {why}")
        return _record(method, "error", note=why)
    return rec


# --- the command --------------------------------------------------------------------------------


@click.command(name="etl")
@TARGET_OPTION
@click.option(
    "--dir",
    "root",
    required=True,
    type=click.Path(file_okay=False),
    help="Data directory: the Parquet files are written here, and reused when they match "
    "(a folder of files the bench did not write is refused).",
)
@gib_option("--gib", "data in memory, GiB")
@click.option(
    "--files", default=256, show_default=True, type=click.IntRange(1), help="Parquet files"
)
@click.option(
    "--keys",
    default=str(1 << 24),
    show_default=True,
    callback=counts_option,
    help="distinct values of the group-by's key, or a comma-separated sweep of counts "
    "(1024,65536,16777216: a query each, on a key column each, in the same files)",
)
@cluster_options
@click.option("--repeat", default=2, show_default=True, type=click.IntRange(0), help="warm runs")
@click.option(
    "--methods",
    default=None,
    help=f"comma-separated, of {', '.join(METHODS)}; default: all ({', '.join(DEVICE_ONLY)} on "
    "the device target only)",
)
@click.option(
    "--method-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(1),
    help="seconds each method may take on one query, all its runs together",
)
@output_options
def etl(
    target: str,
    root: str,
    gib: float,
    files: int,
    keys: list[int],
    workers: int | None,
    threads_per_worker: int,
    protocol: str | None,
    repeat: int,
    rmm_pool_size: str | None,
    methods: str | None,
    method_timeout: float,
    json_path: str | None,
    md_path: str | None,
    plot_path: str | None,
    progress: bool,
) -> None:
    """Parquet -> shuffle -> group-by sum: dg against Dask (dask_cudf on the GPU), end to end."""
    target, gpus, chosen, workers, protocol = resolve_run(
        target,
        ",".join(METHODS) if methods is None else methods,
        METHODS,
        workers,
        protocol,
        rmm_pool_size,
    )
    chosen = device_only(chosen, DEVICE_ONLY, target, methods is None)
    opts: dict[str, Any] = {
        "gib": gib,
        "files": files,
        "keys": keys,
        "workers": workers,
        "threads_per_worker": threads_per_worker,
        "protocol": protocol,
        "repeat": repeat,
        "rmm_pool_size": rmm_pool_size,
        "methods": chosen,
        "method_timeout": method_timeout,
    }
    try:
        paths, data = dataset(root, "etl", gib, files, keys=keys)
    except (MemoryError, OSError) as exc:  # --gib past the memory or the disk
        raise click.ClickException(f"cannot write the data ({type(exc).__name__}: {exc})") from None
    names = device_names() if target == "device" else []
    data["query_bytes"] = {
        query: read_bytes(paths, [key, "x", "y", "z"]) for query, key in queries(keys).items()
    }
    result = {
        **result_head("etl", target, gpus, opts),
        "device": names[0] if names else None,
        "data": data,
        "queries": queries(keys),
        "records": [],
        "fingerprints": {},
    }
    try:
        runs = sum(len(_methods(chosen, q, METHODS)) for q in result["queries"])
        with progress_bar("etl", result["records"], runs, progress):
            _run(result, opts, target, paths, data["query_bytes"])
    except KeyboardInterrupt:  # e.g. `timeout -s INT`: keep and write what was measured
        result["interrupted"] = True
        _log("interrupted: writing what was measured so far")
    except Exception as exc:  # the cluster did not start, say: still report what ran
        result["error"] = f"{type(exc).__name__}: {exc}"
        _log(f"stopped: {result['error']}")
    if result.get("interrupted") or result.get("error"):  # name what was not measured
        order = (*RUN_ORDER, *OWN_CLUSTER)
        planned = [(m, q) for q in result["queries"] for m in _methods(chosen, q, order)]
        why = stop_reason(result)
        for method, query in unrecorded(result["records"], planned, ("key", "query")):
            result["records"].append({**_record(method, "not run", note=why), "query": query})
    result["checks"] = checks_of(result, target, workers)
    finish(result, target, print_result, (json_path, md_path, markdown, plot_path))
    wrong = disagreeing(result["checks"])
    if wrong:  # a wrong result is a failed run, as a shuffle that loses rows is in bench shuffle
        raise SystemExit(f"results differ: {'; '.join(wrong)}: see the checks")
