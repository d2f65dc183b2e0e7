"""The ``dask-gpudirect probe`` command: a cluster to probe, and the document as JSON or tables."""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import click
from dask.utils import parse_bytes

from .. import remote
from ..measure import byte_size
from .routes import probe_cluster

if TYPE_CHECKING:
    from distributed import Client, SpecCluster
    from rich.table import Table

#: In the title of the human form's remote table: what its bandwidth measures.
REMOTE_NOTE = (
    "read into host memory on every worker: the network and the server, not the device copy"
)


def render(result: dict[str, Any]) -> None:
    """The human form: a table of workers, one of GPU peer access, and one verdict per path."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(140, shutil.get_terminal_size((140, 24)).columns))
    workers = result["workers"]
    table = Table(title=f"dask-gpudirect probe: {len(workers)} worker(s) at {result['scheduler']}")
    for column in ("worker", "host", "GPU", "UUID", "PCI bus", "NUMA", "kvikio", "GDS", "comms"):
        table.add_column(column, overflow="fold")
    for w in workers:
        gpu = w["gpu"]
        if gpu is None:  # every GPU column says so; a failure's reason goes in the first
            gpu_cells = ["no GPU" if not w["gpus"] else w["gpu_reason"]] + ["no GPU"] * 3
        else:
            numa = "-" if gpu["numa_node"] is None else str(gpu["numa_node"])
            gpu_cells = [gpu["name"], gpu["uuid"], gpu["pci_bus_id"], numa]
        gds = "yes" if w["gds"]["available"] else f"no: {w['gds']['reason']}"
        table.add_row(w["address"], w["host"], *gpu_cells, w["kvikio"] or "-", gds, _comms_cell(w))
    console.print(table)
    if result["peer_access"]:
        peers = Table(title="GPU peer access")
        for column in ("host", "from", "to", "peer access"):
            peers.add_column(column)
        for p in result["peer_access"]:
            peers.add_row(p["host"], p["from"], p["to"], "yes" if p["access"] else "no")
        console.print(peers)
    else:
        console.print("GPU peer access: no GPU pairs", highlight=False)
    if result["remote"]:
        console.print(_remote_table(result["remote"]))
    verdicts = [*result["paths"].values(), *result["remote"]]
    for path in verdicts:  # one line each, however long
        console.print(path["verdict"], markup=False, highlight=False, soft_wrap=True)


def _remote_table(objects: list[dict]) -> Table:
    """One row per ``--remote`` object and worker: reached or why not, bytes, seconds, GB/s."""
    from rich.table import Table

    table = Table(title=f"remote objects ({REMOTE_NOTE})")
    for column in ("URL", "worker", "route", "reachable", "bytes", "seconds", "GB/s"):
        table.add_column(column, overflow="fold")
    for obj in objects:
        for m in obj["measurements"]:
            reached = "yes" if m["reachable"] else f"no: {m['error']}"
            seconds = "-" if m["seconds"] is None else f"{m['seconds']:.3f}"
            gbps = "-" if m["gbps"] is None else f"{m['gbps']:.3g}"
            table.add_row(
                obj["url"], m["worker"], obj["route"], reached, str(m["bytes"]), seconds, gbps
            )
    return table


def _comms_cell(w: dict) -> str:
    comms = w["comms"]
    if comms["protocol"] != "ucxx":
        return comms["protocol"]
    return (
        f"ucxx {comms['ucxx']}; progress {comms['ucx_progress']}; "
        f"configured UCX_TLS={comms['ucx_tls']}; "
        f"available: {', '.join(comms['ucx_available'])}"
    )


def _remote_url(url: str) -> str:
    """``url`` checked before any worker is asked: an object store's URL without credentials
    in it (they would show in the output)."""
    if not remote.is_remote(url):
        raise click.BadParameter(f"{url}: not an s3:// or http(s):// URL", param_hint="--remote")
    return remote.checked_url(url)


def _store(options: str | None, urls: list[str]) -> remote.Store | None:
    """The ``--storage-options`` JSON as a Store; None (each worker's environment) without it.
    A fault is named, never the text, which may hold a secret."""
    if options is None:
        return None
    if not urls:
        raise click.UsageError("--storage-options needs --remote URL")
    try:
        parsed = json.loads(options)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not JSON ({exc.msg} at character {exc.pos})", param_hint="--storage-options"
        ) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("not a JSON object", param_hint="--storage-options")
    return remote.Store.from_options(parsed)


def _log(message: str) -> None:
    """A line on stderr, so that stdout keeps only the document."""
    click.echo(f"[probe {time.strftime('%H:%M:%S')}] {message}", err=True)


def _local_cluster(protocol: str, workers: int | None) -> tuple[SpecCluster, Client]:
    from ..cuda import gpu_count
    from ..measure import start_cluster

    # UCX logs to the worker processes' stdout, which is ours: keep `--json` output JSON.
    # (distributed-ucxx sets UCX_MEMTYPE_CACHE, which this UCX warns it no longer reads.)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")

    if gpu_count():
        return start_cluster("device", workers, 1, protocol, None)
    return start_cluster("host", workers or 2, 1, protocol, None)


@click.command()
@click.option(
    "--scheduler-address",
    envvar="DASK_SCHEDULER_ADDRESS",
    help="the cluster to probe (or $DASK_SCHEDULER_ADDRESS)",
)
@click.option(
    "--local",
    is_flag=True,
    help="start a local cluster: dg.LocalCUDACluster with a GPU, a LocalCluster without",
)
@click.option(
    "--protocol",
    type=click.Choice(["tcp", "ucxx"]),
    default="tcp",
    show_default=True,
    help="comms of the --local cluster",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    help="workers of the --local cluster [default: one per GPU, else 2]",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (docs/probe.md)")
@click.option("--quick", is_flag=True, help="skip the measurements")
@click.option(
    "--size",
    default="256MiB",
    show_default=True,
    callback=byte_size,
    help="bytes each measurement moves",
)
@click.option(
    "--remote",
    "remotes",
    multiple=True,
    metavar="URL",
    help="an s3:// or http(s):// object that every worker opens and reads up to --size of, "
    "into host memory (repeatable; --quick: only opened)",
)
@click.option(
    "--storage-options",
    metavar="JSON",
    help="how to reach the --remote objects, as dg.read_*'s storage_options (a JSON object) "
    "[default: each worker's AWS_* environment]",
)
def probe(
    scheduler_address: str | None,
    local: bool,
    protocol: str,
    workers: int | None,
    as_json: bool,
    quick: bool,
    size: str,
    remotes: tuple[str, ...],
    storage_options: str | None,
) -> None:
    """Per worker: GPU, kvikio, GDS and comms; per path: route, copies, bandwidth, verdict;
    per --remote object: whether every worker reaches it, and how fast."""
    from distributed import Client
    from distributed.comm import get_address_host_port

    from ..measure import stop_cluster

    urls = [_remote_url(url) for url in remotes]
    store = _store(storage_options, urls)

    source = click.get_current_context().get_parameter_source("scheduler_address")
    if local and source is click.core.ParameterSource.ENVIRONMENT:
        scheduler_address = None  # --local wins over $DASK_SCHEDULER_ADDRESS
    if bool(scheduler_address) == local:
        raise click.UsageError("give either --scheduler-address ADDR or --local")
    if local:
        cluster, client = _local_cluster(protocol, workers)
    else:
        try:  # before a Client, whose failed start on a bad address then hangs in __del__
            get_address_host_port(str(scheduler_address))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--scheduler-address") from None
        try:
            client = Client(scheduler_address, timeout="30s", set_as_default=False)
        except OSError as exc:
            raise click.ClickException(f"cannot reach the scheduler: {exc}") from exc
        cluster = None
    try:
        with client.as_current():  # the pair transfer waits on futures of the current client
            result = probe_cluster(client, quick, parse_bytes(size), urls, store)
    finally:
        stop_cluster(cluster, client, _log)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        render(result)
