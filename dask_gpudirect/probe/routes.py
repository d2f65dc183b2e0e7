"""The probe on the client: the workers' facts and short measurements made into one document.

For each path (storage -> GPU, host -> GPU, GPU -> GPU in a node and across nodes) the route in
use, its copies, its bandwidth and a verdict, and for each ``--remote`` object whether every
worker reaches it and how fast; the document's schema is docs/probe.md's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ClusterError
from ..ledger import COPIES
from .facts import (
    _gbps,
    _measure_remote,
    _measure_storage,
    endpoint_transports,
    unreached,
    worker_facts,
)

if TYPE_CHECKING:
    from distributed import Client

    from ..remote import Store
    from ..targets import TargetName

T = TypeVar("T")

#: Bumped when a key of the JSON document changes meaning or goes away (docs/probe.md).
SCHEMA_VERSION = 1
NO_GPU_STORAGE = "no GPU: reads go to host memory (storage -> host)"
#: Bytes a transfer sends to open a pair's endpoint (and warm it up before a measurement).
OPENING_TRANSFER = 1 << 20
#: Longest wait for one measurement task before the probe gives up on it and goes on, and for
#: each worker's facts before the probe names the workers that gave none (stopped, hung).
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


def _measurement(
    workers: list[str],
    route: str | None,
    copies: int | None,
    gbps: float | None,
    reason: str,
    transports: dict[str, list[str]] | None = None,
) -> dict:
    return {
        "workers": workers,
        "route": route,
        "copies": copies,
        "gbps": gbps,
        "reason": reason,
        "transports": transports,
    }


def _run_on(client: Client, worker: str, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` as a task on ``worker``, not run longer than :data:`MEASURE_TIMEOUT`."""
    future = client.submit(func, *args, workers=[worker], allow_other_workers=False, pure=False)
    return future.result(timeout=MEASURE_TIMEOUT)


def _failed(exc: Exception) -> str:
    return f"measurement failed: {type(exc).__name__}: {exc}"


def _storage(client: Client, w: dict, quick: bool, nbytes: int) -> dict:
    route = w["storage_route"]
    reason = w["gds"]["reason"] if w["gpus"] else NO_GPU_STORAGE
    if quick:
        return _measurement([w["address"]], route, COPIES[route], None, reason)
    try:
        got = _run_on(client, w["address"], _measure_storage, nbytes)
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement([w["address"]], route, COPIES[route], None, _failed(exc))
    return _measurement([w["address"]], got["route"], got["copies"], got["gbps"], reason)


def _host_to_gpu(client: Client, w: dict, quick: bool, nbytes: int) -> dict:
    if not w["gpus"]:
        return _measurement([w["address"]], None, None, None, "no GPU")
    reason = "cudaMemcpy from pinned host memory: one DMA copy"
    if quick:
        return _measurement([w["address"]], "pinned-copy", 1, None, reason)
    from ..measure import pinned_gbps

    try:
        gbps = _run_on(client, w["address"], pinned_gbps, nbytes, 3)
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement([w["address"]], "pinned-copy", 1, None, _failed(exc))
    return _measurement([w["address"]], "pinned-copy", 1, gbps, reason)


def pair_route(
    target: TargetName,
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
    from ..ledger import STAGED_ACROSS_NODES
    from ..shuffle.worker import transfer_path

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


def _pair(client: Client, a: dict, b: dict, same_node: bool, quick: bool, nbytes: int) -> dict:
    """A buffer made on ``a`` and fetched by a task on ``b``, timed by ``b``'s own log of the
    fetch. A small transfer goes first (and alone with ``quick``): it opens the endpoint."""
    from ..measure import pair_transfer

    target: TargetName = "device" if a["gpus"] and b["gpus"] else "host"
    source, dest = names = [a["address"], b["address"]]
    try:
        pair_transfer(client, source, dest, OPENING_TRANSFER, target, MEASURE_TIMEOUT)()
        transfer = pair_transfer(client, source, dest, nbytes, target, MEASURE_TIMEOUT)
        seconds = None if quick else min(transfer()["seconds"] for _ in range(2))
        transports = None
        if b["comms"]["protocol"] == "ucxx":
            transports = client.run(endpoint_transports, a["address"], workers=[b["address"]])
            transports = transports[b["address"]]
    except Exception as exc:  # one failed measurement must not stop the probe
        return _measurement(names, None, None, None, _failed(exc))
    rdma = a["gpudirect_rdma"] and b["gpudirect_rdma"]
    route, copies, reason = pair_route(target, source, dest, same_node, transports, rdma)
    gbps = None if seconds is None else _gbps(nbytes, seconds)
    return _measurement(names, route, copies, gbps, reason, transports)


def _pairs(workers: list[dict]) -> tuple[tuple[dict, dict] | None, tuple[dict, dict] | None]:
    """Two workers of one host, and the first workers of two hosts, where the cluster has them."""
    hosts: dict[str, list[dict]] = {}
    for w in workers:
        hosts.setdefault(w["host"], []).append(w)
    in_node = next(((ws[0], ws[1]) for ws in hosts.values() if len(ws) > 1), None)
    firsts = [ws[0] for ws in hosts.values()]
    return in_node, ((firsts[0], firsts[1]) if len(firsts) > 1 else None)


def _said(route: str | None, copies: int | None, gbps: float | None, reason: str) -> str:
    """A route, its copies and rate, and why, as a verdict says them."""
    rate = gbps and (f"{gbps:.1f} GB/s" if gbps >= 0.1 else f"{gbps:.2g} GB/s")  # not 0.0
    parts = [p for p in (route, _copies(copies), rate) if p]
    return ", ".join(parts) + (": " if parts else "") + reason


def _summary(name: str, measurements: list[dict], why_none: str = "") -> dict:
    """One path of the document: the route the measurements share, their median rate, a verdict."""
    each = ""
    if not measurements:
        route = copies = gbps = None
        reason = why_none
    else:
        shared = {(m["route"], m["copies"], m["reason"]) for m in measurements}
        route, copies, reason = (
            shared.pop() if len(shared) == 1 else ("mixed", None, "workers differ:")
        )
        rates = [m["gbps"] for m in measurements if m["gbps"]]
        gbps = statistics.median(rates) if rates else None
        if route == "mixed":  # a line for each, under the verdict
            each = "".join(
                f"\n  {', '.join(m['workers'])}: "
                + _said(m["route"], m["copies"], m["gbps"], m["reason"])
                for m in measurements
            )
    verdict = f"{LABELS[name]}: " + _said(route, copies, gbps, reason) + each
    return {
        "route": route,
        "copies": copies,
        "gbps": gbps,
        "reason": reason,
        "verdict": verdict,
        "measurements": measurements,
    }


def _remote(
    client: Client, url: str, store: Store | None, workers: list[dict], nbytes: int | None
) -> dict:
    """One ``--remote`` object, each worker in turn (as the storage path, so that the workers do
    not share the link): reachable by all, the route their reads take, the median GB/s."""
    measurements = [_remote_on(client, w["address"], url, store, nbytes) for w in workers]
    routes = {w["remote_route"] for w in workers}
    route = routes.pop() if len(routes) == 1 else "mixed"
    copies = COPIES.get(route)
    failed = [m for m in measurements if not m["reachable"]]
    rates = [m["gbps"] for m in measurements if m["gbps"]]
    gbps = statistics.median(rates) if rates else None
    if failed:
        cause = failed[0]["error"].removeprefix(f"{url}: ")
        reason = f"{len(failed)} of {len(measurements)} worker(s) cannot read it: {cause}"
    else:
        reason = f"every worker reads it ({len(measurements)})"
        if gbps:
            reason += "; measured into host memory: the network and the server, not the device copy"
    parts = [p for p in (route, _copies(copies), gbps and f"{gbps:.3g} GB/s") if p]
    return {
        "url": url,
        "route": route,
        "copies": copies,
        "reachable": not failed,
        "gbps": gbps,
        "verdict": f"{url}: " + ", ".join(parts) + f": {reason}",
        "measurements": measurements,
    }


def _remote_on(
    client: Client, worker: str, url: str, store: Store | None, nbytes: int | None
) -> dict[str, Any]:
    """:func:`._measure_remote` on ``worker``; a task that fails or times out is unreachable."""
    try:
        return _run_on(client, worker, _measure_remote, url, store, nbytes)
    except Exception as exc:  # one failed measurement must not stop the probe
        text = _failed(exc)
        return unreached(worker, store.scrub(text) if store else text)


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


def _ask_each(client: Client, function: Callable[..., T], what: str) -> dict[str, T]:
    """``client.run(function)`` on every worker apart, each given :data:`MEASURE_TIMEOUT`
    seconds: a ClusterError names the workers that gave no answer (one ``client.run`` of them
    all waited for as long as a stopped one stayed stopped); those that left while asked are
    left out."""
    from ..cluster import answered, run_each_within

    workers = list(client.nthreads())
    answers, late = client.sync(run_each_within, client, function, workers, MEASURE_TIMEOUT)
    if late:
        raise ClusterError(
            f"worker(s) {', '.join(sorted(late))} did not answer in {MEASURE_TIMEOUT:g} s when "
            f"the probe asked {what}: stopped or overloaded; probe again once they answer"
        )
    return answered(answers)[0]


def probe_cluster(
    client: Client,
    quick: bool = False,
    nbytes: int = 256 << 20,
    remotes: Sequence[str] = (),
    store: Store | None = None,
) -> dict[str, Any]:
    """The probe's document for ``client``'s cluster (docs/probe.md). ``quick`` skips the
    measurements (a remote object is only opened); each one moves ``nbytes``. ``remotes`` are
    objects every worker reads, reached through ``store`` (None: each worker's environment)."""
    from ..cluster import ensure_plugins, has_plugin

    plugged = _ask_each(client, has_plugin, "whether it has GPUDirectPlugin")
    try:
        lacking = [w for w, ok in plugged.items() if not ok]
        ensure_plugins(client, lacking, timeout=MEASURE_TIMEOUT)
    except TimeoutError:
        raise ClusterError(
            f"a worker did not set up the package's plugins in {MEASURE_TIMEOUT:g} s: stopped or "
            "overloaded; probe again once it answers"
        ) from None
    facts = _ask_each(client, worker_facts, "for its facts")
    if not facts:
        raise ClusterError("the cluster has no workers")
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
            [_pair(client, in_node[0], in_node[1], True, quick, nbytes)] if in_node else [],
            f"{one}: nothing to measure",
        ),
        "gpu_to_gpu_across_nodes": _summary(
            "gpu_to_gpu_across_nodes",
            [_pair(client, across[0], across[1], False, quick, nbytes)] if across else [],
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
        "remote": [
            _remote(client, url, store, workers, None if quick else nbytes) for url in remotes
        ],
    }
