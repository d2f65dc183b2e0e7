"""``dask-gpudirect bench read --remote``: reads from object storage against their baselines,
in one run.

The data ``bench read`` writes is served on loopback, by a ranged HTTP server
(:mod:`.range_server`, ``--remote http``) or by moto's S3 server (:mod:`.s3_server`,
``--remote s3``), and read through its URLs, each figure the median of ``--repeat`` runs after
a checked warm-up:

- ``server``: plain ranged GETs of every Parquet file into host memory on a worker, decoded by
  nothing (kvikio's libcurl on the device target, urllib threads on the host target): the
  server's rate as the readers' own client sees it, the ceiling of reads that decode;
- ``cudf-url``: ``cudf.read_parquet(url)`` per file on a worker, with ``kvikio_remote_io`` on
  (cuDF's option; it takes effect for ``s3://`` only, which s3fs lists and libcudf then reads
  through its own KvikIO source, with the ``AWS_*`` variables of :func:`.aws_environment` on
  the worker; an ``http://`` file cuDF fetches whole through fsspec first); host target:
  ``pyarrow.parquet.read_table`` of each file's bytes;
- ``dask-url``: ``dask_cudf.read_parquet(urls).persist()`` (host: ``dd.read_parquet``), which
  reads through fsspec's HTTP or S3 file system (``not run`` where fsspec lacks aiohttp or
  s3fs);
- ``dg-parquet``, ``dg-binary``: ``dg.read_parquet(urls)`` and ``dg.read_binary(urls)``,
  persisted.

The target: ``dg-parquet`` at least 1.0 x the faster of ``cudf-url`` and ``dask-url``.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any
from unittest import mock

from .. import remote
from ..measure import start_cluster, stop_cluster
from ..shards import Layout
from ._baselines import record
from .common import log
from .datasets import dataset
from .persisting import dask_measure, guarded, records_check, rows_check
from .range_server import base_url, serving
from .s3_server import aws_environment, s3_serving
from .tables import judge, judged_text, markdown_table, print_table

if TYPE_CHECKING:
    from distributed import Client

#: What ``dg-parquet`` must reach, over the faster per-URL baseline.
TARGET = 1.0
#: The measurements, in the order they run.
KEYS = ("server", "cudf-url", "dask-url", "dg-parquet", "dg-binary")
HEADER = ["measurement", "GB/s", "seconds", "of the server's rate", "note"]


def _log(message: str) -> None:
    log("read --remote", message)


def fetch(url: str, pool: ThreadPoolExecutor, options: dict | None = None) -> bytes:
    """Every byte of ``url`` by ranged GETs of ``gpudirect.remote.range-size``, in ``pool``."""
    settings = remote.Settings.current()
    with remote.opened(url, remote.Store.from_options(options)) as obj:
        assert isinstance(obj, remote.Object)
        pieces = Layout(((0, obj.size),)).pieces(settings.range_size)
        return b"".join(pool.map(lambda piece: obj.pread(piece[2], piece[0]), pieces))


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, list[float]]:
    """The median seconds of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), runs


def _server_rate_on_worker(
    urls: list[str], repeat: int, device: bool, options: dict | None
) -> tuple[float, list[float]]:
    """Run on a worker: every byte of ``urls`` into host memory by ranged GETs, decoded by
    nothing: kvikio's libcurl on the device target (the client dg's device reads use), urllib
    or pyarrow's S3 client in ``gpudirect.remote.connections`` threads on the host target (the
    host target's)."""
    if not device:
        with ThreadPoolExecutor(remote.Settings.current().connections) as pool:
            return _timed(lambda: [fetch(url, pool, options) for url in urls], repeat)
    import numpy as np

    from ..targets.device import remote_file

    store = remote.Store.from_options(options)
    with contextlib.ExitStack() as opened:  # each object's HEAD once, before the clock
        objects = []
        for url in urls:
            obj = opened.enter_context(remote.opened(url, store))
            assert isinstance(obj, remote.Object)
            objects.append(obj)

        def read_all() -> None:  # every file at once, as dg's reads are
            files = [remote_file(obj) for obj in objects]
            try:
                buffers = [np.empty(f.nbytes(), dtype=np.uint8) for f in files]  # alive till read
                futures = [f.pread(buffer) for f, buffer in zip(files, buffers, strict=True)]
                for future in futures:
                    future.get()
            finally:
                for f in files:
                    f.close()

        return _timed(read_all, repeat)


def _per_file_on_worker(
    urls: list[str], repeat: int, device: bool, options: dict | None
) -> tuple[float, list[float]]:
    """Run on a worker: each URL read whole by cuDF or pyarrow."""
    if device:
        import cudf

        def read_all() -> None:
            with cudf.option_context("kvikio_remote_io", True):
                for url in urls:
                    cudf.read_parquet(url, storage_options=options)

        # libcudf's S3 source reads the process's (C) environment, which os.environ sets
        with mock.patch.dict(os.environ, aws_environment(options) if options else {}):
            return _timed(read_all, repeat)
    import pyarrow.parquet as pq

    with ThreadPoolExecutor(remote.Settings.current().connections) as pool:
        return _timed(
            lambda: [pq.read_table(io.BytesIO(fetch(url, pool, options))) for url in urls], repeat
        )


def run(result: dict, opts: dict, root: str, target: str) -> None:
    """Every measurement of the module docstring into ``result["records"]``."""
    recs, repeat, device = result["records"], opts["repeat"], target == "device"
    bin_files, bin_info = dataset(
        os.path.join(root, "binary"), "binary", opts["binary_gib"], opts["files"]
    )
    pq_files, pq_info = dataset(
        os.path.join(root, "parquet"), "parquet", opts["parquet_gib"], opts["files"]
    )
    result["data"] = {"dir": root, "binary": bin_info, "parquet": pq_info}
    store = opts.get("remote", "http")
    with _store(root, store) as (base, options):
        pq_urls = [f"{base}/parquet/{os.path.basename(p)}" for p in pq_files]
        bin_urls = [f"{base}/binary/{os.path.basename(p)}" for p in bin_files]
        result["server"] = f"{base} ({SERVERS[store]}" + (
            f", endpoint {options['endpoint_url']})" if options else ")"
        )
        _log(f"serving {root} at {result['server']}")
        _log(f"starting the cluster ({opts['workers']} worker(s))")
        cluster, client = start_cluster(
            target,
            opts["workers"],
            opts["threads_per_worker"],
            opts["protocol"],
            opts["rmm_pool_size"],
        )
        try:
            _cluster_runs(
                client, recs, pq_urls, bin_urls, pq_info, bin_info, repeat, device, options
            )
        finally:
            stop_cluster(cluster, client, _log)


#: What serves the data, by ``--remote``.
SERVERS = {"http": "Python's ranged HTTP server", "s3": "moto's S3 server"}


@contextlib.contextmanager
def _store(root: str, store: str) -> Iterator[tuple[str, dict | None]]:
    """``root`` served on loopback by ``store``: the base URL and the storage_options (None
    over HTTP)."""
    if store == "s3":
        with s3_serving(root) as (base, options):
            yield base, options
        return
    with serving(root) as server:
        yield base_url(server), None


def _cluster_runs(
    client: Client,
    recs: list[dict],
    pq_urls: list[str],
    bin_urls: list[str],
    pq_info: dict,
    bin_info: dict,
    repeat: int,
    device: bool,
    options: dict | None,
) -> None:
    import dask_gpudirect as dg

    target = "device" if device else "host"
    nbytes, rows = pq_info["bytes"], pq_info["rows"]

    worker = sorted(client.nthreads())[0]

    def on_worker(
        key: str, fn: Callable[..., tuple[float, list[float]]], note: str
    ) -> Callable[[], dict]:
        """A measurement that runs ``fn`` over the Parquet URLs on one worker."""

        def measure() -> dict:
            seconds, runs = client.run(fn, pq_urls, repeat, device, options, workers=[worker])[
                worker
            ]
            return record(key, "warm", bytes=nbytes, seconds=seconds, runs=runs, note=note)

        return measure

    how = "kvikio (libcurl)" if device else ("pyarrow's S3 client" if options else "urllib")
    server = on_worker(
        "server",
        _server_rate_on_worker,
        f"ranged GETs of every Parquet file into host memory on a worker, by {how}",
    )
    how_cudf = "s3fs lists, libcudf's KvikIO source reads" if options else "fetched whole by fsspec"
    per_file = on_worker(
        "cudf-url",
        _per_file_on_worker,
        f"cuDF per file ({how_cudf})" if device else "pyarrow per file",
    )

    def dask_url() -> Any:
        if device:
            import dask_cudf

            return dask_cudf.read_parquet(pq_urls, storage_options=options)
        import dask.dataframe as dd

        return dd.read_parquet(pq_urls, storage_options=options)

    def dask_measured() -> dict:
        try:
            return dask_measure(
                client, "dask-url", "warm", nbytes, dask_url, repeat, rows_check(rows)
            )
        except ImportError as exc:  # fsspec's HTTP file system needs aiohttp, S3 needs s3fs
            return record("dask-url", "warm", status="not run", note=f"{exc}".splitlines()[-1])

    runs: list[tuple[str, Callable[[], dict]]] = [
        ("server", server),
        ("cudf-url", per_file),
        ("dask-url", dask_measured),
        (
            "dg-parquet",
            partial(
                dask_measure,
                client,
                "dg-parquet",
                "warm",
                nbytes,
                lambda: dg.read_parquet(
                    pq_urls, target=target, client=client, storage_options=options
                ),
                repeat,
                rows_check(rows),
            ),
        ),
        (
            "dg-binary",
            partial(
                dask_measure,
                client,
                "dg-binary",
                "warm",
                bin_info["bytes"],
                lambda: dg.read_binary(
                    bin_urls, target=target, client=client, storage_options=options
                ),
                repeat,
                records_check(bin_info["records"]),
            ),
        ),
    ]
    for key, measure in runs:
        _log(f"measuring {key}")
        recs.append(guarded(key, "warm", measure))


def checks_of(records: list[dict]) -> list[dict]:
    """``dg-parquet`` over the faster of ``cudf-url`` and ``dask-url``, where both ran."""
    by = {r["key"]: r for r in records if r.get("gbps")}
    bases = [by[k] for k in ("cudf-url", "dask-url") if k in by]
    if "dg-parquet" not in by or not bases:
        return []
    best = max(bases, key=lambda r: r["gbps"])
    ratio = by["dg-parquet"]["gbps"] / best["gbps"]
    return [
        {
            "what": f"dg-parquet / {best['key']}",
            "ratio": ratio,
            "target": TARGET,
            "verdict": judge(ratio, TARGET),
        }
    ]


def _rows(result: dict) -> list[list[str]]:
    server = next((r for r in result["records"] if r["key"] == "server" and r.get("gbps")), None)
    rows = []
    for r in result["records"]:
        gbps = f"{r['gbps']:.2f}" if r.get("gbps") else r["status"]
        seconds = f"{r['seconds']:.3f}" if r.get("seconds") else "-"
        share = f"{r['gbps'] / server['gbps']:.2f}x" if server and r.get("gbps") else "-"
        rows.append([r["key"], gbps, seconds, share, r.get("note", "")])
    return rows


def _check_lines(result: dict) -> list[str]:
    return [
        f"{c['what']}: {judged_text(c['ratio'], c['target'])}x "
        f"(target {c['target']:.1f}x: {c['verdict']})"
        for c in result["checks"]
    ] or ["dg-parquet against the per-URL baselines: not measured (see the table)"]


def markdown(result: dict) -> str:
    lines = [
        f"# dask-gpudirect remote read benchmark: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- target: `{result['target']}`; command: `{result['command']}`",
        f"- server: {result.get('server', 'not started')}",
        "",
        *markdown_table(HEADER, _rows(result)),
        "",
        *(f"- {line}" for line in _check_lines(result)),
        "",
    ]
    return "\n".join(lines)


def print_result(result: dict) -> None:
    title = f"bench read --remote: {result['device']} ({result['target']} target)"
    print_table(title, HEADER, _rows(result), _check_lines(result))
