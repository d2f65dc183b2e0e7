"""``dask-gpudirect probe`` on real LocalClusters without a GPU, over tcp and ucxx.

The JSON document must keep the schema that docs/probe.md documents, every GPU field must say
"no GPU" instead of failing, each path must carry a route, copies and a verdict, ``--quick`` must
measure nothing and a full run must measure the storage and the pair.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner
from object_servers import BUCKET
from util import HANG_GUARD, start_cluster, stopped, worker_config

from dask_gpudirect.cli import main
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.ledger_report import records
from dask_gpudirect.probe import LABELS, _gds_reason, pair_route, parse_ep_info, routes

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "probe.md"
NONE = type(None)
TOP = {
    "schema_version": int,
    "scheduler": str,
    "quick": bool,
    "bytes": (int, NONE),
    "workers": list,
    "peer_access": list,
    "paths": dict,
    "remote": list,
}
WORKER = {
    "address": str,
    "host": str,
    "gpus": int,
    "gpu": (dict, NONE),
    "gpu_reason": (str, NONE),
    "peers": list,
    "kvikio": (str, NONE),
    "gds": dict,
    "gpudirect_rdma": bool,
    "comms": dict,
    "storage_route": str,
    "remote_route": str,
}
GDS = {
    "available": bool,
    "nvidia_fs": bool,
    "compat_mode": (str, NONE),
    "compat_mode_preferred": (bool, NONE),
    "libcufile": (str, NONE),
    "driver": (dict, NONE),
    "reason": (str, NONE),
}
COMMS = {
    "protocol": str,
    "ucxx": (str, NONE),
    "ucx_progress": (str, NONE),
    "ucx_tls": (str, NONE),
    "ucx_available": (list, NONE),
}
PATH = {
    "route": (str, NONE),
    "copies": (int, NONE),
    "gbps": (float, NONE),
    "reason": str,
    "verdict": str,
    "measurements": list,
}
MEASUREMENT = {
    "workers": list,
    "route": (str, NONE),
    "copies": (int, NONE),
    "gbps": (float, NONE),
    "reason": str,
    "transports": (dict, NONE),
}
TRANSPORTS = {"lanes": list, "transports": list, "device_transports": list}
REMOTE = {
    "url": str,
    "route": str,
    "copies": (int, NONE),
    "reachable": bool,
    "gbps": (float, NONE),
    "verdict": str,
    "measurements": list,
}
REMOTE_MEASUREMENT = {
    "worker": str,
    "reachable": bool,
    "error": (str, NONE),
    "bytes": int,
    "seconds": (float, NONE),
    "gbps": (float, NONE),
}
#: The host path between two workers without GPUs, by protocol.
HOST_ROUTE = {"tcp": "tcp-host", "ucxx": "ucx-host"}

# UCX's ucp_ep_print_info of a ucxx endpoint on this machine (UCX_TLS=tcp), cut short.
CPU_EP_INFO = """\
#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]: cm tcp
#                 lane[1]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] seg 4294967295 rma_bw#0 am wireup
#                 lane[2]:  0:tcp/eth0.0 md[0]              -> md[0]/tcp/sysdev[255] seg 4294967295 rma_bw#1
#
# +--------------------------------+-----------------------------------------------------+
# | ucp_context_0 intra-node cfg#3 | active message by ucp_am_send* from host memory     |
# +--------------------------------+--------------------------------------------+--------+
# |                              0 | short                                      | tcp/lo |
# |                        1..8191 | zero-copy                                  | tcp/lo |
# +--------------------------------+--------------------------------------------+--------+
"""  # noqa: E501

# The same on two GPUs of one host, with lines as UCX prints them (docs/benchmarks' transports).
GPU_EP_INFO = """\
#                 lane[0]: cm tcp
#                 lane[1]:  2:cuda_copy/cuda.0 md[1]        -> md[1]/cuda_cpy/sysdev[255] am
#                 lane[2]:  8:cuda_ipc/cuda.0 md[5]         -> md[5]/cuda_ipc/sysdev[255] rma_bw#0
#                 lane[3]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am_bw#0
# +--------------------------------+-------------------------------------------------------+
# | ucp_context_0 intra-node cfg#6 | rendezvous data fetch into cuda/GPU0 from cuda        |
# +--------------------------------+----------------------------------------------+--------+
# |                        8K..inf | (?) rendezvous zero-copy read from remote    | cuda_ipc/cuda |
# +--------------------------------+----------------------------------------------+--------+
# | ucp_context_0 intra-node cfg#6 | tagged message by ucp_tag_send* from host memory      |
# +--------------------------------+----------------------------------------------+--------+
# |                         0..626 | eager short                                  | tcp/lo |
"""


def check(obj: dict, spec: dict, where: str) -> None:
    """``obj`` has exactly the keys of ``spec``, each of its type."""
    assert set(obj) == set(spec), (where, sorted(obj), sorted(spec))
    for key, kind in spec.items():
        assert isinstance(obj[key], kind), (where, key, obj[key])
        assert not isinstance(obj[key], bool) or kind in (bool, (bool, NONE)), (where, key)


def check_schema(doc: dict) -> None:
    """The whole document against docs/probe.md's schema."""
    check(doc, TOP, "top")
    assert doc["schema_version"] == 1
    for w in doc["workers"]:
        check(w, WORKER, "worker")
        check(w["gds"], GDS, "gds")
        check(w["comms"], COMMS, "comms")
    assert list(doc["paths"]) == list(LABELS)
    for name, path in doc["paths"].items():
        check(path, PATH, name)
        assert path["verdict"].startswith(f"{LABELS[name]}: "), path["verdict"]
        for m in path["measurements"]:
            check(m, MEASUREMENT, f"{name} measurement")
            if m["transports"] is not None:
                check(m["transports"], TRANSPORTS, f"{name} transports")
    for obj in doc["remote"]:
        check(obj, REMOTE, "remote")
        assert obj["verdict"].startswith(f"{obj['url']}: "), obj["verdict"]
        assert len(obj["measurements"]) == len(doc["workers"])
        for m in obj["measurements"]:
            check(m, REMOTE_MEASUREMENT, "remote measurement")
            assert m["reachable"] == (m["error"] is None), m


def probe(*args: str) -> str:
    result = CliRunner().invoke(main, ["probe", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def probe_json(client, *args: str) -> dict:
    doc = json.loads(probe("--scheduler-address", client.scheduler.address, "--json", *args))
    check_schema(doc)
    return doc


def protocol_of(client) -> str:
    return client.scheduler.address.split("://")[0]


def assert_no_gpu(doc: dict, protocol: str) -> None:
    assert len(doc["workers"]) == 2
    for w in doc["workers"]:
        assert w["gpus"] == 0 and w["gpu"] is None and w["peers"] == []
        assert w["gpu_reason"].startswith("no GPU")
        assert w["gds"]["available"] is False and w["gds"]["reason"] == "no GPU, so no GDS"
        assert w["gds"]["driver"] is None and w["gds"]["compat_mode_preferred"] is None
        assert w["storage_route"] == "posix-host" and w["remote_route"] == "host-remote"
        assert w["comms"]["protocol"] == protocol
    assert doc["peer_access"] == [] and doc["remote"] == []
    paths = doc["paths"]
    assert (paths["storage_to_gpu"]["route"], paths["storage_to_gpu"]["copies"]) == (
        "posix-host",
        1,
    )
    assert paths["storage_to_gpu"]["reason"].startswith("no GPU")
    assert paths["host_to_gpu"]["verdict"] == "host -> GPU: no GPU"
    assert [m["reason"] for m in paths["host_to_gpu"]["measurements"]] == ["no GPU", "no GPU"]
    in_node = paths["gpu_to_gpu_in_node"]
    assert (in_node["route"], in_node["copies"]) == (HOST_ROUTE[protocol], 1)
    assert in_node["reason"].startswith("no GPU: host memory to host memory")
    assert sorted(in_node["measurements"][0]["workers"]) == sorted(
        w["address"] for w in doc["workers"]
    )
    across = paths["gpu_to_gpu_across_nodes"]
    assert across["measurements"] == [] and across["route"] is None
    assert across["verdict"] == "GPU -> GPU across nodes: one host: nothing to measure"


def assert_negotiated(doc: dict, protocol: str) -> None:
    """Over ucxx the pair reports what UCX selected: TCP only, as util.ucx_environment asks."""
    (pair,) = doc["paths"]["gpu_to_gpu_in_node"]["measurements"]
    if protocol == "tcp":
        assert pair["transports"] is None
        for w in doc["workers"]:
            assert w["comms"] == {
                "protocol": "tcp",
                "ucxx": None,
                "ucx_progress": None,
                "ucx_tls": None,
                "ucx_available": None,
            }
        return
    assert pair["transports"]["transports"] == ["tcp"], pair["transports"]
    assert all(lane.startswith("tcp/") for lane in pair["transports"]["lanes"])
    assert pair["transports"]["device_transports"] == []
    assert pair["reason"].endswith("UCX negotiated tcp")
    for w in doc["workers"]:
        assert w["comms"]["ucx_tls"] == "tcp" and w["comms"]["ucx_available"] == ["tcp"]
        assert w["comms"]["ucx_progress"] == "thread"  # the workers the tests start


def test_probe_quick(client):
    protocol = protocol_of(client)
    doc = probe_json(client, "--quick")
    assert doc["quick"] is True and doc["bytes"] is None
    assert_no_gpu(doc, protocol)
    assert_negotiated(doc, protocol)
    for path in doc["paths"].values():
        assert path["gbps"] is None and all(m["gbps"] is None for m in path["measurements"])
        assert " GB/s" not in path["verdict"]


def test_probe_measures(client):
    protocol = protocol_of(client)
    before = len(records(client))
    doc = probe_json(client, "--size", "8MiB")
    assert doc["quick"] is False and doc["bytes"] == 8 << 20
    assert_no_gpu(doc, protocol)
    assert_negotiated(doc, protocol)
    storage = doc["paths"]["storage_to_gpu"]
    assert all(m["gbps"] > 0 for m in storage["measurements"]), storage
    assert storage["gbps"] > 0 and " GB/s: no GPU" in storage["verdict"]
    assert doc["paths"]["host_to_gpu"]["gbps"] is None
    in_node = doc["paths"]["gpu_to_gpu_in_node"]
    assert in_node["gbps"] > 0 and in_node["measurements"][0]["gbps"] == in_node["gbps"]
    assert len(records(client)) == before  # the probe's reads stay out of the user's ledger


def test_probe_measures_storage_on_workers_with_roots(tcp_client, tmp_path):
    """Its own file in the worker's local directory, outside the roots the worker keeps to
    (a usual setup: roots /data, scratch elsewhere): measured, where it failed as refused."""
    with worker_config(tcp_client, {"gpudirect.allowed-roots": [os.fspath(tmp_path)]}):
        doc = probe_json(tcp_client, "--size", "1MiB")
    storage = doc["paths"]["storage_to_gpu"]
    assert all(m["gbps"] > 0 for m in storage["measurements"]), storage
    assert storage["route"] == "posix-host", storage


def test_a_verdict_where_workers_differ_says_each():
    """ "see each one" pointed at nothing in the text output: now a line per measurement."""
    measured = routes._measurement(["tcp://a:1"], "posix-host", 1, 5.0, "no GPU")
    failed = routes._measurement(["tcp://b:2"], None, None, None, "measurement failed: Oops")
    verdict = routes._summary("storage_to_gpu", [measured, failed])["verdict"]
    assert verdict.splitlines() == [
        "storage -> GPU: mixed, 5.0 GB/s: workers differ:",
        "  tcp://a:1: posix-host, 1 copy, 5.0 GB/s: no GPU",
        "  tcp://b:2: measurement failed: Oops",
    ]


def test_a_slow_rate_is_not_shown_as_zero():
    """A measured 0.039 GB/s (a small --size on a slow machine) said "0.0 GB/s"."""
    slow = routes._measurement(["tcp://a:1"], "posix-host", 1, 0.039, "no GPU")
    verdict = routes._summary("storage_to_gpu", [slow])["verdict"]
    assert verdict == "storage -> GPU: posix-host, 1 copy, 0.039 GB/s: no GPU"


def test_probe_human(tcp_client):
    out = probe("--scheduler-address", tcp_client.scheduler.address, "--quick")
    assert f"2 worker(s) at {tcp_client.scheduler.address}" in out
    for w in tcp_client.nthreads():
        assert w in out
    row = next(line for line in out.splitlines() if "tcp://" in line and "│" in line)
    assert row.count("no GPU") >= 4, row  # GPU, UUID, PCI bus, NUMA
    lines = out.splitlines()
    assert "GPU peer access: no GPU pairs" in lines
    assert (
        "storage -> GPU: posix-host, 1 copy: no GPU: reads go to host memory (storage -> host)"
        in lines
    )
    assert "host -> GPU: no GPU" in lines
    assert any(
        line.startswith("GPU -> GPU in a node: tcp-host, 1 copy: no GPU") for line in lines
    ), out
    assert "GPU -> GPU across nodes: one host: nothing to measure" in lines


@pytest.mark.timeout(HANG_GUARD + 60)
def test_probe_local_one_worker():
    """``--local`` starts and stops its own cluster (and wins over $DASK_SCHEDULER_ADDRESS): run
    as a user would, in its own process."""
    env = {**os.environ, "COLUMNS": "160", "DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:1"}
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.cli",
        "probe",
        "--local",
        "--workers",
        "1",
        "--json",
        "--quick",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    check_schema(doc)
    assert len(doc["workers"]) == 1 and doc["workers"][0]["gpu"] is None
    in_node = doc["paths"]["gpu_to_gpu_in_node"]
    assert in_node["measurements"] == []
    assert in_node["verdict"] == "GPU -> GPU in a node: one worker: nothing to measure"


def invoke(*args: str):
    return CliRunner().invoke(main, ["probe", *args])


@pytest.mark.timeout(HANG_GUARD)
def test_probe_names_a_stopped_worker(client, monkeypatch):
    """A worker stopped (SIGSTOP: alive to the scheduler, answering nothing) held the probe for
    as long as it stayed stopped, and past the scheduler's worker-ttl it ended in a
    CommClosedError traceback: now an error naming it after MEASURE_TIMEOUT, exit status 1."""
    ensure_plugins(client)  # the package imported on the workers: no first import in the wait
    monkeypatch.setattr(routes, "MEASURE_TIMEOUT", 5)
    silent = sorted(client.nthreads())[0]
    with ThreadPoolExecutor(1) as pool, stopped(client, silent):  # goes on before the join
        running = pool.submit(invoke, "--scheduler-address", client.scheduler.address, "--quick")
        result = running.result(timeout=120)
    assert result.exit_code == 1, result.output
    assert "did not answer in 5 s when the probe asked" in result.output, result.output
    assert silent in result.output
    assert "Traceback" not in result.output


def set_status(status: str, dask_worker) -> None:
    """Pause a worker, as its memory monitor does under memory pressure (it then runs no task),
    or let it go on."""
    from distributed.core import Status

    dask_worker.status = Status[status]


@pytest.mark.timeout(HANG_GUARD)
@pytest.mark.parametrize("paused, said", [(0, "made no buffer"), (1, "did not fetch the buffer")])
def test_probe_goes_on_past_a_paused_worker(paused, said, monkeypatch):
    """A paused worker runs no task, and the pair's transfer waited on its task for ever: now
    the pair's measurement fails after MEASURE_TIMEOUT, naming the worker, and the probe ends.
    (No memory limit: the memory monitor would resume the worker at once.)"""
    from distributed import Client

    monkeypatch.setattr(routes, "MEASURE_TIMEOUT", 3)
    with (
        start_cluster("tcp", threads=1, memory_limit=0) as lc,
        Client(lc, set_as_default=False) as c,
        ThreadPoolExecutor(1) as pool,
    ):
        pair = sorted(c.nthreads())
        ensure_plugins(c)  # the package imported on the workers: no first import in the wait
        c.run(set_status, "paused", workers=[pair[paused]])
        try:
            running = pool.submit(probe, "--scheduler-address", lc.scheduler_address, "--json",
                                  "--quick")  # fmt: skip
            doc = json.loads(running.result(timeout=120))
        finally:  # the join needs the worker going on where the probe still waits on it
            c.run(set_status, "running", workers=[pair[paused]])
    check_schema(doc)
    (m,) = doc["paths"]["gpu_to_gpu_in_node"]["measurements"]
    assert m["workers"] == pair and m["route"] is None, m
    assert m["reason"] == f"measurement failed: TimeoutError: {pair[paused]} {said} within 3 s"


@pytest.mark.parametrize("args", [[], ["--local", "--scheduler-address", "tcp://127.0.0.1:1"]])
def test_probe_needs_one_cluster(args):
    result = CliRunner(env={"DASK_SCHEDULER_ADDRESS": None}).invoke(main, ["probe", *args])
    assert result.exit_code == 2
    assert "give either --scheduler-address ADDR or --local" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--local", "--size", "10 XB"], "'10 XB': use a positive size"),
        (["--local", "--size", "0"], "'0': use a positive size"),
        (["--local", "--workers", "0"], "0 is not in the range x>=1"),
        (["--scheduler-address", "notanaddress"], "missing port number in address"),
        (["--scheduler-address", "foo://h:1"], "unknown address scheme 'foo'"),
    ],
)
def test_probe_refuses_bad_options_before_anything_starts(args, message):
    """A usage error, at once: not a traceback after a cluster started, nor a client's start
    on an address it cannot parse (which then hung a minute in its ``__del__``)."""
    result = CliRunner(env={"DASK_SCHEDULER_ADDRESS": None}).invoke(main, ["probe", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_doc_example_follows_the_schema():
    """docs/probe.md's example parses and has every key and type; its tables name every key."""
    text = DOC.read_text()
    (example,) = re.findall(r"```json\n(.*?)```", text, re.S)
    doc = json.loads(example)
    check_schema(doc)
    documented = set(re.findall(r"^\| `(\w+)`", text, re.M))
    for spec in (TOP, WORKER, GDS, COMMS, PATH, MEASUREMENT, TRANSPORTS, REMOTE,
                 REMOTE_MEASUREMENT):  # fmt: skip
        assert set(spec) <= documented, set(spec) - documented


def test_parse_ep_info():
    cpu = parse_ep_info(CPU_EP_INFO)
    assert cpu == {
        "lanes": ["tcp/lo.0", "tcp/eth0.0"],
        "transports": ["tcp"],
        "device_transports": [],
    }
    gpu = parse_ep_info(GPU_EP_INFO)
    assert gpu["lanes"] == ["cuda_copy/cuda.0", "cuda_ipc/cuda.0", "tcp/lo.0"]
    assert gpu["transports"] == ["cuda_copy", "cuda_ipc", "tcp"]
    assert gpu["device_transports"] == ["cuda_ipc"]  # the host-memory table is not counted


A, B = "ucxx://10.0.0.1:1", "ucxx://10.0.0.2:1"
TA, TB = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"
IPC = {
    "lanes": [],
    "transports": ["cuda_copy", "cuda_ipc", "tcp"],
    "device_transports": ["cuda_ipc"],
}
STAGED = {"lanes": [], "transports": ["cuda_copy", "tcp"], "device_transports": ["cuda_copy"]}
RC = {"lanes": [], "transports": ["cuda_copy", "rc_mlx5"], "device_transports": ["rc_mlx5"]}


@pytest.mark.parametrize(
    "target, source, dest, same_node, transports, rdma, route, copies",
    [
        ("device", TA, TA.replace(":1", ":2"), True, None, False, "tcp-host-staged", 2),
        ("device", TA, TB, False, None, True, "tcp-host-staged", 5),
        ("device", A, A, True, IPC, False, "ucx-device", 1),
        ("device", A, A, True, STAGED, False, "ucx-host-staged", 2),
        ("device", A, B, False, RC, True, "ucx-device", 1),
        ("device", A, B, False, RC, False, "ucx-host-staged", 5),
        ("device", A, B, False, STAGED, True, "ucx-host-staged", 5),
        ("device", A, A, True, None, False, "ucx", None),
        ("host", A, B, False, STAGED, False, "ucx-host", 1),
        ("host", TA, TB, False, None, False, "tcp-host", 1),
    ],
)
def test_pair_route(target, source, dest, same_node, transports, rdma, route, copies):
    """The copies NVIDIA's write-ups count: 2 in a node without P2P, 5 across without RDMA."""
    got = pair_route(target, source, dest, same_node, transports, rdma)
    assert got[:2] == (route, copies), got


GDS_FACTS = {"compat_mode": "AUTO", "nvidia_fs": True, "driver": {"is_gds_available": True}}


@pytest.mark.parametrize(
    "change, gpus, reason",
    [
        ({}, 0, "no GPU, so no GDS"),
        ({"compat_mode": "ON"}, 1, "kvikio compat mode is ON"),
        ({"nvidia_fs": False, "driver": None}, 1, "nvidia-fs is not loaded, so GDS is off"),
        ({"driver": {"is_gds_available": False}}, 1, "the cuFile driver reports GDS unavailable"),
        ({"compat_mode_preferred": True}, 1, "kvikio prefers its compat mode"),
        ({}, 1, "GDS is on: nvidia-fs is loaded and compat mode is AUTO"),
    ],
)
def test_gds_reason(change, gpus, reason):
    """Why GDS is off, as the GPU workers will say it (no GPU here to ask)."""
    facts = {**GDS_FACTS, "compat_mode_preferred": False, **change}
    assert _gds_reason(facts, gpus).startswith(reason)


# --- --remote: whether the workers reach an object store, and how fast ---------------------------


def probe_remote(client, options: dict | None, *args: str) -> tuple[dict, str]:
    """The probe's document with ``--remote`` objects, and its text (for secrets to be absent)."""
    given = [] if options is None else ["--storage-options", json.dumps(options)]
    out = probe("--scheduler-address", client.scheduler.address, "--json", *given, *args)
    doc = json.loads(out)
    check_schema(doc)
    return doc, out


def test_probe_remote_reads_s3_and_http(tcp_client, s3, http_url):
    """Every worker reaches both objects and reads min(size, --size) of each into host memory,
    on the route dg.read_* takes on these workers; the keys are nowhere in the output and the
    reads stay out of the user's ledger."""
    urls = [f"s3://{BUCKET}/raw.bin", f"{http_url[0]}/raw.bin"]  # 4000 bytes each
    before = len(records(tcp_client))
    doc, out = probe_remote(tcp_client, s3.options, "--size", "1KiB", "--remote", urls[0],
                            "--remote", urls[1])  # fmt: skip
    assert [obj["url"] for obj in doc["remote"]] == urls
    for obj in doc["remote"]:
        assert obj["reachable"] is True and (obj["route"], obj["copies"]) == ("host-remote", 1)
        assert {m["worker"] for m in obj["measurements"]} == set(tcp_client.nthreads())
        for m in obj["measurements"]:
            assert m["reachable"] is True and m["error"] is None
            assert m["bytes"] == 1024 and isinstance(m["seconds"], float)
        assert "every worker reads it (2); measured into host memory" in obj["verdict"]
    assert s3.secret not in out and s3.key not in out
    assert len(records(tcp_client)) == before


def test_probe_remote_quick_only_opens(tcp_client, http_url):
    """With --quick each worker only opens the object (one HEAD request): reached, nothing read."""
    url = f"{http_url[0]}/raw.bin"
    doc, _ = probe_remote(tcp_client, None, "--quick", "--remote", url)
    (obj,) = doc["remote"]
    assert obj["reachable"] is True and obj["gbps"] is None
    assert all((m["bytes"], m["seconds"]) == (0, None) for m in obj["measurements"])
    assert obj["verdict"] == f"{url}: host-remote, 1 copy: every worker reads it (2)"


def test_probe_remote_missing_objects(tcp_client, s3, http_url):
    """A missing key and an HTTP 404: unreachable from every worker, the URL and cause named."""
    missing = {f"s3://{BUCKET}/no/such.bin": "no such key in the bucket",
               f"{http_url[0]}/no/such.bin": "not found (HTTP 404)"}  # fmt: skip
    args = [arg for url in missing for arg in ("--remote", url)]
    doc, out = probe_remote(tcp_client, s3.options, "--quick", *args)
    for obj, (url, cause) in zip(doc["remote"], missing.items(), strict=True):
        assert obj["url"] == url and obj["reachable"] is False
        assert obj["verdict"].endswith(f"2 of 2 worker(s) cannot read it: {cause}"), obj
        assert all(m["error"] == f"{url}: {cause}" for m in obj["measurements"])
    assert s3.secret not in out


@pytest.mark.parametrize(
    "change, cause",
    [
        ({"endpoint_url": "http://127.0.0.1:9"}, "cannot reach the endpoint http://127.0.0.1:9"),
        ({"secret": "not-the-secret-probe"}, "access denied"),
    ],
)
def test_probe_remote_wrong_endpoint_or_keys(tcp_client, s3, change, cause):
    """A wrong endpoint (nothing listens) and a wrong secret: unreachable, the cause named, the
    secrets given (right or wrong) nowhere in the JSON."""
    url = f"s3://{BUCKET}/raw.bin"
    options = {**s3.options, **change}
    doc, out = probe_remote(tcp_client, options, "--quick", "--remote", url)
    (obj,) = doc["remote"]
    assert obj["reachable"] is False
    for m in obj["measurements"]:
        assert m["reachable"] is False and m["error"].startswith(f"{url}: {cause}"), m
    assert options["secret"] not in out and s3.secret not in out


def test_probe_remote_human(tcp_client, s3):
    """The human form: a table row per object and worker, a verdict per object, no secret."""
    ok, missing = f"s3://{BUCKET}/raw.bin", f"s3://{BUCKET}/no/such.bin"
    out = probe("--scheduler-address", tcp_client.scheduler.address, "--quick", "--remote", ok,
                "--remote", missing, "--storage-options", json.dumps(s3.options))  # fmt: skip
    assert "remote objects (read into host memory on every worker" in out
    lines = out.splitlines()
    assert f"{ok}: host-remote, 1 copy: every worker reads it (2)" in lines
    assert (
        f"{missing}: host-remote, 1 copy: 2 of 2 worker(s) cannot read it: no such key in the "
        "bucket" in lines
    )
    rows = [line for line in lines if "│" in line and "s3://" in line]
    assert len(rows) >= 4 and sum("no: " in row for row in rows) >= 2, rows
    assert s3.secret not in out and s3.key not in out


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--remote", "/data/x.bin"], 2, "/data/x.bin: not an s3:// or http(s):// URL"),
        (["--remote", "https://me:hunter2@h/x"], 1, "credentials in a URL"),
        (["--remote", "s3://b/k", "--storage-options", "{hunter2"], 2, "not JSON"),
        (["--remote", "s3://b/k", "--storage-options", "[]"], 2, "not a JSON object"),
        (["--remote", "s3://b/k", "--storage-options", '{"bogus": "hunter2"}'], 1, "bogus"),
        (["--storage-options", "{}"], 2, "--storage-options needs --remote URL"),
    ],
)
def test_probe_remote_bad_arguments(args, code, message):
    """Refused before any worker is asked, the fault named and never a secret's value."""
    result = CliRunner().invoke(main, ["probe", "--scheduler-address", "tcp://127.0.0.1:1", *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "hunter2" not in result.output
