"""``dask-gpudirect probe``: what each worker's GPU, storage and comms can do, and what they do.

The workers report their own facts (``client.run``): host, GPU, kvikio, GDS, comms, peer access.
The client assembles them with short measurements into one document: for each path (storage ->
GPU, host -> GPU, GPU -> GPU in a node and across nodes) the route in use, its copies, its
bandwidth and a verdict. Copies are counted as NVIDIA's GPUDirect write-ups count them (see
:data:`~dask_gpudirect.ledger.COPIES`). The JSON form is stable and documented in docs/probe.md.

Nothing asks CUDA anything, let alone the cuFile driver (which hangs where there is none), on a
worker where :func:`~dask_gpudirect.cuda.gpu_count` finds no GPU: that worker says "no GPU".
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import socket
import statistics
import tempfile
from typing import TYPE_CHECKING, Any

import click
from dask.utils import parse_bytes

from .ledger import COPIES, Ledger

if TYPE_CHECKING:
    from distributed import Client

#: Bumped when a key of the JSON document changes meaning or goes away (docs/probe.md).
SCHEMA_VERSION = 1
NVIDIA_FS = "/proc/driver/nvidia-fs"
#: Kernel modules that give NICs GPUDirect RDMA access to GPU memory.
PEERMEM_MODULES = ("/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem")
#: cuFile driver properties reported where nvidia-fs is loaded and a GPU exists.
DRIVER_PROPERTIES = (
    "is_gds_available",
    "major_version",
    "minor_version",
    "allow_compat_mode",
    "poll_mode",
    "max_device_cache_size",
    "max_pinned_memory_size",
)
NO_GPU = "no GPU: no CUDA driver or no visible device"
NO_GPU_STORAGE = "no GPU: reads go to host memory (storage -> host)"
#: Bytes a transfer sends to open a pair's endpoint (and warm it up before a measurement).
OPENING_TRANSFER = 1 << 20
#: Longest wait for one measurement task before the probe gives up on it and goes on.
MEASURE_TIMEOUT = 120
#: UCX's InfiniBand transports (rc_mlx5, dc_mlx5, ud_verbs, ...): RDMA between nodes.
IB_PREFIXES = ("rc", "dc", "ud")
#: The paths of the document, in order, and how verdicts name them.
LABELS = {
    "storage_to_gpu": "storage -> GPU",
    "host_to_gpu": "host -> GPU",
    "gpu_to_gpu_in_node": "GPU -> GPU in a node",
    "gpu_to_gpu_across_nodes": "GPU -> GPU across nodes",
}


# --- on the workers ------------------------------------------------------------------------------


def worker_facts(dask_worker) -> dict[str, Any]:
    """This worker's host, GPU, kvikio, GDS and comms (run by ``client.run``)."""
    from .plugin import GPUDirectPlugin

    plugin = dask_worker.plugins[GPUDirectPlugin.name]
    gpu, gpu_reason, peers = None, NO_GPU, []
    if plugin.gpus:
        try:
            gpu, peers = _gpu_facts()
            gpu_reason = None
        except Exception as exc:  # the probe reports what failed and goes on
            gpu_reason = f"GPU facts failed: {type(exc).__name__}: {exc}"
    return {
        "address": dask_worker.address,
        "host": socket.gethostname(),
        "gpus": plugin.gpus,
        "gpu": gpu,
        "gpu_reason": gpu_reason,
        "peers": peers,
        "kvikio": _version("kvikio"),
        "gds": _gds(plugin.gpus),
        "gpudirect_rdma": any(os.path.exists(m) for m in PEERMEM_MODULES),
        "comms": _comms(dask_worker.address),
        "storage_route": plugin.target("device" if plugin.gpus else "host").route,
    }


def _gpu_facts() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The worker's current GPU, and whether it can reach each other visible GPU as a peer.

    Asked of the CUDA runtime (CuPy): CUDA numbers devices as this worker sees them
    (``CUDA_VISIBLE_DEVICES``), so its current device is the worker's own GPU. NVML, which
    numbers them all, is asked only for the UUID, by PCI bus id.
    """
    import cupy

    rt = cupy.cuda.runtime
    dev = rt.getDevice()
    props = rt.getDeviceProperties(dev)
    bus = rt.deviceGetPCIBusId(dev)
    gpu = {
        "name": props["name"].decode(),
        "uuid": _nvml_uuid(bus),
        "pci_bus_id": bus,
        "numa_node": _numa_node(bus),
        "memory_bytes": int(props["totalGlobalMem"]),
    }
    peers = [
        {
            "pci_bus_id": rt.deviceGetPCIBusId(j),
            "access": bool(rt.deviceCanAccessPeer(dev, j)),
        }
        for j in range(rt.getDeviceCount())
        if j != dev
    ]
    return gpu, peers


def _nvml_uuid(pci_bus_id: str) -> str:
    """The GPU's UUID (``GPU-...``) from NVML: CuPy's copy of CUDA's is cut at its first zero."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id))
    finally:
        pynvml.nvmlShutdown()


def _numa_node(pci_bus_id: str) -> int | None:
    """The NUMA node of a PCI device from sysfs; None where the kernel knows none (-1)."""
    try:
        with open(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/numa_node") as f:
            node = int(f.read())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _gds(gpus: int) -> dict[str, Any]:
    """Whether kvikio reads by GDS here, and why not. The cuFile driver is asked only where
    nvidia-fs is loaded and a GPU exists: elsewhere opening it can hang."""
    facts: dict[str, Any] = {
        "available": False,
        "nvidia_fs": os.path.exists(NVIDIA_FS),
        "compat_mode": None,
        "compat_mode_preferred": None,
        "libcufile": None,
        "driver": None,
        "reason": None,
    }
    try:
        import kvikio.cufile_driver
        import kvikio.defaults
    except ImportError:  # the CPU install; without a GPU that is the reason that matters
        facts["reason"] = (
            "kvikio is not installed: reads go to host memory" if gpus else "no GPU, so no GDS"
        )
        return facts
    try:
        facts["compat_mode"] = kvikio.defaults.get("compat_mode").name
        facts["libcufile"] = "{}.{}".format(*kvikio.cufile_driver.libcufile_version())
        if gpus:
            facts["compat_mode_preferred"] = bool(kvikio.defaults.is_compat_mode_preferred())
            if facts["nvidia_fs"]:
                facts["driver"] = {p: kvikio.cufile_driver.get(p) for p in DRIVER_PROPERTIES}
    except Exception as exc:  # the probe reports what failed and goes on
        facts["reason"] = f"kvikio failed: {type(exc).__name__}: {exc}"
        return facts
    facts["available"] = facts["compat_mode_preferred"] is False
    facts["reason"] = _gds_reason(facts, gpus)
    return facts


def _gds_reason(facts: dict[str, Any], gpus: int) -> str:
    if not gpus:
        return "no GPU, so no GDS"
    if facts["compat_mode"] == "ON":
        return "kvikio compat mode is ON (gpudirect.reader.compat-mode), so GDS is off"
    if not facts["nvidia_fs"]:
        return "nvidia-fs is not loaded, so GDS is off"
    if not (facts["driver"] or {}).get("is_gds_available"):
        return "the cuFile driver reports GDS unavailable, so GDS is off"
    if facts["compat_mode_preferred"]:
        return "kvikio prefers its compat mode, so GDS is off"
    return f"GDS is on: nvidia-fs is loaded and compat mode is {facts['compat_mode']}"


def _comms(address: str) -> dict[str, Any]:
    """The worker's comms, and for UCX what its configuration allows (not what it picked)."""
    protocol = address.split("://", 1)[0]
    facts = {"protocol": protocol, "ucxx": None, "ucx_tls": None, "ucx_available": None}
    if protocol == "ucxx":
        import ucxx

        facts["ucxx"] = ucxx.__version__
        facts["ucx_tls"] = ucxx.get_config().get("TLS")
        facts["ucx_available"] = sorted(ucxx.get_active_transports())
    return facts


def endpoint_transports(peer: str, dask_worker=None) -> dict[str, list[str]] | None:
    """What UCX selected for this worker's endpoint to ``peer`` (run on a ucxx worker after a
    transfer from ``peer``): None when no open endpoint to it is found."""
    pool = dask_worker.rpc
    for comm in [*pool.available.get(peer, ()), *pool.occupied.get(peer, ())]:
        if not comm.closed():
            return parse_ep_info(_ucp_ep_print_info(comm.ep.ucp_endpoint))
    return None


def _ucp_ep_print_info(handle: int) -> str:
    """UCX's own description of an endpoint (``ucp_ep_print_info``), captured from its FILE*."""
    libc = ctypes.CDLL(None)
    libc.tmpfile.restype = ctypes.c_void_p
    libc.ftell.restype = ctypes.c_long
    for name in ("fflush", "ftell", "rewind", "fclose"):
        getattr(libc, name).argtypes = [ctypes.c_void_p]
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libucp = ctypes.CDLL("libucp.so.0")  # already loaded by ucxx: this finds that copy
    libucp.ucp_ep_print_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    stream = libc.tmpfile()
    try:
        libucp.ucp_ep_print_info(handle, stream)
        libc.fflush(stream)
        size = libc.ftell(stream)
        libc.rewind(stream)
        text = ctypes.create_string_buffer(size)
        libc.fread(text, 1, size, stream)
    finally:
        libc.fclose(stream)
    return text.raw.decode(errors="replace")


_LANE = re.compile(r"lane\[\d+\]:\s+\d+:(\w+)/(\S+)")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/\S")


def parse_ep_info(text: str) -> dict[str, list[str]]:
    """``ucp_ep_print_info`` output -> the endpoint's lanes (``tcp/lo.0``, ``cuda_ipc/cuda.0``),
    their transports, and the transports of the protocols UCX chose for GPU memory so far."""
    lanes: list[str] = []
    device: set[str] = set()
    gpu_table = False
    for line in text.splitlines():
        if lane := _LANE.search(line):
            lanes.append(f"{lane[1]}/{lane[2]}")
            continue
        cells = [c.strip() for c in line.lstrip("#").strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        if "cfg#" in cells[0]:  # a protocol table's header: operation and memory types
            gpu_table = "cuda" in cells[1]
        elif gpu_table and len(cells) >= 3 and cells[0][:1].isdigit():  # size | protocol | tls
            device.update(m[1] for m in _TRANSPORT.finditer(cells[-1]))
    return {
        "lanes": lanes,
        "transports": sorted({lane.split("/")[0] for lane in lanes}),
        "device_transports": sorted(device),
    }


def _measure_storage(nbytes: int) -> dict[str, Any]:
    """Write ``nbytes`` into this worker's local directory and read them twice with the plugin's
    target (a reader of its own, so the cluster's ledger stays the user's); the faster read
    counts. The file was just written, so this is the page-cache-warm rate."""
    from distributed import get_worker

    from . import targets
    from .plugin import current_plugin
    from .shards import Shard

    plugin = current_plugin()
    name = "device" if plugin.gpus else "host"
    ledger = Ledger(plugin.address, 2)
    target = targets.module(name).TARGET(plugin.options, ledger)
    fd, path = tempfile.mkstemp(prefix="probe-", dir=get_worker().local_directory)
    try:
        with os.fdopen(fd, "wb") as f:
            chunk = bytes(min(nbytes, 16 << 20))
            for start in range(0, nbytes, len(chunk)):
                f.write(chunk[: nbytes - start])
        shard = Shard(path, ((0, nbytes),), 0, nbytes, part=None, target=name)
        for _ in range(2):
            target.read(shard)
    finally:
        target.close()
        os.remove(path)
    best = min(ledger.records(), key=lambda r: r["seconds"])
    return {"route": best["path"], "copies": best["copies"], "gbps": _gbps(nbytes, best["seconds"])}


# --- on the client -------------------------------------------------------------------------------


def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None


def _measurement(workers: list[str], route, copies, gbps, reason, transports=None) -> dict:
    return {
        "workers": workers,
        "route": route,
        "copies": copies,
        "gbps": gbps,
        "reason": reason,
        "transports": transports,
    }


def _run_on(client, worker: str, func, *args) -> Any:
    """``func(*args)`` as a task on ``worker``, not run longer than :data:`MEASURE_TIMEOUT`."""
    future = client.submit(func, *args, workers=[worker], allow_other_workers=False, pure=False)
    return future.result(timeout=MEASURE_TIMEOUT)


def _failed(exc: Exception) -> str:
    return f"measurement failed: {type(exc).__name__}: {exc}"


def _storage(client, w: dict, quick: bool, nbytes: int) -> dict:
    route = w["storage_route"]
    reason = w["gds"]["reason"] if w["gpus"] else NO_GPU_STORAGE
    if quick:
        return _measurement([w["address"]], route, COPIES[route], None, reason)
    try:
        got = _run_on(client, w["address"], _measure_storage, nbytes)
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement([w["address"]], route, COPIES[route], None, _failed(exc))
    return _measurement([w["address"]], got["route"], got["copies"], got["gbps"], reason)


def _host_to_gpu(client, w: dict, quick: bool, nbytes: int) -> dict:
    if not w["gpus"]:
        return _measurement([w["address"]], None, None, None, "no GPU")
    reason = "cudaMemcpy from pinned host memory: one DMA copy"
    if quick:
        return _measurement([w["address"]], "pinned-copy", 1, None, reason)
    from .bench._baselines import pinned_ceiling

    try:
        gbps = _run_on(client, w["address"], pinned_ceiling, nbytes, 3)["gbps"]
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement([w["address"]], "pinned-copy", 1, None, _failed(exc))
    return _measurement([w["address"]], "pinned-copy", 1, gbps, reason)


def pair_route(
    target: str,
    source: str,
    dest: str,
    same_node: bool,
    transports: dict[str, list[str]] | None,
    rdma: bool,
) -> tuple[str, int | None, str]:
    """The route, copies and reason of a transfer ``source -> dest`` of ``target`` buffers.

    For UCX the answer comes from what UCX selected for the endpoint (``transports``), not from
    its configuration: in a node ``cuda_ipc`` is the one-copy P2P route; across nodes an
    InfiniBand transport with nvidia-peermem loaded on both sides is GPUDirect RDMA.
    """
    from .ledger import STAGED_ACROSS_NODES
    from .shuffle.worker import transfer_path

    path, copies = transfer_path(target, source, dest)
    used = []
    if transports:  # the endpoint's lanes, and what UCX chose for GPU memory on them
        used = sorted({*transports["transports"], *transports["device_transports"]})
    names = ", ".join(used) or "no transport"
    if target == "host":
        negotiated = f"; UCX negotiated {names}" if transports else ""
        return path, copies, f"no GPU: host memory to host memory instead{negotiated}"
    if path == "tcp-host-staged":
        return path, copies, "tcp comms: device buffers are staged through host memory"
    if transports is None:
        return "ucx", None, "UCX reported no open endpoint for this pair"
    if same_node:
        if "cuda_ipc" in used:
            return "ucx-device", 1, f"UCX negotiated {names}: cuda_ipc moves GPU to GPU (P2P)"
        return (
            "ucx-host-staged",
            2,
            f"UCX negotiated {names}, not cuda_ipc: device buffers are staged through host memory",
        )
    if rdma and any(t.startswith(IB_PREFIXES) for t in used):
        return (
            "ucx-device",
            1,
            f"UCX negotiated {names} and nvidia-peermem is loaded: GPUDirect RDMA",
        )
    return (
        "ucx-host-staged",
        STAGED_ACROSS_NODES,
        f"UCX negotiated {names} without GPUDirect RDMA: device buffers are staged through host "
        "memory",
    )


def _pair(client, a: dict, b: dict, same_node: bool, quick: bool, nbytes: int) -> dict:
    """A buffer made on ``a`` and fetched by a task on ``b``, timed by ``b``'s own log of the
    fetch. A small transfer goes first (and alone with ``quick``): it opens the endpoint."""
    from .bench.shuffle import _raw_run

    target = "device" if a["gpus"] and b["gpus"] else "host"
    names = [a["address"], b["address"]]
    try:
        _raw_run(client, *names, OPENING_TRANSFER, target)()
        seconds = (
            None
            if quick
            else min(_raw_run(client, *names, nbytes, target)()["seconds"] for _ in range(2))
        )
        transports = None
        if b["comms"]["protocol"] == "ucxx":
            transports = client.run(endpoint_transports, a["address"], workers=[b["address"]])
            transports = transports[b["address"]]
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement(names, None, None, None, _failed(exc))
    rdma = a["gpudirect_rdma"] and b["gpudirect_rdma"]
    route, copies, reason = pair_route(target, *names, same_node, transports, rdma)
    gbps = None if seconds is None else _gbps(nbytes, seconds)
    return _measurement(names, route, copies, gbps, reason, transports)


def _pairs(workers: list[dict]) -> tuple[tuple | None, tuple | None]:
    """Two workers of one host, and the first workers of two hosts, where the cluster has them."""
    hosts: dict[str, list[dict]] = {}
    for w in workers:
        hosts.setdefault(w["host"], []).append(w)
    in_node = next((tuple(ws[:2]) for ws in hosts.values() if len(ws) > 1), None)
    firsts = [ws[0] for ws in hosts.values()]
    return in_node, (tuple(firsts[:2]) if len(firsts) > 1 else None)


def _summary(name: str, measurements: list[dict], why_none: str = "") -> dict:
    """One path of the document: the route the measurements share, their median rate, a verdict."""
    if not measurements:
        route = copies = gbps = None
        reason = why_none
    else:
        shared = {(m["route"], m["copies"], m["reason"]) for m in measurements}
        route, copies, reason = (
            shared.pop() if len(shared) == 1 else ("mixed", None, "workers differ: see each one")
        )
        rates = [m["gbps"] for m in measurements if m["gbps"]]
        gbps = statistics.median(rates) if rates else None
    parts = [p for p in (route, _copies(copies), gbps and f"{gbps:.1f} GB/s") if p]
    verdict = f"{LABELS[name]}: " + ", ".join(parts) + (": " if parts else "") + reason
    return {
        "route": route,
        "copies": copies,
        "gbps": gbps,
        "reason": reason,
        "verdict": verdict,
        "measurements": measurements,
    }


def _copies(n: int | None) -> str | None:
    return None if n is None else f"{n} cop{'y' if n == 1 else 'ies'}"


def peer_access(workers: list[dict]) -> list[dict]:
    """Per host, each GPU of a worker -> each other GPU it sees: can it access it as a peer."""
    found = {}
    for w in workers:
        if w["gpu"] is not None:
            for p in w["peers"]:
                found[w["host"], w["gpu"]["pci_bus_id"], p["pci_bus_id"]] = p["access"]
    return [
        {"host": host, "from": a, "to": b, "access": access}
        for (host, a, b), access in sorted(found.items())
    ]


def probe_cluster(client: Client, quick: bool = False, nbytes: int = 256 << 20) -> dict[str, Any]:
    """The probe's document for ``client``'s cluster (docs/probe.md). ``quick`` skips the
    measurements; each one moves ``nbytes``."""
    from .cluster import ensure_plugins

    ensure_plugins(client)
    facts = client.run(worker_facts)
    if not facts:
        raise click.ClickException("the cluster has no workers")
    workers = [facts[a] for a in sorted(facts)]
    in_node, across = _pairs(workers)
    one = "one worker" if len(workers) == 1 else "one worker per host"
    paths = {
        "storage_to_gpu": _summary(
            "storage_to_gpu", [_storage(client, w, quick, nbytes) for w in workers]
        ),
        "host_to_gpu": _summary(
            "host_to_gpu", [_host_to_gpu(client, w, quick, nbytes) for w in workers]
        ),
        "gpu_to_gpu_in_node": _summary(
            "gpu_to_gpu_in_node",
            [_pair(client, *in_node, True, quick, nbytes)] if in_node else [],
            f"{one}: nothing to measure",
        ),
        "gpu_to_gpu_across_nodes": _summary(
            "gpu_to_gpu_across_nodes",
            [_pair(client, *across, False, quick, nbytes)] if across else [],
            "one host: nothing to measure",
        ),
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "scheduler": client.scheduler.address,
        "quick": quick,
        "bytes": None if quick else nbytes,
        "workers": workers,
        "peer_access": peer_access(workers),
        "paths": paths,
    }


# --- the command ---------------------------------------------------------------------------------


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
    for path in result["paths"].values():  # one line each, however long
        console.print(path["verdict"], markup=False, highlight=False, soft_wrap=True)


def _comms_cell(w: dict) -> str:
    comms = w["comms"]
    if comms["protocol"] != "ucxx":
        return comms["protocol"]
    return (
        f"ucxx {comms['ucxx']}; configured UCX_TLS={comms['ucx_tls']}; "
        f"available: {', '.join(comms['ucx_available'])}"
    )


def _local_cluster(protocol: str, workers: int | None):
    from .bench.common import start_cluster
    from .cuda import gpu_count

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
    "--workers", type=int, help="workers of the --local cluster [default: one per GPU, else 2]"
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (docs/probe.md)")
@click.option("--quick", is_flag=True, help="skip the measurements")
@click.option("--size", default="256MiB", show_default=True, help="bytes each measurement moves")
def probe(
    scheduler_address: str | None,
    local: bool,
    protocol: str,
    workers: int | None,
    as_json: bool,
    quick: bool,
    size: str,
) -> None:
    """Per worker: GPU, kvikio, GDS and comms; per path: route, copies, bandwidth, verdict."""
    from distributed import Client

    source = click.get_current_context().get_parameter_source("scheduler_address")
    if local and source is click.core.ParameterSource.ENVIRONMENT:
        scheduler_address = None  # --local wins over $DASK_SCHEDULER_ADDRESS
    if bool(scheduler_address) == local:
        raise click.UsageError("give either --scheduler-address ADDR or --local")
    if local:
        cluster, client = _local_cluster(protocol, workers)
    else:
        try:
            client = Client(scheduler_address, timeout="30s", set_as_default=False)
        except OSError as exc:
            raise click.ClickException(f"cannot reach the scheduler: {exc}") from exc
        cluster = None
    try:
        with client.as_current():  # the pair transfer waits on futures of the current client
            result = probe_cluster(client, quick=quick, nbytes=parse_bytes(size))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        render(result)
