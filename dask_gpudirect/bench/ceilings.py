"""What ``bench read`` measures outside its cluster: the baseline processes and the ceilings.

The single-process baselines and the pinned copy ceilings run in fresh interpreters
(``_baselines.main``), started and collected here, in the parent; ``dd iflag=direct`` gives the
disk's own ceiling. Kept apart from ``read`` so that the process management is in one place.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from ._baselines import record
from .common import GIB, child_env

#: ``-c`` rather than ``-m``: runpy warns when ``-m`` runs a module its package already imported.
_BASELINES_MAIN = (
    "import sys; from dask_gpudirect.bench._baselines import main; sys.exit(main(sys.argv[1:]))"
)


def run_baselines(spec: dict, env: dict[str, str | None], timeout: float) -> dict:
    """Run ``_baselines`` in a fresh interpreter with ``env`` changes; returns its output."""
    return _baseline_processes([(spec, env)], timeout)[0]


def _baseline_processes(
    jobs: Sequence[tuple[dict, Mapping[str, str | None]]], timeout: float
) -> list:
    """Run one ``_baselines`` process per (spec, env changes), all at once; their outputs."""
    with tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp:
        procs, outs = [], []
        try:
            for i, (spec, env) in enumerate(jobs):
                spec = {**spec, "out": os.path.join(tmp, f"out-{i}.json")}
                cmd = [sys.executable, "-c", _BASELINES_MAIN, json.dumps(spec)]
                procs.append((subprocess.Popen(cmd, env=child_env(env)), spec["out"]))
            deadline = time.monotonic() + timeout
            for proc, path in procs:
                code: int | str
                try:
                    code = proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = f"timed out after {timeout:.0f} s"
                if code == 0 and os.path.exists(path):
                    with open(path) as f:
                        outs.append(json.load(f))
                else:
                    why = f"baseline process failed (exit {code}); see the log above"
                    outs.append({"error": why})
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return outs


def gpu_ceilings(devices: list[str], timeout: float, nbytes: int = 1 << 30) -> list[dict]:
    """The pinned copy ceiling of each of ``devices`` and their sum, and all of them at once.

    One fresh process per GPU (``CUDA_VISIBLE_DEVICES`` set to it), all started together: they
    measure alone in turn, then copy at the same time (``_baselines.copy_group``).
    """
    with tempfile.TemporaryDirectory(prefix="dg-ceiling-") as sync:
        group = {"size": len(devices), "sync_dir": sync, "nbytes": nbytes}
        jobs = [
            (
                {"target": "device", "ceiling_group": {**group, "rank": rank}},
                {"CUDA_VISIBLE_DEVICES": device},
            )
            for rank, device in enumerate(devices)
        ]
        outs = _baseline_processes(jobs, timeout)
    return ceiling_records(devices, outs)


def ceiling_records(devices: list[str], outs: list[dict]) -> list[dict]:
    """``h2d-pinned`` (the sum of the GPUs' ceilings, each alone) and ``h2d-concurrent`` (the
    bytes all GPUs copied at once over the span from the first start to the last end)."""
    per_gpu, spans = [], []
    for device, out in zip(devices, outs, strict=True):
        group = out.get("ceiling_group") or {}
        alone = group.get("alone") or {"status": "error", "gbps": None}
        per_gpu.append(
            {
                "device": device,
                "name": (out.get("device") or {}).get("name"),
                "status": alone["status"],
                "bytes": alone.get("bytes", 0),
                "gbps": alone["gbps"],
                "note": alone.get("note") or out.get("error", "not reported"),
            }
        )
        if group.get("concurrent"):
            span = group["concurrent"]
            spans.append(span)
            per_gpu[-1]["concurrent_gbps"] = span["bytes"] / (span["end"] - span["start"]) / 1e9
    n = len(devices)
    label = f"sum of {n} GPUs' pinned host->device copies (ceiling)"
    failed = [p for p in per_gpu if p["status"] != "ok" or not p["gbps"]]
    if failed:
        why = f"GPU {failed[0]['device']}: {failed[0]['note']}"
        summed = record("h2d-pinned", "-", status="error", note=why, label=label, per_gpu=per_gpu)
    else:
        figures = " + ".join(f"{p['gbps']:.2f}" for p in per_gpu)
        summed = record(
            "h2d-pinned",
            "-",
            bytes=sum(p["bytes"] for p in per_gpu),
            note=f"sum of {n} GPUs' ceilings, each measured alone: {figures} GB/s",
            label=label,
            per_gpu=per_gpu,
        )
        summed["gbps"] = sum(p["gbps"] for p in per_gpu)
    if len(spans) == n:
        seconds = max(s["end"] for s in spans) - min(s["start"] for s in spans)
        concurrent = record(
            "h2d-concurrent",
            "-",
            bytes=sum(s["bytes"] for s in spans),
            seconds=seconds,
            runs=[seconds],
            note=f"{n} GPUs copying at once, {spans[0]['rounds']} x "
            f"{spans[0]['bytes'] / spans[0]['rounds'] / (1 << 30):g} GiB each; bytes over the "
            "span from the first start to the last end",
        )
    else:
        concurrent = record(
            "h2d-concurrent", "-", status="error", note=f"{n - len(spans)} GPU(s) did not copy"
        )
    return [summed, concurrent]


def dd_direct(path: str) -> dict:
    """``dd if=path of=/dev/null bs=16M iflag=direct``: sequential O_DIRECT read, page cache off,
    of at most the file's first GiB."""
    if shutil.which("dd") is None:
        return record("dd-direct", "cold", status="not run", note="no dd on this machine")
    size = os.path.getsize(path)
    count = max(1, min(size, GIB) // (16 << 20))
    cmd = ["dd", f"if={path}", "of=/dev/null", "bs=16M", f"count={count}", "iflag=direct"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, timeout=300
    )
    match = re.search(r"^(\d+) bytes.*copied, ([0-9.e+-]+) s", proc.stderr, re.MULTILINE)
    if proc.returncode or not match:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return record("dd-direct", "cold", status="error", note=f"{shlex.join(cmd)}: {tail[0]}")
    nbytes, seconds = int(match.group(1)), float(match.group(2))
    return record(
        "dd-direct",
        "cold",
        bytes=nbytes,
        seconds=seconds,
        runs=[seconds],
        note=shlex.join(cmd),
    )
