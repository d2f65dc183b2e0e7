"""examples/ecg on the device target (CuPy, ``dg.LocalCUDACluster(protocol="ucxx")``), small size,
with both loaders, against the host target on the same data.

Run as subprocesses, as a user would: the pipeline starts its own cluster, so nothing here
touches CUDA. The device run executes the same beat code as the host run (``beats.py`` picks
CuPy or NumPy from its input), so it must find the same beats and reach the same precision and
recall, within a beat or two where float32 sums on the GPU round differently.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "examples" / "ecg" / "pipeline.py"
LAST_LINE = re.compile(r"precision=(\d+\.\d{4}) recall=(\d+\.\d{4}) beats_per_s=(\d+\.\d)")
MIN_OVERALL, MIN_PER_KIND = 0.95, 0.85  # as tests/test_example_ecg.py
KINDS = ("premature", "wide_qrs", "missing_p")


def run(data: Path, out: Path, target: str, loader: str) -> dict:
    cmd = [sys.executable, str(PIPELINE), "--size", "small", "--target", target]
    cmd += ["--loader", loader, "--data", str(data), "--json", str(out), "--jobs", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert LAST_LINE.fullmatch(proc.stdout.rstrip("\n").splitlines()[-1]), proc.stdout[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("ecg") / "data"


@pytest.fixture(scope="module")
def host(data):
    return run(data, data.parent / "host.json", "host", "direct")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("loader", ["direct", "naive"])
def test_pipeline_on_device(loader, data, host):
    pytest.importorskip("dask_cuda")
    pytest.importorskip("distributed_ucxx")
    result = run(data, data.parent / f"device-{loader}.json", "device", loader)
    assert result["target"] == "device" and result["protocol"] == "ucxx"
    ev = result["evaluation"]
    assert ev["matched_once"] == ev["labelled_beats"] > 500
    assert ev["missed"] == ev["matched_more_than_once"] == ev["duplicate_rows"] == 0
    assert result["beats_after_shuffle"] == result["detected_beats"] == ev["scored_beats"]
    assert ev["precision"] >= MIN_OVERALL and ev["recall"] >= MIN_OVERALL
    for kind in KINDS:
        m, h = ev["per_kind"][kind], host["evaluation"]["per_kind"][kind]
        assert m["precision"] >= MIN_PER_KIND and m["recall"] >= MIN_PER_KIND, (kind, m)
        assert abs(m["true_positives"] - h["true_positives"]) <= 1, (kind, m, h)
        assert abs(m["predicted"] - h["predicted"]) <= 1, (kind, m, h)
    assert abs(result["detected_beats"] - host["detected_beats"]) <= 1

    reads = [r for r in result["ledger"] if r["op"] == "read"]
    shuffles = {r["path"] for r in result["ledger"] if r["op"] == "shuffle"}
    assert shuffles and shuffles <= {"local", "ucx-device"}, shuffles  # never staged on the host
    if loader == "direct":
        assert reads and {r["path"] for r in reads} <= {"kvikio-compat", "gds"}, reads
        assert result["ledger_read_bytes"] == result["data"]["bytes"]
    else:
        assert not reads
        assert result["naive_bytes_outside_ledger"] == result["data"]["bytes"]
