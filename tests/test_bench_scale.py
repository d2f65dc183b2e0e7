"""``dask-gpudirect bench scale`` and ``scripts/gpu-scale.sh`` on the host target, at tiny sizes.

The table must hold the figures of the child runs' own JSON, not figures of its own making; a run
out of time must be stopped with its whole process group; rows that cannot run say why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from util import HANG_GUARD, interrupt_at

from dask_gpudirect.bench import scale
from dask_gpudirect.bench.common import child_env
from dask_gpudirect.bench.scale_report import rows_of, table
from dask_gpudirect.bench.tables import figure_text

ROOT = pathlib.Path(__file__).parent.parent
TINY = str(1 / 1024)  # GiB
READ_ARGS = f"--binary-gib {TINY} --parquet-gib {TINY} --repeat 1 --no-drop-cache --no-baselines"
SHUFFLE_ARGS = f"--gib {TINY} --repeat 1 --raw-mib 4 --partitions 4"


def _table_rows(markdown: str) -> dict[str, list[str]]:
    """The scaling table's rows by their first cell (the count), cells stripped."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| workers |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = cells
    return rows


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_scale_host(tmp_path):
    out_json, out_md, runs = tmp_path / "scale.json", tmp_path / "scale.md", tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "scale",
        "--target",
        "host",
        "--gpus",
        "1,2",
        "--dir",
        str(tmp_path / "data"),
        "--runs-dir",
        str(runs),
        "--read-args",
        READ_ARGS,
        "--shuffle-args",
        SHUFFLE_ARGS,
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    if importlib.util.find_spec("matplotlib"):
        cmd += ["--plot", str(tmp_path / "scale.png")]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "[bench scale " in proc.stderr and "read on 2 workers: ok" in proc.stderr

    result = json.loads(out_json.read_text())
    assert result["benchmark"] == "scale" and result["target"] == "host"
    # the largest count first; every run ok, its file the JSON embedded here
    assert [(r["bench"], r["gpus"]) for r in result["runs"]] == [
        ("read", 2),
        ("shuffle", 2),
        ("read", 1),
        ("shuffle", 1),
    ]
    child = {}
    for run in result["runs"]:
        assert run["status"] == "ok" and run["exit"] == 0, run
        assert f"--workers {run['gpus']}" in run["command"]
        child[(run["bench"], run["gpus"])] = json.loads(pathlib.Path(run["json"]).read_text())
        assert child[(run["bench"], run["gpus"])] == run["result"]
        assert child[(run["bench"], run["gpus"])]["options"]["workers"] == run["gpus"]
    assert child[("read", 2)]["options"]["files"] == 8  # at least 2 per worker, 8 at least

    rows = _table_rows(out_md.read_text())
    assert sorted(rows) == ["1", "2"]
    for n in (1, 2):
        cells = rows[str(n)]
        read = {(r["key"], r["cache"]): r for r in child[("read", n)]["records"]}
        assert cells[1] == figure_text(read[("dg-binary", "warm")]["gbps"])
        assert cells[2].startswith("not run [")  # no GPU: no pinned ceiling, no ratio
        assert cells[3] == "-"
        if n == 1:  # all copying at once: only with several workers
            assert cells[4] == "-"
        else:
            assert cells[4].startswith("not run [")
        assert cells[5] == figure_text(read[("dg-parquet", "warm")]["gbps"])
        shuffled = {r["key"]: r for r in child[("shuffle", n)]["records"]}
        per = {k: r.get("gbps_per_gpu") for k, r in shuffled.items()}
        assert cells[6] == figure_text(per["gpudirect"])
        if n == 2:
            assert cells[7] == figure_text(per["raw"])
        else:  # the raw transfer needs two workers
            assert cells[7].startswith("not run [")
        assert cells[8] == f"{figure_text(per['tasks'])} / {figure_text(per['p2p'])}"
        faster = max(("tasks", "p2p"), key=per.get)
        assert cells[9] == f"{per['gpudirect'] / per[faster]:.2f}x {faster}"
    markdown = out_md.read_text()
    assert "needs two workers" in markdown
    # placement spread every read evenly over the two workers (8 equal files)
    assert "- 2 workers: dg-binary 1.00, dg-parquet 1.00" in markdown
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"


def test_runs_that_cannot_run_say_why(monkeypatch, tmp_path):
    """More GPUs than visible, and a time limit that no longer fits a run."""
    monkeypatch.setattr(scale, "_one_run", lambda b, n, *_: {"bench": b, "gpus": n, "status": "ok"})
    opts = {
        "gpus": [1, 2, 4],
        "benches": ["read", "shuffle"],
        "target": "device",
        "read_limit": 100.0,
        "shuffle_limit": 100.0,
    }
    result = {"runs": []}
    scale._run_all(result, opts, ["0", "1"], deadline=None)
    status = {(r["bench"], r["gpus"]): (r["status"], r.get("note")) for r in result["runs"]}
    assert status[("read", 4)] == ("not run", "2 GPU(s) visible")
    assert status[("shuffle", 2)] == ("ok", None)
    result = {"runs": []}
    scale._run_all(result, opts, ["0", "1"], deadline=time.monotonic() + scale.GRACE_S + 40)
    status = {(r["bench"], r["gpus"]): (r["status"], r.get("note")) for r in result["runs"]}
    assert status[("read", 2)] == ("ok", None)  # 40 s still fit a read, not a shuffle
    assert status[("shuffle", 2)] == ("not run", "--time-limit reached")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--read-args", "--bogus"], "No such option '--bogus'"),
        (["--read-args", "--workers 2"], "--workers: scale sets it for each run"),
        (["--shuffle-args", "--json x.json"], "--json: scale sets it for each run"),
    ],
)
def test_a_runs_options_are_checked_at_the_start(args, says):
    """As the bench would parse them, before any run (each child failed after it started, ran
    with another worker count than its row said, or wrote its JSON where scale did not look)."""
    from click.testing import CliRunner

    result = CliRunner().invoke(scale.scale, ["--target", "host", *args])
    assert result.exit_code == 2 and says in result.output, result.output


def test_the_least_time_limit_starts_a_first_run(monkeypatch):
    """A --time-limit below what any run needs is a usage error (60 was taken, and nothing
    ran); at the least one taken, the first run of either bench starts."""
    from click.testing import CliRunner

    result = CliRunner().invoke(scale.scale, ["--time-limit", "60"])
    assert result.exit_code == 2 and "--time-limit" in result.output, result.output
    monkeypatch.setattr(scale, "_one_run", lambda b, n, *_: {"bench": b, "gpus": n, "status": "ok"})
    for bench in scale.BENCHES:
        opts = {"gpus": [1], "benches": [bench], "target": "host", f"{bench}_limit": 600.0}
        result = {"runs": []}
        deadline = time.monotonic() + scale.LEAST_TIME_LIMIT_S - scale.RESERVE_S
        scale._run_all(result, opts, [], deadline=deadline)
        assert result["runs"][0]["status"] == "ok", result


def test_failed_run_without_json_fills_its_cells_with_why():
    result = {
        "target": "device",
        "options": {"gpus": [2]},
        "runs": [
            {"bench": "read", "gpus": 2, "status": "failed", "note": "read on 2 GPUs: boom"},
            {"bench": "shuffle", "gpus": 2, "status": "not run", "note": "--time-limit reached"},
        ],
    }
    for run in result["runs"]:
        run["result"] = None
    result["rows"] = rows_of(result)
    (cells,), notes = table(result)
    assert cells == ("2", *["failed [1]"] * 5, *["not run [2]"] * 4)
    assert notes == ["[1] read on 2 GPUs: boom", "[2] --time-limit reached"]


def test_a_run_out_of_time_is_stopped_with_its_process_group(monkeypatch, tmp_path):
    """A child that ignores SIGINT, with a grandchild: both are gone when the run returns."""
    monkeypatch.setattr(scale, "GRACE_S", 1.0)
    pid_file = tmp_path / "grandchild"
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "p = subprocess.Popen(['sleep', '60']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    started = time.monotonic()
    done = scale._run_child([sys.executable, "-c", code], child_env({}), str(tmp_path / "log"), 2)
    assert done["status"] == "timed out"
    assert time.monotonic() - started < 20
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_child_env_keeps_this_environment_and_finds_this_tree(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # as scripts/lent-machine.sh sets it
    monkeypatch.setenv("KVIKIO_NTHREADS", "16")
    env = child_env({"KVIKIO_NTHREADS": None, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert "KVIKIO_NTHREADS" not in env and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)


@pytest.mark.timeout(HANG_GUARD + 60)
def test_gpu_scale_script_on_the_host_target(tmp_path):
    """scripts/gpu-scale.sh at a tiny size: the probe, one read run, files and the table last."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "BENCH_TARGET": "host",
        "BENCH_DIR": str(tmp_path / "data"),
        "RUNS_DIR": str(tmp_path / "runs"),
        "SCALE_GPUS": "2",
        "SCALE_BENCHES": "read",
        # a loaded CI machine (another suite beside this one) took 140 s for the probe and
        # 125 s for the read: the script's limits, not the machine's load, must not fail it
        "PROBE_LIMIT": "240",
        "READ_LIMIT": "240",
    }
    proc = subprocess.run(
        ["bash", "scripts/gpu-scale.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "env.txt",
        "gpu-scale.log",
        "probe.json",
        "scale-runs.tar.gz",
        "scale.json",
        "scale.md",
        *(["scale.png"] if importlib.util.find_spec("matplotlib") else []),
    ]
    assert len(files) <= 8  # what the GPU machine sends back
    assert json.loads((out / "probe.json").read_text())["paths"]
    assert "  read on 2: ok" in proc.stdout
    # last: the table, its footnotes and placement's balance
    last = proc.stdout[proc.stdout.rindex("| workers |") :].rstrip().splitlines()
    assert last[2].startswith("| 2 | ") and "[1] no GPU  " in last
    assert last[-1] == "- 2 workers: dg-binary 1.00, dg-parquet 1.00"


@pytest.mark.timeout(HANG_GUARD + 60)
def test_an_interrupted_run_exits_130_with_the_table_of_what_ran(tmp_path):
    """Ctrl-C as the first run starts: the table says the runs were interrupted, and the exit is
    130 as the other benches' (it was 1, "not every run finished", as for a failed run)."""
    out_json = tmp_path / "scale.json"
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "scale", "--target", "host"]
    cmd += ["--gpus", "1,2", "--dir", str(tmp_path / "data"), "--runs-dir", str(tmp_path / "r")]
    cmd += ["--read-args", READ_ARGS, "--shuffle-args", SHUFFLE_ARGS, "--json", str(out_json)]
    code, log = interrupt_at(cmd, "(limit ")
    assert code == 130, log[-4000:]
    result = json.loads(out_json.read_text())
    assert result["interrupted"] is True
    for run in result["runs"]:  # the one running when Ctrl-C came, and those not started
        assert "interrupted" in (run["status"], run["note"]), run


def test_a_figure_of_fewer_runs_than_asked_says_why():
    """A child's record cut short (its budget, Ctrl-C) is not the median of the warm runs the
    table's note speaks of: its cell says so (it showed the figure alone)."""
    shuffle = {
        "records": [
            {"key": "gpudirect", "status": "ok", "gbps_per_gpu": 5.0, "stopped": "budget reached"},
            {"key": "tasks", "status": "ok", "gbps_per_gpu": 1.0},
        ],
        "checks": [],
    }
    result = {
        "target": "host",
        "options": {"gpus": [2]},
        "runs": [{"bench": "shuffle", "gpus": 2, "status": "ok", "note": "", "result": shuffle}],
    }
    result["rows"] = rows_of(result)
    (cells,), notes = table(result)
    assert cells[6] == f"{figure_text(5.0)} [1]", cells
    assert figure_text(1.0) in cells[8] and "[" not in cells[8], cells
    assert notes == ["[1] budget reached"]
