"""``dask-gpudirect probe --local`` on a GPU machine: its verdicts must match what the machine is.

../shared/gpu/FACTS.md records the lent H200s: no nvidia-fs, so kvikio reads in compat mode (2
copies); with two GPUs (NV18) the workers have peer access and UCX moves device buffers between
them over cuda_ipc (1 copy); over tcp they are staged through host memory (2 copies). The checks
follow the machine's own state (``/proc/driver/nvidia-fs``, the GPU count) rather than assume it.

Run as a subprocess, as a user would: the command starts its own ``dg.LocalCUDACluster`` (one
worker per GPU), so nothing here touches CUDA.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from object_servers import BUCKET

pytestmark = pytest.mark.gpu

PCI_BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def run_probe(*args: str) -> str:
    cmd = [sys.executable, "-m", "dask_gpudirect.cli", "probe", "--local", *args]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc.stdout


@pytest.mark.timeout(240)
def test_probe_ucxx_matches_the_machine():
    pytest.importorskip("distributed_ucxx")
    from dask_gpudirect.cuda import gpu_count

    gpus = gpu_count()
    nvidia_fs = os.path.exists("/proc/driver/nvidia-fs")
    doc = json.loads(run_probe("--protocol", "ucxx", "--json", "--size", "64MiB"))
    workers = doc["workers"]
    assert len(workers) == gpus
    for w in workers:
        gpu = w["gpu"]
        assert w["gpus"] >= 1 and w["gpu_reason"] is None and gpu is not None, w
        assert gpu["name"] and gpu["uuid"].startswith("GPU-"), gpu
        assert PCI_BUS_ID.fullmatch(gpu["pci_bus_id"]), gpu
        assert gpu["memory_bytes"] > 1 << 30
        assert w["kvikio"] is not None and w["comms"]["protocol"] == "ucxx"
        assert w["gds"]["nvidia_fs"] is nvidia_fs
        assert w["gds"]["compat_mode"] == "AUTO" and w["gds"]["compat_mode_preferred"] is not None
    assert len({w["gpu"]["uuid"] for w in workers}) == gpus  # one worker per GPU

    storage = doc["paths"]["storage_to_gpu"]
    if not nvidia_fs:  # FACTS.md: GDS off, kvikio compat mode
        assert (storage["route"], storage["copies"]) == ("kvikio-compat", 2), storage
        assert storage["reason"] == "nvidia-fs is not loaded, so GDS is off"
        assert storage["verdict"].startswith("storage -> GPU: kvikio-compat, 2 copies, ")
        assert not any(w["gds"]["available"] for w in workers)
    assert storage["gbps"] > 0.1, storage

    h2d = doc["paths"]["host_to_gpu"]
    assert (h2d["route"], h2d["copies"]) == ("pinned-copy", 1) and h2d["gbps"] > 1, h2d

    in_node = doc["paths"]["gpu_to_gpu_in_node"]
    if gpus == 1:
        assert in_node["verdict"] == "GPU -> GPU in a node: one worker: nothing to measure"
        assert doc["peer_access"] == []
        return
    # FACTS.md (nvidia-h200-x2): NVLink between the GPUs, UCX picks cuda_ipc
    assert (in_node["route"], in_node["copies"]) == ("ucx-device", 1), in_node
    (pair,) = in_node["measurements"]
    transports = pair["transports"]
    assert "cuda_ipc" in transports["transports"] + transports["device_transports"], transports
    assert in_node["gbps"] > 1, in_node
    assert all("cuda_ipc" in w["comms"]["ucx_available"] for w in workers)
    assert all(w["comms"]["ucx_progress"] == "thread" for w in workers)  # the probe's cluster
    peers = doc["peer_access"]
    assert len(peers) == gpus * (gpus - 1) and all(p["access"] for p in peers), peers


@pytest.mark.timeout(240)
def test_probe_tcp_quick_says_staged():
    from dask_gpudirect.cuda import gpu_count

    gpus = gpu_count()
    lines = run_probe("--protocol", "tcp", "--quick").splitlines()
    assert not any(" GB/s" in line for line in lines)
    assert any(line.startswith("storage -> GPU: ") for line in lines)
    assert any(line.startswith("host -> GPU: pinned-copy, 1 copy: ") for line in lines)
    if gpus == 1:
        assert "GPU -> GPU in a node: one worker: nothing to measure" in lines
    else:
        assert (
            "GPU -> GPU in a node: tcp-host-staged, 2 copies: tcp comms: device buffers are "
            "staged through host memory" in lines
        ), lines
    assert "GPU -> GPU across nodes: one host: nothing to measure" in lines


@pytest.mark.timeout(240)
def test_probe_remote_on_gpu_workers(s3, http_url):
    """``--remote`` from GPU workers: every one reaches the S3 and the HTTP object and reads it
    on the route dg.read_* takes there (kvikio-remote, 2 copies); the keys are not printed."""
    urls = [f"s3://{BUCKET}/raw.bin", f"{http_url[0]}/raw.bin"]
    out = run_probe("--protocol", "tcp", "--json", "--size", "1KiB", "--storage-options",
                    json.dumps(s3.options), "--remote", urls[0], "--remote", urls[1])  # fmt: skip
    doc = json.loads(out)
    assert [obj["url"] for obj in doc["remote"]] == urls
    for obj in doc["remote"]:
        assert obj["reachable"] is True, obj
        assert (obj["route"], obj["copies"]) == ("kvikio-remote", 2), obj
        assert all(m["bytes"] == 1024 for m in obj["measurements"]), obj
    assert s3.secret not in out and s3.key not in out
