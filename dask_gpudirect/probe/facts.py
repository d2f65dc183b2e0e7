"""The probe on the workers: what each worker's GPU, storage and comms are (``client.run``).

Everything here runs in a worker process, shipped by reference: a worker's host, GPU, kvikio, GDS
and comms facts, what UCX selected for an endpoint, and the storage and remote read measurements.
It asks CUDA nothing where the worker has no GPU.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import tempfile
from typing import TYPE_CHECKING, Any

from .. import access, remote
from ..ledger import Ledger
from ..targets import REMOTE_ROUTES

if TYPE_CHECKING:
    from distributed import Worker

    from ..shards import Shard
    from ..stamps import Stamp
    from ..targets import Target

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
#: A remote measurement's bytes, seconds and GB/s where nothing was read (``--quick``, a failure).
NOT_READ: dict[str, Any] = {"bytes": 0, "seconds": None, "gbps": None}


def worker_facts(dask_worker: Worker) -> dict[str, Any]:
    """This worker's host, GPU, kvikio, GDS and comms (run by ``client.run``)."""
    from ..plugin import current_plugin

    plugin = current_plugin(dask_worker)
    gpu: dict[str, Any] | None = None
    gpu_reason: str | None = NO_GPU
    peers: list[dict[str, Any]] = []
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
        "remote_route": REMOTE_ROUTES["device" if plugin.gpus else "host"],
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
    facts: dict[str, Any] = {
        "protocol": protocol,
        "ucxx": None,
        "ucx_progress": None,
        "ucx_tls": None,
        "ucx_available": None,
    }
    if protocol == "ucxx":
        import ucxx

        facts["ucxx"] = ucxx.__version__
        # as distributed-ucxx picks it: "blocking" spins the event loop (docs/troubleshooting.md)
        facts["ucx_progress"] = os.environ.get("UCXPY_PROGRESS_MODE", "blocking")
        facts["ucx_tls"] = ucxx.get_config().get("TLS")
        facts["ucx_available"] = sorted(ucxx.get_active_transports())
    return facts


def endpoint_transports(peer: str, dask_worker: Worker) -> dict[str, list[str]] | None:
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


def _probe_target(name: str) -> Target:
    """The plugin's target ``name`` with a ledger of its own, so that the probe's reads stay
    out of the user's ledger (``dg.report``)."""
    from .. import targets
    from ..plugin import current_plugin

    plugin = current_plugin()
    return targets.module(name).TARGET(plugin.options, Ledger(plugin.address, 2))


def _raw_shard(path: str, nbytes: int, target: str, **fields: Any) -> Shard:
    """A shard of the first ``nbytes`` of ``path``, raw bytes that are never decoded."""
    import numpy as np

    from ..formats.binary import BinaryPart
    from ..shards import Shard

    part = BinaryPart(np.dtype(np.uint8), (nbytes,))
    return Shard(path, ((0, nbytes),), part, target=target, **fields)


def _measure_storage(nbytes: int) -> dict[str, Any]:
    """Write ``nbytes`` into this worker's local directory and read them twice with the plugin's
    target; the faster read counts. The file was just written, so this is the page-cache-warm
    rate."""
    from distributed import get_worker

    from ..plugin import current_plugin

    name = "device" if current_plugin().gpus else "host"
    target = _probe_target(name)
    fd, path = tempfile.mkstemp(prefix="probe-", dir=get_worker().local_directory)
    try:
        with os.fdopen(fd, "wb") as f:
            chunk = bytes(min(nbytes, 16 << 20))
            for start in range(0, nbytes, len(chunk)):
                f.write(chunk[: nbytes - start])
        shard = _raw_shard(path, nbytes, name)
        with access.unlimited():  # the probe's own file, wherever this worker's roots are
            for _ in range(2):
                target.read(shard)
    finally:
        target.close()
        os.remove(path)
    best = min(target.ledger.records(), key=lambda r: r["seconds"])
    return {"route": best["path"], "copies": best["copies"], "gbps": _gbps(nbytes, best["seconds"])}


def _measure_remote(url: str, store: remote.Store | None, nbytes: int | None) -> dict[str, Any]:
    """Whether this worker reaches the object ``url``, and how fast it reads its first
    ``nbytes`` (None: only open it, one HEAD request). The read is the host target's, into host
    memory on every worker (ranges of ``gpudirect.remote.range-size``, ``connections`` in
    flight), timed as the ledger times a read: the network and the server, not the device
    copy. A failure is :func:`.remote.error`'s text: the URL, the cause, no credentials."""
    from distributed import get_worker

    from .. import stamps

    worker = get_worker().address
    try:
        with remote.opened(url, store) as obj:
            stamp = stamps.take(obj)
        read = NOT_READ
        if nbytes is not None:
            read = _timed_read(url, store, stamp, min(stamp.size, nbytes))
    except Exception as exc:  # the probe reports what failed and goes on
        return unreached(worker, str(remote.error(url, exc, store or remote.Store())))
    return {"worker": worker, "reachable": True, "error": None, **read}


def unreached(worker: str, error: str) -> dict[str, Any]:
    """The remote measurement of a worker that could not read the object, and why."""
    return {"worker": worker, "reachable": False, "error": error, **NOT_READ}


def _timed_read(url: str, store: remote.Store | None, stamp: Stamp, nbytes: int) -> dict[str, Any]:
    """The first ``nbytes`` of the remote object ``url`` read by the host target: its ledger's
    bytes, seconds and GB/s."""
    target = _probe_target("host")
    try:
        target.read(_raw_shard(url, nbytes, "host", stamp=stamp, store=store))
    finally:
        target.close()
    (record,) = target.ledger.records()
    return {
        "bytes": nbytes,
        "seconds": record["seconds"],
        "gbps": _gbps(nbytes, record["seconds"]),
    }


def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None
