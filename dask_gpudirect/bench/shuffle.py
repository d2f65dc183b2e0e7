"""``dask-gpudirect bench shuffle``: dg.shuffle against Dask's shuffles and a raw transfer, one run.

On one cluster and one frame it measures:

- ``dg.shuffle(df, "key")``;
- Dask's task shuffle and P2P shuffle, ``df.shuffle("key", shuffle_method=...).persist()`` (on the
  device target ``df`` is a dask_cudf frame), and the same call with ``shuffle_method="gpudirect"``
  (``dask-gpudirect``: the package's exchange under Dask's own expression);
- a raw worker-to-worker transfer of one large buffer (CuPy on the device target, NumPy on the
  host), the wire's ceiling for a Dask transfer;

or, with ``--data array``, on a Dask Array of records (NumPy or CuPy chunks): a uniformly random
permutation of them, ``dg.shuffle_array(arr)`` against Dask's own array shuffle
(``arr.shuffle(groups, axis=0)``, a task graph, given the same kind of random permutation), and
the raw transfer;

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

import itertools
import math
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from ..measure import pair_transfer, start_cluster, stop_cluster
from ..shuffle import engines
from .common import (
    GIB,
    TARGET_OPTION,
    TIME_LIMIT_REACHED,
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
from .shuffle_report import (
    ARRAY_METHODS,
    DEVICE_ONLY,
    METHODS,
    checks_of,
    markdown,
    print_result,
)
from .timing import _Interrupted, _measure, _record

if TYPE_CHECKING:
    import dask.array as da
    import dask.dataframe as dd
    from distributed import Client, Worker

    from ..targets import Frame

#: Bytes per row of the frame: int64 key, float64 x and y, int64 z.
ROW_BYTES = 32
KEY_RANGE = 1 << 62
#: Measurement order: the raw transfer before the frame exists; P2P, the slowest, last.
RUN_ORDER = ("raw", "gpudirect", "rapidsmpf", "dask-gpudirect", "tasks", "p2p")
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


def _records(rows: int, first: int, width: int, target: str) -> Any:
    """Records ``first`` to ``first + rows - 1`` of the array: ``width`` int64 values each, the
    record's number and then random ones below 1000 (a 1-d chunk of numbers where ``width`` is
    1). CuPy on the device target, NumPy on the host."""
    if target == "device":
        import cupy as xp
    else:
        import numpy as xp
    out = xp.random.RandomState(first).randint(0, 1000, size=(rows, width), dtype="int64")
    out[:, 0] = xp.arange(first, first + rows, dtype="int64")
    return out if width > 1 else out[:, 0]


def _clear_ledger(dask_worker: Worker) -> None:
    from ..plugin import current_plugin

    current_plugin(dask_worker).ledger.clear()


# --- measuring ----------------------------------------------------------------------------------


def holder(i: int, partitions: int, workers: int, placement: str) -> int:
    """The worker (of ``workers``, by number) that makes partition ``i``: dealt in turn (as
    Distributed's queuing spreads a frame's tasks: each output's rows then alternate between
    the workers' inputs), or in blocks of consecutive partitions (one run a worker)."""
    return i % workers if placement == "dealt" else i * workers // partitions


class _Input:
    """The input, made on the workers and made again after a restart: a frame of
    ``ROW_BYTES``-byte rows, or (``data="array"``) an array of ``record_bytes``-byte records."""

    def __init__(
        self,
        client: Client,
        target: str,
        gib: float,
        partitions: int,
        workers: int,
        data: str = "frame",
        record_bytes: int | None = None,
        placement: str = "dealt",
    ):
        self.client, self.target, self.workers, self.data = client, target, workers, data
        self.placement = placement
        row_bytes = record_bytes if data == "array" and record_bytes else ROW_BYTES
        self.width = row_bytes // 8  # int64 values a record (the array's)
        self.rows = max(partitions, int(gib * GIB) // row_bytes)
        self.partitions = partitions
        self.collection: dd.DataFrame | da.Array | None = None
        self.nbytes = self.held = 0
        self.sums: tuple[int, ...] = ()

    def make(self) -> dict:
        """Build, persist and measure the input; returns its description."""
        from distributed import wait

        client = self.client
        if self.target == "device" and self.data == "frame":
            import dask_cudf  # noqa: F401  (registers the cuDF backend before the frame exists)
        self.collection = None
        # every worker first (after a restart too): the partitions are spread over those listed
        client.wait_for_workers(self.workers)
        workers = sorted(client.nthreads())
        base, extra = divmod(self.rows, self.partitions)
        sizes = [base + (i < extra) for i in range(self.partitions)]
        firsts = [0, *itertools.accumulate(sizes[:-1])]  # each partition's first row
        name = f"bench-{self.data}-{uuid.uuid4().hex}"
        record = (0,) if self.data == "array" and self.width > 1 else ()  # an array's 2nd axis
        keys = [(name, i, *record) for i in range(self.partitions)]
        futures = [
            client.submit(
                *(
                    (_partition, n, 1000 + i, self.target)
                    if self.data == "frame"
                    else (_records, n, first, self.width, self.target)
                ),
                workers=[workers[holder(i, self.partitions, len(workers), self.placement)]],
                allow_other_workers=False,
                pure=False,
                key=key,
            )
            for i, (n, first, key) in enumerate(zip(sizes, firsts, keys, strict=True))
        ]
        wait(futures)
        failed = [f for f in futures if f.status != "finished"]
        if failed:
            raise RuntimeError(f"{len(failed)} input partition(s) failed: {failed[0].exception()}")
        self.collection = self._collection(name, keys, futures, sizes)
        self.nbytes = sum(client.nbytes(keys, summary=False).values())
        rows, *sums = _sums(client, self.collection)
        self.sums = tuple(sums)
        if rows != self.rows:
            raise RuntimeError(f"the input has {rows} rows, {self.rows} were made")
        self.held = len(futures)
        wait_released(client, self.held)
        placed: dict[str, int] = {}
        for holders in client.who_has(futures).values():
            for worker in holders:
                placed[worker] = placed.get(worker, 0) + 1
        kind = "cuDF" if self.target == "device" else "pandas"
        columns = f"key int64 uniform over [0, 2^{KEY_RANGE.bit_length() - 1}), "
        columns += "x float64, y float64, z int64"
        if self.data == "array":
            kind = "CuPy" if self.target == "device" else "NumPy"
            columns = f"records of {self.width} int64: the record's number, then random ones"
        return {
            "kind": kind,
            "data": self.data,
            "bytes": self.nbytes,
            "rows": self.rows,
            "partitions": self.partitions,
            "columns": columns,
            "partitions_per_worker": placed,
            "placement": self.placement,
        }

    def _collection(self, name: str, keys: list, futures: list, sizes: list[int]) -> Any:
        """The partitions themselves, where they were made: a collection of tasks that alias
        them (``dd.from_delayed``) lets the scheduler run some of those, and so move
        partitions, on the other worker (seen: 8 and 24 of 32)."""
        layer = dict(zip(keys, futures, strict=True))
        if self.data == "array":
            import dask.array as da
            from dask.highlevelgraph import HighLevelGraph

            meta = self.client.submit(_records, 1, 0, self.width, self.target).result()[:0]
            chunks = (tuple(sizes), *(((self.width,),) if self.width > 1 else ()))
            return da.Array(HighLevelGraph.from_collections(name, layer), name, chunks, meta=meta)
        from dask.dataframe.dask_expr._collection import new_collection

        from ..shuffle.api import Computed

        return new_collection(
            Computed(
                layer=layer,
                _meta=self.client.submit(_meta, self.target, pure=False).result(),
                divisions=(None,) * (self.partitions + 1),
                keys=keys,
                name_prefix=name,
                _determ_token=name,
            )
        )


def _sums(client: Client, data: dd.DataFrame | da.Array) -> tuple[int, ...]:
    """What a shuffle keeps, computed on the cluster: a frame's rows and the sum of its ``z``
    column; an array's records, the sum of their numbers and the sum of all values."""
    import dask.array as da

    if isinstance(data, da.Array):
        numbers = data[:, 0] if data.ndim > 1 else data
        asked = [(numbers >= 0).sum(), numbers.sum(), data.sum()]
    else:
        asked = [data.map_partitions(len).sum(), data["z"].sum()]
    return tuple(int(v) for v in client.compute(asked, sync=True))


def _misplaced_rows(client: Client, out: dd.DataFrame) -> int:
    """Rows of the shuffled ``out`` whose key Dask's own hash (every method's) puts in another
    partition: a shuffle that moved rows by another column, or none, keeps the sums."""
    counted = out.map_partitions(_misplaced, out.npartitions, meta=(None, "int64"))
    return int(client.compute(counted.sum(), sync=True))


def _misplaced(part: Any, npartitions: int, partition_info: dict | None = None) -> int:
    from dask.dataframe.shuffle import partitioning_index

    assert partition_info is not None  # Dask gives it to a function that names it
    owner = partitioning_index(part[["key"]].astype("float64"), npartitions)
    return int((owner != partition_info["number"]).sum())


def _dask_array_shuffle(arr: da.Array, seed: int) -> da.Array:
    """Dask's own array shuffle of ``arr``'s records into chunks of the sizes they had: a
    random permutation (drawn on the client, as ``dg.shuffle_array`` draws its counts there)
    cut into one group an output chunk."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(arr.shape[0])
    bounds = np.cumsum((0, *arr.chunks[0]))
    groups = [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    return arr.shuffle(groups, axis=0)


def _shuffle_run(
    client: Client, data: _Input, method: str, ignore_index: bool, keep_order: bool
) -> Callable[[], dict]:
    """One timed shuffle of ``data`` by ``method`` (a frame's with ``ignore_index`` as given,
    and dg's with ``keep_order``), checked after the clock stops."""
    import dask.array as da
    from distributed import futures_of, wait

    import dask_gpudirect as dg

    seeds = itertools.count()

    def shuffled() -> Any:
        df = data.collection
        assert df is not None, "the input is made before the shuffles"
        if isinstance(df, da.Array):
            if method == "gpudirect":
                return dg.shuffle_array(df, seed=next(seeds), client=client)
            return _dask_array_shuffle(df, next(seeds)).persist()
        if method in ("gpudirect", "rapidsmpf"):
            engine = "rapidsmpf" if method == "rapidsmpf" else "distributed"
            return dg.shuffle(
                df,
                "key",
                client=client,
                engine=engine,
                ignore_index=ignore_index,
                keep_order=keep_order,
            )
        dasks = dask_shuffle_method(method)
        return df.shuffle("key", shuffle_method=dasks, ignore_index=ignore_index).persist()

    def run() -> dict:
        if method == "gpudirect":
            client.run(_clear_ledger)  # so that the ledger read after the runs holds the last one
        start = time.perf_counter()
        out = shuffled()
        wait(out)
        seconds = time.perf_counter() - start
        failed = [f for f in futures_of(out) if f.status != "finished"]
        if failed:
            raise RuntimeError(f"{len(failed)} partition(s) failed: {failed[0].exception()!r}")
        sums = _sums(client, out)
        if sums != (data.rows, *data.sums):
            made = (data.rows, *data.sums)
            raise RuntimeError(
                f"the shuffle lost data: {sums}, the input {made} ({SUMS[data.data]})"
            )
        outputs = out.numblocks[0] if data.data == "array" else out.npartitions
        note = f"{data.partitions} -> {outputs} partitions; {SUMS[data.data]} checked"
        if data.data != "array":
            misplaced = _misplaced_rows(client, out)
            if misplaced:
                raise RuntimeError(f"{misplaced} rows are not in the partition their key hashes to")
            note += "; every key in its partition"
        if method not in ("gpudirect", "rapidsmpf", "dask-gpudirect"):
            return {"seconds": seconds, "note": note}
        note += f"; engine {shuffle_engine()}"
        phases = stage_phases(client)  # where dg's stage spent the time, the slowest worker's
        _log(
            "stage: "
            + ", ".join(f"{k.removeprefix('shuffle: ')} {s:.2f} s" for k, s in phases.items())
        )
        return {"seconds": seconds, "note": note, "phases": phases}

    return run


#: What :func:`_sums` gives, by kind of input.
SUMS = {
    "frame": "rows and sum(z)",
    "array": "records, the sum of their numbers and the sum of all values",
}


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
        inputs = _Input(
            client,
            target,
            opts["gib"],
            opts["partitions"],
            workers,
            opts["data"],
            opts["record_bytes"],
            opts["placement"],
        )
        for method in methods:
            if deadline is not None and deadline - time.monotonic() < MIN_BUDGET_S:
                add(_record(method, "not run", note=TIME_LIMIT_REACHED))
                continue
            try:
                rec, timed_out = _one_method(client, method, inputs, addresses, opts, budget, into)
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
                inputs.collection = None
    finally:
        stop_cluster(cluster, client, _log)


def _one_method(
    client: Client,
    method: str,
    inputs: _Input,
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
        run = pair_transfer(client, addresses[0], addresses[1], nbytes, inputs.target)
        after = partial(wait_released, client, 0)  # the raw transfer runs before the frame
        return _measure("raw", run, nbytes, 1, opts["repeat"], budget(), after)
    if method == "rapidsmpf" and (missing := engines.rapidsmpf_missing()):
        # as bench etl leaves out cudf-polars where it is missing: the rest still measured
        note = f"{' and '.join(missing)} not installed: pip install 'dask-gpudirect[rapidsmpf]'"
        return _record("rapidsmpf", "not run", note=note), False
    if inputs.collection is None:
        _log(f"making the {inputs.data} ({inputs.rows} rows, {inputs.partitions} partitions)")
        into["data"] = inputs.make()
        _log(f"{inputs.data}: {inputs.nbytes / 1e9:.3f} GB")
    if budget() < min(MIN_BUDGET_S, opts["method_timeout"]):  # making the input took it
        return _record(method, "not run", note=TIME_LIMIT_REACHED), False
    _log(f"measuring {method}: budget {budget():.0f} s")
    run = _shuffle_run(client, inputs, method, opts["ignore_index"], opts["keep_order"])
    after = partial(wait_released, client, inputs.held)
    out = _measure(method, run, inputs.nbytes, opts["workers"], opts["repeat"], budget(), after)
    if method == "gpudirect" and out[0]["status"] == "ok" and not out[1]:
        try:
            into["ledger"] = _ledger(client)
        except KeyboardInterrupt:  # the runs are measured: they are the method's record
            raise _Interrupted(out[0]) from None
    return out


# --- the command --------------------------------------------------------------------------------


@click.command(name="shuffle")
@TARGET_OPTION
@gib_option("--gib", "input size, GiB")
@click.option(
    "--data",
    default="frame",
    show_default=True,
    type=click.Choice(["frame", "array"]),
    help="frame: dg.shuffle of a Dask DataFrame against Dask's frame shuffles; array: "
    "dg.shuffle_array of a Dask Array of records against Dask's array shuffle",
)
@click.option(
    "--record-bytes",
    default=1024,
    show_default=True,
    type=click.IntRange(8),
    help="--data array: bytes a record (a multiple of 8: int64 values; 8 makes a 1-d array)",
)
@click.option(
    "--ignore-index",
    is_flag=True,
    help="--data frame: shuffle with ignore_index=True, every method (Dask's option: outputs "
    "labelled from 0, no index labels moved); by default the labels travel, as in Dask",
)
@click.option(
    "--keep-order/--no-keep-order",
    default=True,
    show_default=True,
    help="--data frame: dg.shuffle's keep_order; --no-keep-order lets GPU workers cut rows in "
    "no set order within an output (Dask's shuffles run as they always do)",
)
@click.option(
    "--placement",
    default="dealt",
    show_default=True,
    type=click.Choice(["dealt", "blocks"]),
    help="where the input partitions are made: dealt to the workers in turn (as Distributed's "
    "queuing spreads tasks), or in blocks of consecutive partitions, one a worker",
)
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
    callback=counts_option,
    help="input partitions, or a comma-separated sweep of counts (8,64,256,1024: the same bytes "
    "at each, each in a fresh cluster); default max(32, 4 per worker, 4 per GiB)",
)
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(0), help="warm runs")
@click.option(
    "--methods",
    default=None,
    help="comma-separated: gpudirect, rapidsmpf (dg.shuffle's RapidsMPF engine), "
    "dask-gpudirect (Dask's df.shuffle on the package's exchange), tasks, p2p, raw; default: "
    "all (rapidsmpf on the device target only; with --data array: gpudirect, tasks and raw)",
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
    data: str,
    record_bytes: int,
    ignore_index: bool,
    keep_order: bool,
    placement: str,
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
    known = ARRAY_METHODS if data == "array" else METHODS
    target, gpus, chosen, workers, protocol = resolve_run(
        target,
        ",".join(known) if methods is None else methods,
        known,
        workers,
        protocol,
        rmm_pool_size,
    )
    chosen = device_only(chosen, DEVICE_ONLY, target, methods is None)
    if record_bytes % 8:
        raise click.BadParameter(
            f"{record_bytes}: use a multiple of 8", param_hint="--record-bytes"
        )
    if ignore_index and data == "array":
        raise click.UsageError("--ignore-index: an array's records have no index to drop")
    if not keep_order and data == "array":
        raise click.UsageError("--no-keep-order: an array's shuffle is a random permutation")
    if ucx_transports != "auto" and (protocol != "ucxx" or target != "device"):
        raise click.UsageError("--ucx-transports nvlink needs --protocol ucxx on the device target")
    opts: dict[str, Any] = {
        "gib": gib,
        "data": data,
        "record_bytes": record_bytes if data == "array" else None,
        "ignore_index": ignore_index,
        "keep_order": keep_order,
        "placement": placement,
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
    planned = [(key, n) for n in opts["partitions"] for key in opts["methods"]]
    why = stop_reason(result)
    for key, n in unrecorded(result["records"], planned, ("key", "partitions")):
        result["records"].append({**_record(key, "not run", note=why), "partitions": n})
    result["records"].sort(key=lambda r: (r["partitions"], METHODS.index(r["key"])))
    result["checks"] = checks_of(result["records"], target, workers, data)
    finish(result, target, print_result, (json_path, md_path, markdown, plot_path))
