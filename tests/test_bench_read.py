"""``dask-gpudirect bench read`` with several workers, and what it computes from its records.

The end-to-end run is the host target (a LocalCluster of two worker processes); the device
pieces that need a GPU are checked through their pure parts: the ceilings' sum and concurrent
span, the targets with several workers, and the turn-taking of one copy process per GPU.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
from util import HANG_GUARD, interrupt_at

from dask_gpudirect.bench import ceilings, read_report, remote_read, shuffle_report
from dask_gpudirect.bench._baselines import copy_group, record
from dask_gpudirect.bench.tables import judged_text

DOCS = pathlib.Path(__file__).parent.parent / "docs" / "benchmarks"


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_read_two_workers_host(tmp_path):
    out_json, out_md = tmp_path / "read.json", tmp_path / "read.md"
    size = str(1 / 1024)  # 1 MiB of each format
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "read",
        "--target",
        "host",
        "--workers",
        "2",
        "--dir",
        str(tmp_path / "data"),
        "--binary-gib",
        size,
        "--parquet-gib",
        size,
        "--files",
        "4",
        "--repeat",
        "1",
        "--no-drop-cache",
        "--no-baselines",
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 workers" in proc.stdout

    result = json.loads(out_json.read_text())
    assert result["options"]["workers"] == 2 and result["cluster"]["workers"] == 2
    records = {(r["key"], r["cache"]): r for r in result["records"]}
    for key in ("dg-binary", "dg-parquet", "dask-default"):
        assert records[(key, "warm")]["status"] == "ok" and records[(key, "warm")]["gbps"] > 0
    # no GPU: neither ceiling; --no-baselines: no single-process baseline
    for key in ("h2d-pinned", "h2d-concurrent"):
        assert records[(key, "-")]["status"] == "not run", records[(key, "-")]
    for key in ("naive", "cudf-default"):
        assert records[(key, "warm")]["note"] == "not asked (--no-baselines)"

    # placement spread the shards evenly: four equal files, the bytes halved between the
    # workers (the binary files joined into a chunk a worker, the Parquet files two a worker)
    workers = set(result["balance"]["dg-binary"]["bytes_per_worker"])
    assert len(workers) == 2
    for key, per_worker in (("dg-binary", [1, 1]), ("dg-parquet", [2, 2])):
        spread = result["balance"][key]
        assert set(spread["bytes_per_worker"]) == workers
        assert len(set(spread["bytes_per_worker"].values())) == 1, spread
        assert sorted(spread["partitions_per_worker"].values()) == per_worker, spread
        assert spread["max_over_mean"] == pytest.approx(1.0, abs=0.05), spread
        assert "bytes per worker max/mean" in records[(key, "warm")]["note"]
    markdown = out_md.read_text()
    assert "- workers: 2, worker processes" in markdown
    assert "- placement of dg-binary: GB per worker" in markdown
    assert "| pinned host->device copies, all GPUs at once | - | not run [1] |" in markdown
    assert "bench read: measurements: 15/15 (100%)" in proc.stderr


@pytest.mark.timeout(HANG_GUARD + 60)
@pytest.mark.parametrize(
    "store", [pytest.param(["--remote"], id="http"), pytest.param(["--remote", "s3"], id="s3")]
)
def test_bench_read_remote_host(tmp_path, store):
    """``--remote`` (a ranged HTTP server) and ``--remote s3`` (moto's S3 server): the data
    through the loopback server, every row measured or saying why not, the rows and records
    checked, the ratio to the faster per-URL baseline printed."""
    out_json, out_md = tmp_path / "remote.json", tmp_path / "remote.md"
    size = str(1 / 1024)
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "read", *store, "--target", "host"]
    cmd += ["--dir", str(tmp_path / "data"), "--binary-gib", size, "--parquet-gib", size]
    cmd += ["--files", "4", "--repeat", "1", "--json", str(out_json), "--markdown", str(out_md)]
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out_json.read_text())
    records = {r["key"]: r for r in result["records"]}
    assert list(records) == ["server", "cudf-url", "dask-url", "dg-parquet", "dg-binary"]
    for key in ("server", "cudf-url", "dg-parquet", "dg-binary"):
        assert records[key]["status"] == "ok" and records[key]["gbps"] > 0, records[key]
    assert records["dask-url"]["status"] in ("ok", "not run"), records["dask-url"]
    rows = result["data"]["parquet"]["rows"]
    assert records["dg-parquet"]["note"].startswith(f"{rows} rows")
    (check,) = result["checks"]
    assert check["what"].startswith("dg-parquet / ") and check["ratio"] > 0
    assert f"{check['what']}: {judged_text(check['ratio'], check['target'])}x" in proc.stdout
    assert "| server |" in out_md.read_text()
    server = "moto's S3 server" if "s3" in store else "Python's ranged HTTP server"
    assert server in result["server"]


@pytest.mark.parametrize(
    "name",
    ["2026-11-29-h200-read", "2026-11-29-h200-read-1thread", "2026-11-29-h200-x2-shuffle"],
)
def test_committed_results_render_as_they_did(name):
    """One-GPU outputs are unchanged: the committed JSON gives the committed Markdown again."""
    result = json.loads((DOCS / f"{name}.json").read_text())
    module = read_report if result["benchmark"] == "read" else shuffle_report
    assert module.markdown(result) == (DOCS / f"{name}.md").read_text()
    if module is read_report:
        assert read_report.checks_of(result["records"], result["target"]) == result["checks"]


def _group_out(name: str, gbps: float, start: float, end: float) -> dict:
    alone = record("h2d-pinned", "-", bytes=1 << 30, seconds=(1 << 30) / gbps / 1e9, runs=[1.0])
    span = {"start": start, "end": end, "bytes": 20 << 30, "rounds": 20}
    return {"device": {"name": name}, "ceiling_group": {"alone": alone, "concurrent": span}}


def test_ceilings_sum_the_gpus_and_span_the_concurrent_copies():
    outs = [_group_out("H200", 50.0, 10.0, 10.8), _group_out("H200", 54.0, 10.1, 11.0)]
    summed, concurrent = ceilings.ceiling_records(["0", "1"], outs)
    assert summed["key"] == "h2d-pinned" and summed["status"] == "ok"
    assert summed["gbps"] == pytest.approx(104.0)
    assert [p["gbps"] for p in summed["per_gpu"]] == pytest.approx([50.0, 54.0])
    assert summed["label"] == "sum of 2 GPUs' pinned host->device copies (ceiling)"
    assert concurrent["key"] == "h2d-concurrent" and concurrent["status"] == "ok"
    assert concurrent["seconds"] == pytest.approx(1.0)  # first start 10.0 to last end 11.0
    assert concurrent["gbps"] == pytest.approx(2 * (20 << 30) / 1e9)

    broken = [outs[0], {"device": {"name": "H200"}, "error": "CUDARuntimeError: boom"}]
    summed, concurrent = ceilings.ceiling_records(["0", "1"], broken)
    assert summed["status"] == "error" and summed["gbps"] is None
    assert summed["note"] == "GPU 1: CUDARuntimeError: boom"
    assert concurrent["status"] == "error" and "1 GPU(s) did not copy" in concurrent["note"]


def test_targets_with_several_workers():
    """The binary target is judged against the sum; one-GPU baselines carry no target."""
    recs = [
        record("h2d-pinned", "-", bytes=100, seconds=1.0),
        record("h2d-concurrent", "-", bytes=80, seconds=1.0),
        record("cudf-tuned", "warm", bytes=10, seconds=1.0),
        record("dask-default", "warm", bytes=10, seconds=1.0),
        record("dg-binary", "warm", bytes=90, seconds=1.0),
        record("dg-parquet", "warm", bytes=30, seconds=1.0),
    ]
    checks = {
        (c["path"], c["baseline"]): c for c in read_report.checks_of(recs, "device", workers=2)
    }
    assert checks[("dg-binary", "h2d-pinned")]["target"] == 0.85
    assert checks[("dg-binary", "h2d-pinned")]["result"] == "pass"  # 0.9x the sum
    assert checks[("dg-binary", "h2d-concurrent")]["target"] is None
    assert checks[("dg-parquet", "cudf-tuned")]["target"] is None
    assert checks[("dg-parquet", "dask-default")]["target"] == 2.0
    one = {(c["path"], c["baseline"]): c for c in read_report.checks_of(recs, "device")}
    assert one[("dg-parquet", "cudf-tuned")]["target"] == 1.0


def _fake_copy(log: list, rank: int, seconds: float = 0.01):
    def copy() -> int:
        start = time.monotonic()
        time.sleep(seconds)
        log.append((rank, start, time.monotonic()))
        return 1 << 20

    return copy


def test_copy_group_takes_turns_alone_then_copies_at_once(tmp_path):
    """Three ranks (threads standing in for one process per GPU) with a fake copy."""
    size, out = 3, {}
    windows: dict[int, list] = {r: [] for r in range(size)}

    def rank(r: int) -> None:
        copy = _fake_copy(windows[r], r)
        out[r] = copy_group(copy, 1 << 20, r, size, str(tmp_path), repeat=3, rounds=5, timeout=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(out) == [0, 1, 2]
    # alone: rank r's three timed copies end before rank r+1's begin
    for r in range(size - 1):
        assert windows[r][2][2] <= windows[r + 1][0][1]
    # at once: every rank's concurrent span starts before any ends
    spans = [out[r]["concurrent"] for r in range(size)]
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans)
    assert all(s["bytes"] == 5 << 20 for s in spans)
    assert all(out[r]["alone"]["status"] == "ok" for r in range(size))


def test_copy_group_goes_on_without_a_failed_rank(tmp_path):
    (tmp_path / "failed-1").touch()  # rank 1 could not set up its GPU
    results = {}

    def rank(r: int) -> None:
        results[r] = copy_group(_fake_copy([], r), 1, r, 3, str(tmp_path), 1, 2, timeout=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 2]


def test_ceilings_of_several_gpus_one_process_each(monkeypatch):
    """The real processes, with a stand-in CuPy: each sees its own GPU, all report, in turns."""
    stubs = pathlib.Path(__file__).parent / "stubs"
    path = os.pathsep.join([str(stubs), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    summed, concurrent = ceilings.gpu_ceilings(["0", "1", "3"], timeout=60, nbytes=1 << 20)
    assert summed["status"] == "ok", summed
    names = [p["name"] for p in summed["per_gpu"]]
    assert names == ["stub GPU 0", "stub GPU 1", "stub GPU 3"]
    assert summed["gbps"] == pytest.approx(sum(p["gbps"] for p in summed["per_gpu"]))
    assert concurrent["status"] == "ok" and concurrent["bytes"] == 3 * 20 << 20
    assert 0 < concurrent["gbps"] <= summed["gbps"] * 1.05


def test_the_records_check_counts_the_chunks_not_the_declared_shape(tcp):
    """``bench read`` checked ``array.shape``, which the graph declares before a byte is
    read: chunks that held one record each passed as the files' records."""
    import dask
    import dask.array as da
    import numpy as np

    from dask_gpudirect.bench.persisting import records_check

    def chunk(n: int) -> da.Array:
        return da.from_delayed(dask.delayed(np.zeros)(n), shape=(5,), dtype=float)

    whole = tcp.persist(da.concatenate([chunk(5), chunk(5)]))
    assert records_check(10)(whole) == "10 records in 2 chunks"
    short = tcp.persist(da.concatenate([chunk(5), chunk(1)]))  # declares 10, holds 6
    with pytest.raises(RuntimeError, match="the chunks hold 6 records, the files hold 10"):
        records_check(10)(short)


@pytest.mark.timeout(HANG_GUARD + 60)
def test_an_interrupted_run_names_what_it_did_not_measure(tmp_path):
    """Ctrl-C in the middle: the paths not reached (Dask's read after dg's) were left out of
    the tables; each is now a "not run" row saying the run was interrupted, and it exits 130."""
    out_json, out_md = tmp_path / "read.json", tmp_path / "read.md"
    size = str(1 / 1024)
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "read", "--target", "host"]
    cmd += ["--dir", str(tmp_path / "data"), "--binary-gib", size, "--parquet-gib", size]
    cmd += ["--files", "2", "--repeat", "1", "--no-drop-cache", "--no-baselines"]
    cmd += ["--no-progress", "--json", str(out_json), "--markdown", str(out_md)]
    code, log = interrupt_at(cmd, "measuring dg-parquet (warm)")  # as dg's Parquet read starts
    assert code == 130, log[-4000:]

    result = json.loads(out_json.read_text())
    by = {(r["key"], r["cache"]): r for r in result["records"]}
    planned = [k for k in read_report.ORDER if k[0] != "h2d-concurrent"]  # one worker
    assert sorted(by) == sorted(planned)
    assert by["dg-binary", "warm"]["status"] == "ok"
    dask_warm = by["dask-default", "warm"]
    assert (dask_warm["status"], dask_warm["note"]) == ("not run", "interrupted")
    row = next(
        r for r in out_md.read_text().splitlines() if r.startswith("| dask.dataframe.read_parquet")
    )
    assert "| warm | not run [" in row, row


@pytest.mark.timeout(HANG_GUARD + 60)
def test_an_interrupted_remote_run_names_what_it_did_not_measure(tmp_path):
    """The same over HTTP: the paths after the one interrupted are "not run" rows."""
    out_json, out_md = tmp_path / "read.json", tmp_path / "read.md"
    size = str(1 / 1024)
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "read", "--remote", "--target", "host"]
    cmd += ["--dir", str(tmp_path / "data"), "--binary-gib", size, "--parquet-gib", size]
    cmd += ["--files", "2", "--repeat", "1", "--no-progress"]
    cmd += ["--json", str(out_json), "--markdown", str(out_md)]
    code, log = interrupt_at(cmd, "measuring cudf-url")
    assert code == 130, log[-4000:]

    result = json.loads(out_json.read_text())
    by = {r["key"]: r for r in result["records"]}
    assert sorted(by) == sorted(remote_read.KEYS)
    assert by["server"]["status"] == "ok"
    for key in ("dask-url", "dg-parquet", "dg-binary"):
        assert (by[key]["status"], by[key]["note"]) == ("not run", "interrupted"), by[key]
    assert "| dg-parquet | not run |" in out_md.read_text()
