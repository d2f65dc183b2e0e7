"""``dask-gpudirect bench read`` end to end on the device target, with tiny sizes.

Run as a subprocess (``python -m dask_gpudirect.bench read``), as a user would: the command
starts its own cluster and baseline processes, so nothing here touches CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(420)
def test_bench_read_smoke(tmp_path):
    out_json, out_md = tmp_path / "read.json", tmp_path / "read.md"
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "read",
        "--target",
        "device",
        "--binary-gib",
        "0.02",
        "--parquet-gib",
        "0.02",
        "--files",
        "2",
        "--repeat",
        "1",
        "--no-drop-cache",
        "--dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=400, env={**os.environ, "COLUMNS": "160"}
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert "dg.read_parquet" in proc.stdout

    result = json.loads(out_json.read_text())
    assert result["target"] == "device" and result["device"]
    assert result["command"].split().count("read") == 1
    assert result["versions"]["kvikio-cu13"] != "not installed"
    records = {(r["key"], r["cache"]): r for r in result["records"]}
    for key in ("naive", "cudf-default", "cudf-tuned", "dask-default", "dg-binary", "dg-parquet"):
        rec = records[(key, "warm")]
        assert rec["status"] == "ok" and rec["gbps"] > 0, rec
    assert records[("h2d-pinned", "-")]["gbps"] > 1, records[("h2d-pinned", "-")]
    # each baseline process measured cuDF with the kvikio thread pool it was meant to have
    assert records[("cudf-tuned", "warm")]["kvikio"]["num_threads"] == 16
    assert records[("cudf-default", "warm")]["kvikio"]["num_threads"] != 16
    for check in result["checks"]:  # targets judged warm; cold ones not run (--no-drop-cache)
        if check["target"] is None:
            assert check["result"] == "-", check
        elif check["cache"] == "warm":
            assert check["result"] in ("pass", "miss"), check
        else:
            assert check["result"] == "not run", check
    assert "| dg.read_binary(dir).persist() | warm |" in out_md.read_text()


@pytest.mark.timeout(420)
def test_bench_read_every_gpu_smoke(tmp_path):
    """One worker per GPU over ucxx: the ceiling is the sum of the GPUs' own, placement even."""
    pytest.importorskip("distributed_ucxx")
    from dask_gpudirect.cuda import gpu_count

    gpus = gpu_count()
    out_json = tmp_path / "read.json"
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "read",
        "--target",
        "device",
        "--workers",
        str(gpus),
        "--protocol",
        "ucxx",
        "--binary-gib",
        "0.02",
        "--parquet-gib",
        "0.02",
        "--files",
        str(max(2, 2 * gpus)),
        "--repeat",
        "1",
        "--no-drop-cache",
        "--no-baselines",
        "--dir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=400, env={**os.environ, "COLUMNS": "160"}
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    result = json.loads(out_json.read_text())
    records = {(r["key"], r["cache"]): r for r in result["records"]}
    ceiling = records[("h2d-pinned", "-")]
    assert ceiling["status"] == "ok" and ceiling["gbps"] > 1, ceiling
    for key in ("dg-binary", "dg-parquet"):
        assert records[(key, "warm")]["status"] == "ok", records[(key, "warm")]
    if gpus > 1:
        assert [p["device"] for p in ceiling["per_gpu"]] == [str(i) for i in range(gpus)]
        assert ceiling["gbps"] == pytest.approx(sum(p["gbps"] for p in ceiling["per_gpu"]))
        assert records[("h2d-concurrent", "-")]["status"] == "ok"
        for key in ("dg-binary", "dg-parquet"):
            assert len(result["balance"][key]["bytes_per_worker"]) == gpus
            assert min(result["balance"][key]["partitions_per_worker"].values()) >= 1
    check = next(c for c in result["checks"] if c["baseline"] == "h2d-pinned")
    assert check["target"] == 0.85 and check["result"] in ("pass", "miss"), check
