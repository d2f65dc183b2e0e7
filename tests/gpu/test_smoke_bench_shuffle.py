"""``dask-gpudirect bench shuffle`` end to end on the device target over UCXX, with tiny sizes.

Run as a subprocess (``python -m dask_gpudirect.bench shuffle``), as a user would: the command
starts its own ``LocalCUDACluster`` (one worker per GPU), so nothing here touches CUDA. On one GPU
the raw transfer needs two workers and is recorded as not run; on two or more it must run, and
dg.shuffle's bytes must cross on the ``ucx-device`` path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(300)
def test_bench_shuffle_smoke(tmp_path):
    pytest.importorskip("distributed_ucxx")
    from dask_gpudirect.cuda import gpu_count

    gpus = gpu_count()
    out_json, out_md = tmp_path / "shuffle.json", tmp_path / "shuffle.md"
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "shuffle",
        "--target",
        "device",
        "--gib",
        "0.0625",
        "--protocol",
        "ucxx",
        "--repeat",
        "1",
        "--raw-mib",
        "64",
        "--method-timeout",
        "60",
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=280, env={**os.environ, "COLUMNS": "160"}
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert "dg.shuffle(df, 'key')" in proc.stdout

    result = json.loads(out_json.read_text())
    assert result["target"] == "device" and result["device"] and result["gpus"] == gpus
    assert result["cluster"]["workers"] == gpus and result["cluster"]["protocol"] == "ucxx"
    assert result["versions"]["cudf-cu13"] != "not installed"
    assert result["data"]["kind"] == "cuDF" and result["data"]["bytes"] >= 0.0625 * (1 << 30)
    records = {r["key"]: r for r in result["records"]}
    for key in ("gpudirect", "tasks", "p2p"):
        assert records[key]["status"] == "ok" and records[key]["gbps_per_gpu"] > 0, records[key]
    checks = {c["check"]: c for c in result["checks"]}
    # the targets are for GPUs that exchange: with one worker the ratios come without them
    exchange = gpus >= 2
    assert checks["faster of Dask's shuffles"]["target"] == (3.0 if exchange else None)
    assert checks["faster of Dask's shuffles"]["ratio"] > 0
    assert checks["raw single-buffer transfer"]["target"] == (0.5 if exchange else None)
    paths = {r["path"] for r in result["ledger"] if r["op"] == "shuffle"}
    if exchange:
        assert checks["faster of Dask's shuffles"]["result"] in ("pass", "miss")
        assert records["raw"]["status"] == "ok" and records["raw"]["gbps"] > 0, records["raw"]
        assert checks["raw single-buffer transfer"]["result"] in ("pass", "miss")
        assert "ucx-device" in paths, result["ledger"]
    else:
        assert records["raw"]["status"] == "not run", records["raw"]
        assert {c["result"] for c in checks.values()} == {"-"}  # no target, no verdict
    assert "| dg.shuffle(df, 'key') |" in out_md.read_text()
