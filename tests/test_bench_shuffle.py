"""``dask-gpudirect bench shuffle`` end to end on the host target, at a tiny size.

Run as a subprocess, as a user would: the command starts and stops its own cluster, which must
not meet the session clusters of this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from util import CLIENT_PHASES, GC, HANG_GUARD, UCX_CPU_ENV, UCX_PROGRESS_ENV

from dask_gpudirect.bench import timing
from dask_gpudirect.bench.shuffle_report import checks_of, markdown
from dask_gpudirect.bench.timing import _record, _summarise

METHODS = ["gpudirect", "dask-gpudirect", "tasks", "p2p", "raw"]
#: The ledger path of a host transfer between the two workers, by protocol.
WIRE_PATH = {"tcp": "tcp-host", "ucxx": "ucx-host"}


@pytest.mark.timeout(HANG_GUARD + 60)
@pytest.mark.parametrize("protocol", ["tcp", "ucxx"])
def test_bench_shuffle_host(tmp_path, protocol):
    if protocol == "ucxx":
        pytest.importorskip("distributed_ucxx")
    out_json, out_md = tmp_path / "shuffle.json", tmp_path / "shuffle.md"
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "shuffle",
        "--target",
        "host",
        "--gib",
        str(16 / 1024),
        "--workers",
        "2",
        "--protocol",
        protocol,
        "--repeat",
        "1",
        "--raw-mib",
        "16",
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    # the command itself makes UCXX progress in a thread, in its process and its workers'
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCXPY_")}
    env.update(COLUMNS="160", **UCX_CPU_ENV)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert "dg.shuffle(df, 'key')" in proc.stdout

    result = json.loads(out_json.read_text())
    assert result["benchmark"] == "shuffle" and result["target"] == "host"
    assert result["device"].startswith("CPU")
    assert result["command"].split().count("shuffle") == 1
    assert result["versions"]["distributed"] != "not installed"
    assert result["cluster"]["protocol"] == protocol and result["cluster"]["workers"] == 2
    if protocol == "ucxx":  # no process of the command spins on UCX's event descriptor
        for process in ("ucx_env", "worker_ucx_env"):
            assert UCX_PROGRESS_ENV.items() <= result["cluster"][process].items(), result
    data = result["data"]
    assert data["rows"] == (16 << 20) // 32 and data["bytes"] >= 16 << 20
    assert sorted(data["partitions_per_worker"].values()) == [16, 16]

    records = {r["key"]: r for r in result["records"]}
    assert sorted(records) == sorted(METHODS)
    for key in METHODS:
        rec = records[key]
        assert rec["status"] == "ok", rec
        assert rec["gbps_per_gpu"] > 0 and rec["best_gbps_per_gpu"] > 0, rec
        assert len(rec["runs"]) == 2 and rec["warm_runs"] == 1, rec
    assert records["raw"]["bytes"] == 16 << 20
    assert all(s > 0 for s in records["raw"]["round_trip_seconds"])
    assert "rows and sum(z) checked" in records["gpudirect"]["note"]
    shuffles = [r for key, r in records.items() if key != "raw"]
    assert all("every key in its partition" in r["note"] for r in shuffles), shuffles
    # which engine moved the bytes, where the package's exchange did (pandas: its own)
    for key in ("gpudirect", "dask-gpudirect"):
        assert records[key]["note"].endswith("; engine distributed"), records[key]
    assert "engine" not in records["tasks"]["note"]
    # where each dg run's stage spent its time, inside the run's own time
    dg = records["gpudirect"]
    for seconds, phases in zip(dg["runs"], dg["phases"], strict=True):
        assert {"shuffle: split", "shuffle: combine"} <= set(phases), phases
        assert max(phases.values()) <= seconds, phases
        client = {k: s for k, s in phases.items() if k.startswith("client: ")}
        assert list(client) == [f"client: {p}" for p in (*CLIENT_PHASES, GC)], phases
        assert sum(client.values()) - client[f"client: {GC}"] <= seconds, phases

    checks = {c["check"]: c for c in result["checks"]}
    assert sorted(checks) == [
        "Dask's df.shuffle on dg's exchange",
        "faster of Dask's shuffles",
        "raw single-buffer transfer",
    ]
    faster = max(("tasks", "p2p"), key=lambda k: records[k]["gbps_per_gpu"])
    assert checks["faster of Dask's shuffles"]["baseline"] == faster
    for check in checks.values():  # ratios on the host target, targets only on the device
        base = records[check["baseline"]]
        assert check["ratio"] == pytest.approx(
            records["gpudirect"]["gbps_per_gpu"] / base["gbps_per_gpu"]
        )
        assert check["target"] is None and check["result"] == "-", check

    paths = {(r["op"], r["path"]) for r in result["ledger"]}
    assert ("shuffle", WIRE_PATH[protocol]) in paths, paths
    markdown = out_md.read_text()
    assert "| df.shuffle('key', shuffle_method='p2p') |" in markdown
    assert f"| shuffle | {WIRE_PATH[protocol]} |" in markdown


def test_the_check_finds_rows_shuffled_by_another_column(tcp):
    """``bench shuffle`` checks that each key is in the partition Dask's hash gives it, on top
    of the sums (which a shuffle by another column, or none, keeps)."""
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    from dask_gpudirect.bench.shuffle import _misplaced_rows

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"key": rng.integers(0, 1000, 4000), "z": rng.integers(0, 1000, 4000)})
    df = dd.from_pandas(pdf, npartitions=4)
    assert _misplaced_rows(tcp, df.shuffle("key", shuffle_method="tasks")) == 0
    assert _misplaced_rows(tcp, df.shuffle("z", shuffle_method="tasks")) > 0


def test_the_tools_cluster_leaves_no_gc_callback_that_loses_a_ctrl_c():
    """The in-process scheduler's GC timing is a ``gc`` callback: a Ctrl-C landing in it was
    printed as "Exception ignored" and lost (3 of 5 interrupts of a bench), and the bench then
    waited on the workers the same Ctrl-C had stopped."""
    import gc

    from dask_gpudirect.measure import start_cluster, stop_cluster

    cluster, client = start_cluster("host", 1, 1, "tcp", None)
    try:
        owners = [type(getattr(callback, "__self__", None)).__name__ for callback in gc.callbacks]
        assert "GCDiagnosis" not in owners, owners
    finally:
        stop_cluster(cluster, client, print)


def test_targets_apply_only_where_gpus_exchange():
    """With one worker every row stays on its GPU: the ratios are shown, the targets are not."""
    from dask_gpudirect.bench.shuffle_report import checks_of
    from dask_gpudirect.bench.tables import judge

    records = [
        {"key": key, "status": "ok", "gbps_per_gpu": gbps}
        for key, gbps in [("gpudirect", 6.0), ("tasks", 2.0), ("p2p", 0.1), ("raw", 200.0)]
    ]
    two = checks_of(records, "device", workers=2)
    assert [(c["baseline"], c["target"], c["result"]) for c in two] == [
        ("tasks", 3.0, "pass"),
        ("raw", 0.5, "miss"),
    ]
    one = checks_of(records, "device", workers=1)
    assert [(c["baseline"], c["ratio"], c["target"]) for c in one] == [
        ("tasks", 3.0, None),
        ("raw", 0.03, None),
    ]
    assert {c["result"] for c in one} == {judge(1.0, None)}


def test_a_ratio_shown_next_to_its_target_is_not_rounded_onto_its_other_side():
    """2.996 against ">= 3" missed but was shown as "3.00x"; a bound "<= 1.5" missed by
    1.5004 was shown as "1.50x". The table shows the digits that tell them apart."""
    from dask_gpudirect.bench.shuffle_report import _check_rows

    checks = [
        {"check": "vs", "baseline": "tasks", "ratio": 2.996, "target": 3.0, "result": "miss"},
        {"check": "vs", "baseline": "tasks", "ratio": 3.004, "target": 3.0, "result": "pass"},
        {
            "check": "growth",
            "baseline": "8",
            "ratio": 1.5004,
            "target": 1.5,
            "at_most": True,
            "result": "miss",
        },
        {"check": "vs", "baseline": "raw", "ratio": 0.123, "target": None, "result": "-"},
    ]
    shown = [row[1] for row in _check_rows({"checks": checks})]
    assert shown == ["2.996x", "3.00x", "1.5004x", "0.12x"]


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_shuffle_sweeps_partition_counts(tmp_path):
    """``--partitions 2,16``: the same frame at each count, each method at each, one table of
    how the time grows, and the check of dg.shuffle's growth against the host bound."""
    pytest.importorskip("matplotlib")
    out = {ext: tmp_path / f"sweep.{ext}" for ext in ("json", "md", "png")}
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "shuffle", "--target", "host"]
    cmd += ["--gib", str(4 / 1024), "--partitions", "16,2", "--methods", "gpudirect,tasks"]
    cmd += ["--repeat", "1", "--json", str(out["json"]), "--markdown", str(out["md"])]
    cmd += ["--plot", str(out["png"]), "--no-progress"]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert "bench shuffle by partition count" in proc.stdout

    result = json.loads(out["json"].read_text())
    assert [s["partitions"] for s in result["sweep"]] == [2, 16]
    (rows,) = {s["data"]["rows"] for s in result["sweep"]}  # the same frame at each count
    assert rows == (4 << 20) // 32
    by = {(r["key"], r["partitions"]): r for r in result["records"]}
    assert sorted(by) == [("gpudirect", 2), ("gpudirect", 16), ("tasks", 2), ("tasks", 16)]
    assert all(r["status"] == "ok" for r in by.values()), result["records"]

    (check,) = result["checks"]
    growth = by["gpudirect", 16]["seconds"] / by["gpudirect", 2]["seconds"]
    assert check["ratio"] == pytest.approx(growth)
    assert check["target"] == 4.0 and check["result"] == ("pass" if growth <= 4 else "miss")
    markdown = out["md"].read_text()
    assert "| partitions | dg.shuffle(df, 'key') |" in markdown
    assert markdown.count("\n| 2 | ") == 1 and markdown.count("\n| 16 | ") == 1
    # no run pays for the garbage of the runs before it, and the report says so
    assert "garbage collected in the client and the workers" in markdown
    assert out["png"].stat().st_size > 0


@pytest.mark.parametrize("value", ["0,8", "8,8", "eight", ""])
def test_bench_shuffle_refuses_bad_partition_counts(value):
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    result = CliRunner().invoke(shuffle, ["--partitions", value])
    assert result.exit_code == 2 and "--partitions" in result.output, result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gib", "-1"], "use a positive number of GiB"),
        (["--gib", "nan"], "use a positive number of GiB"),
        (["--gib", "0"], "use a positive number of GiB"),
        (["--rmm-pool-size", "10XB"], "use a positive size"),
        (["--rmm-pool-size", "1GB"], "the host target has no RMM pool"),
        (["--json", "{afile}/x.json"], "cannot write there"),
        (["--markdown", "/proc/x.md"], "cannot write there"),
    ],
)
def test_bench_shuffle_refuses_bad_options_before_it_runs(tmp_path, args, says):
    """A usage error at once, not a run that records a size of -1, nor one whose results are
    lost when its output file cannot be written at the end."""
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    (tmp_path / "afile").touch()
    args = [a.format(afile=tmp_path / "afile") for a in args]
    result = CliRunner().invoke(shuffle, ["--target", "host", "--partitions", "2", *args])
    assert result.exit_code == 2 and says in result.output, result.output


def test_an_output_checked_then_refused_leaves_no_folder(tmp_path):
    """The folders made to check ``--json``'s place go again when a later option is refused
    (an empty folder was left behind)."""
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    out = tmp_path / "new" / "deeper" / "r.json"
    result = CliRunner().invoke(shuffle, ["--json", str(out), "--gib", "0"])
    assert result.exit_code == 2 and "use a positive number of GiB" in result.output
    assert not (tmp_path / "new").exists()


def test_bench_shuffle_refuses_rapidsmpf_on_the_host_target():
    """RapidsMPF shuffles on GPU workers only: a usage error, not a run that says "not run"."""
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    args = ["--target", "host", "--methods", "gpudirect,rapidsmpf"]
    result = CliRunner().invoke(shuffle, args)
    assert result.exit_code == 2, result.output
    assert "--methods rapidsmpf: runs on GPU workers only" in result.output


def test_bench_shuffle_leaves_out_rapidsmpf_where_it_is_not_installed(monkeypatch):
    """On GPU workers without RapidsMPF the default run measured every other method and then
    exited non-zero for the one it could not import (seen on an H100 without the peers'
    wheels); now that method is "not run", naming what to install, as bench etl's cudf-polars
    is. (Its packages are made missing here: the device target cannot run on this machine.)"""
    from dask_gpudirect.bench.shuffle import _one_method
    from dask_gpudirect.shuffle import engines

    monkeypatch.setitem(engines.RAPIDSMPF_MODULES, "no_such_module_here", "no-such-package")
    record, timed_out = _one_method(None, "rapidsmpf", None, [], {}, lambda: 60.0, {})
    assert record["status"] == "not run" and not timed_out
    assert "no-such-package" in record["note"] and "dask-gpudirect[rapidsmpf]" in record["note"]


def _bench(args: list[str], tmp_path) -> tuple[dict, str, str]:
    """``bench shuffle ARGS`` on the host target, as a user runs it: its JSON, Markdown and
    output."""
    out_json, out_md = tmp_path / "out.json", tmp_path / "out.md"
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "shuffle", "--target", "host", *args]
    cmd += ["--no-progress", "--json", str(out_json), "--markdown", str(out_md)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(out_json.read_text()), out_md.read_text(), proc.stdout


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_shuffle_array_sweeps_partition_counts(tmp_path):
    """``--data array``: dg.shuffle_array against Dask's array shuffle on the same records at
    each count, every output checked to hold every record once, and dg's growth judged."""
    args = ["--data", "array", "--record-bytes", "64", "--gib", str(4 / 1024)]
    args += ["--partitions", "2,8", "--methods", "gpudirect,tasks", "--repeat", "1"]
    result, markdown, stdout = _bench(args, tmp_path)
    assert "dg.shuffle_array(arr)" in stdout

    assert [s["partitions"] for s in result["sweep"]] == [2, 8]
    for made in result["sweep"]:
        data = made["data"]
        assert (data["kind"], data["data"], data["rows"]) == ("NumPy", "array", (4 << 20) // 64)
        assert data["bytes"] == 4 << 20
    by = {(r["key"], r["partitions"]): r for r in result["records"]}
    assert sorted(by) == [("gpudirect", 2), ("gpudirect", 8), ("tasks", 2), ("tasks", 8)]
    for rec in by.values():
        assert rec["status"] == "ok", rec
        assert "the sum of their numbers and the sum of all values checked" in rec["note"], rec
    assert all("shuffle: split" in p for p in by["gpudirect", 8]["phases"])

    (check,) = result["checks"]
    growth = by["gpudirect", 8]["seconds"] / by["gpudirect", 2]["seconds"]
    assert check["check"].startswith("dg.shuffle_array(arr): time at 8 partitions")
    assert check["ratio"] == pytest.approx(growth) and check["target"] == 4.0
    assert "| partitions | dg.shuffle_array(arr) | arr.shuffle(groups, axis=0) |" in markdown
    assert "the same 0.004 GB array cut into 2, 8 partitions" in markdown


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_shuffle_array_of_numbers(tmp_path):
    """8-byte records make a 1-d array; one count compares dg with Dask and the raw transfer."""
    args = ["--data", "array", "--record-bytes", "8", "--gib", str(2 / 1024)]
    args += ["--partitions", "4", "--repeat", "1", "--raw-mib", "2"]
    result, markdown, _ = _bench(args, tmp_path)
    records = {r["key"]: r for r in result["records"]}
    assert sorted(records) == ["gpudirect", "raw", "tasks"]
    assert all(r["status"] == "ok" for r in records.values()), records
    assert result["data"]["rows"] == (2 << 20) // 8
    checks = {c["check"]: c for c in result["checks"]}
    assert checks["faster of Dask's shuffles"]["baseline"] == "tasks"
    assert "NumPy array of 0.002 GB, 262144 records (records of 1 int64" in markdown


@pytest.mark.timeout(2 * HANG_GUARD + 60)
def test_bench_shuffle_ignore_index_moves_the_columns_alone(tmp_path):
    """``--ignore-index``: dg's and Dask's shuffles drop the index, every output still holds
    every row once (the sums are checked), and by dg's ledger the shuffle moved the frame's
    four int64-wide columns alone, where by default each row's label went too (a fifth more).
    ``--no-keep-order`` beside it reaches dg.shuffle and the report says so."""
    args = ["--gib", str(2 / 1024), "--partitions", "6", "--methods", "gpudirect,tasks"]
    moved = {}
    for flag in ([], ["--ignore-index", "--no-keep-order"]):
        result, markdown, _ = _bench([*args, "--repeat", "1", *flag], tmp_path)
        assert result["options"]["ignore_index"] is bool(flag)
        assert result["options"]["keep_order"] is not bool(flag)
        assert all(r["status"] == "ok" for r in result["records"]), result["records"]
        shuffled = sum(r["bytes"] for r in result["ledger"] if r["op"] == "shuffle")
        moved[bool(flag)] = shuffled / result["data"]["bytes"]
        said = (
            "round-robin on the workers, shuffled with `ignore_index=True` and dg's with "
            "`keep_order=False`"
        ) in markdown
        assert said is bool(flag)
        assert ("shuffled with" in markdown) is bool(flag)
    assert moved[True] == pytest.approx(1.0, abs=0.02)
    assert moved[False] == pytest.approx(1.25, abs=0.02)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ignore-index"], "--ignore-index: an array's records have no index to drop"),
        (["--no-keep-order"], "--no-keep-order: an array's shuffle is a random permutation"),
        (["--methods", "gpudirect,p2p"], "--methods: unknown ['p2p']"),
        (["--methods", "rapidsmpf"], "--methods: unknown ['rapidsmpf']"),
        (["--record-bytes", "12"], "12: use a multiple of 8"),
    ],
)
def test_bench_shuffle_array_refuses_what_it_cannot_run(args, says):
    """Dask's array shuffle is a task graph and RapidsMPF shuffles tables: asking for either
    on an array, or for records that are not whole int64s, is a usage error."""
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    result = CliRunner().invoke(shuffle, ["--target", "host", "--data", "array", *args])
    assert result.exit_code == 2 and says in result.output, result.output


@pytest.mark.parametrize(
    ("given", "says"),
    [("", "--methods: none given"), ("gpudirect,tasks,gpudirect", "gpudirect given twice")],
)
def test_bench_methods_empty_or_twice_are_refused(given, says):
    """An empty list said 'rapidsmpf: runs on GPU workers only'; a method twice ran twice and
    left the progress bar short."""
    from click.testing import CliRunner

    from dask_gpudirect.bench.shuffle import shuffle

    result = CliRunner().invoke(shuffle, ["--target", "host", "--methods", given])
    assert result.exit_code == 2 and says in result.output, result.output


def test_ctrl_c_between_runs_keeps_the_runs_that_finished():
    """Ctrl-C as the release after a run waits: that run and those before it are the method's
    record (the record said "not run, interrupted", every finished run lost)."""
    from dask_gpudirect.bench import timing

    releases = []

    def release_then_ctrl_c() -> None:
        releases.append(None)
        if len(releases) == 2:
            raise KeyboardInterrupt

    def run_once() -> dict:
        return {"seconds": 0.5, "note": ""}

    try:  # a plain KeyboardInterrupt would end pytest's whole session: caught here
        timing._measure("m", run_once, 10**9, 1, 5, 600, release_then_ctrl_c)
    except KeyboardInterrupt as exc:
        interrupted = exc
    assert isinstance(interrupted, timing._Interrupted), repr(interrupted)
    record = interrupted.record
    assert record["runs"] == [0.5, 0.5] and record["status"] == "ok"
    assert record["stopped"] == "interrupted after run 2"


def test_an_interrupted_bench_exits_130(tmp_path):
    """As a shell reports a command Ctrl-C stopped, so that ``bench ... && next`` stops (it
    exited 0); what was measured is written first."""
    from dask_gpudirect.bench.common import finish

    result = {"device": "CPU", "records": [], "interrupted": True}
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as info:
        finish(result, "host", lambda r: None, (str(out), None, lambda r: "", None))
    assert info.value.code == 130
    assert json.loads(out.read_text())["interrupted"] is True


@pytest.mark.parametrize(
    ("status", "note", "fails"),
    [
        ("timed out", "no run finished within its budget of 1 s", True),
        ("not run", "--time-limit reached", True),
        ("error", "boom", True),
        ("not run", "needs two workers", False),  # cannot run here: nothing was left out
    ],
)
def test_a_method_that_timed_out_fails_the_run(tmp_path, status, note, fails):
    """bench shuffle and bench etl (both end in ``finish``) exited 0 where a method timed out
    or found no time left under --time-limit, as if all was measured (bench scale exits 1);
    the table is written and printed first."""
    from dask_gpudirect.bench.common import finish

    printed = []
    result = {
        "device": "CPU",
        "records": [_ok("gpudirect", 1.0), _record("tasks", status, note=note)],
    }
    out = tmp_path / "r.json"
    outputs = (str(out), None, lambda r: "", None)
    if not fails:
        finish(result, "host", printed.append, outputs)
    else:
        with pytest.raises(SystemExit) as info:
            finish(result, "host", printed.append, outputs)
        assert info.value.code not in (0, None), info.value.code
        assert "1 measurement(s) failed or timed out" in str(info.value.code)
    assert printed and json.loads(out.read_text())["records"][1]["status"] == status


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_shuffle_places_partitions_dealt_or_in_blocks(tmp_path):
    """``--placement``: the input partitions dealt to the workers in turn (the default, as
    Distributed's queuing spreads tasks) or in blocks of consecutive ones, a block a worker
    (where an output's rows from one worker join into one run); the JSON and the report say
    which, and the shuffle's outputs are checked either way."""
    from dask_gpudirect.bench.shuffle import holder

    assert [holder(i, 6, 2, "dealt") for i in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [holder(i, 6, 2, "blocks") for i in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [holder(i, 7, 3, "blocks") for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    args = ["--gib", str(1 / 1024), "--partitions", "6", "--methods", "gpudirect", "--repeat", "1"]
    result, markdown, _ = _bench([*args, "--placement", "blocks"], tmp_path)
    assert result["options"]["placement"] == result["data"]["placement"] == "blocks"
    assert sorted(result["data"]["partitions_per_worker"].values()) == [3, 3]
    assert "6 partitions placed in blocks of consecutive ones on the workers" in markdown
    assert all(r["status"] == "ok" for r in result["records"]), result["records"]
    args[args.index("6")] = "4,6"  # a sweep's report says it too
    result, markdown, _ = _bench([*args, "--placement", "blocks"], tmp_path)
    assert [s["data"]["placement"] for s in result["sweep"]] == ["blocks", "blocks"]
    assert "4, 6 partitions, placed in blocks of consecutive ones on the workers" in markdown


# --- what the reports say: only what was measured, as measured -------------------------------


def _shuffle(cmd_prefix: list[str], args: list[str], tmp_path) -> tuple[int, dict, str, str]:
    out_json, out_md = tmp_path / "out.json", tmp_path / "out.md"
    cmd = [*cmd_prefix, "shuffle", "--target", "host", "--workers", "2", *args]
    cmd += ["--no-progress", "--json", str(out_json), "--markdown", str(out_md)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert out_json.exists(), proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc.returncode, json.loads(out_json.read_text()), out_md.read_text(), proc.stderr


@pytest.mark.timeout(HANG_GUARD + 60)
def test_a_sweeps_table_marks_figures_of_fewer_runs_than_its_note_says(tmp_path):
    """The sweep's table says "Seconds: the median warm run"; a record of the first (cold) run
    only (--repeat 0 here; a budget or Ctrl-C after one run does the same) must say so, as the
    one-count table's footnote does (it showed the cold run as if it were the warm median)."""
    args = ["--gib", str(1 / 1024), "--partitions", "2,4", "--methods", "gpudirect"]
    code, result, md, err = _shuffle(
        [sys.executable, "-m", "dask_gpudirect.bench"], [*args, "--repeat", "0"], tmp_path
    )
    assert code == 0, err[-6000:]
    recs = [r for r in result["records"] if r["key"] == "gpudirect"]
    assert [r["status"] for r in recs] == ["ok", "ok"], recs
    assert all(r["stopped"] == "the first (cold) run only" for r in recs), recs
    rows = [line for line in md.splitlines() if line.startswith(("| 2 |", "| 4 |"))]
    assert len(rows) == 2, md
    assert all(row.rstrip(" |").endswith("[1]") for row in rows), md
    assert "[1] the first (cold) run only" in md, md


def _ok(key: str, seconds: float, partitions: int | None = None) -> dict:
    rec = _summarise(key, [{"seconds": seconds}] * 3, 10**9, 2, "", "")
    return rec if partitions is None else {**rec, "partitions": partitions}


def test_a_sweeps_growth_is_over_the_fewest_partitions_or_not_shown():
    """ "x: the time over the method's own time at the fewest partitions": where that count
    failed, the next count's cell said 1.0x (over itself) while the check said "not run"."""
    records = [
        {**_record("gpudirect", "error", note="boom"), "partitions": 8},
        _ok("gpudirect", 2.0, 64),
        _ok("gpudirect", 4.0, 512),
    ]
    checks = checks_of(records, "host", 2)
    assert checks[0]["result"] == "not run"
    result = {"records": records, "target": "host", "options": {}, "checks": checks}
    md = markdown(result | {"device": "CPU", "date": "-", "command": "-"})
    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "error" in rows["| 8"], md
    for n in ("| 64", "| 512"):
        assert rows[n].endswith("GB/s, - |"), md  # no growth over a count that did not run


def test_a_small_growth_is_not_shown_as_zero():
    """A time 0.04 of the fewest partitions' was shown as "0.0x" in the sweep's growth column;
    every report's ratios are written by one helper."""
    from dask_gpudirect.bench.scale_report import table
    from dask_gpudirect.bench.tables import ratio_text

    assert [ratio_text(v) for v in (0.04, 0.004, 1.0, 3.14159)] == [
        "0.04x",
        "0.004x",
        "1.00x",
        "3.14x",
    ]
    records = [_ok("gpudirect", 100.0, 8), _ok("gpudirect", 4.0, 64)]
    result = {"records": records, "target": "host", "options": {}, "device": "CPU"}
    md = markdown(result | {"checks": checks_of(records, "host", 2), "date": "-", "command": "-"})
    (row,) = [line for line in md.splitlines() if line.startswith("| 64 |")]
    assert row.endswith("GB/s, 0.04x |"), md
    # bench scale's "dg vs faster Dask shuffle" column: 0.004 was "0.00x"
    figures = {"ratio": 0.004, "ratio_baseline": "tasks"}
    figures |= {k: None for k in ("dg", "raw", "tasks", "p2p")}
    row = {"gpus": 2, "shuffle": {"status": "ok", "note": "", "figures": figures}}
    cells, _ = table({"rows": [row]})
    assert cells[0][-1] == "0.004x tasks", cells


def test_a_figure_of_one_cold_run_is_set_against_first_runs():
    """Task shuffle's cold run alone (its budget took one run) against dg's warm median passed
    dg's target on a first run's one-off costs: 5x where the first runs say 0.5x. Where either
    has no warm run, both first runs are compared, and the ratio says so; the sweep's growth
    too."""
    dg = _summarise("gpudirect", [{"seconds": s} for s in (1.0, 0.1, 0.1)], 10**9, 2, "", "")
    tasks = _summarise("tasks", [{"seconds": 0.5}], 10**9, 2, "", "")
    (check,) = checks_of([dg, tasks], "device", 2)
    assert check["ratio"] == pytest.approx(0.5) and check["result"] == "miss", check
    result = {"records": [dg, tasks], "target": "device", "options": {}, "checks": [check]}
    md = markdown(result | {"device": "GPU", "gpus": 2, "date": "-", "command": "-"})
    assert "| faster of Dask's shuffles (tasks) | 0.50x (first runs) | >= 3.00x | miss |" in md
    (warm,) = checks_of([dg, _ok("tasks", 0.5)], "device", 2)  # both warm: the medians
    assert warm["ratio"] == pytest.approx(5.0) and "cold" not in warm
    sweep = [{**dg, "partitions": 8}, {**tasks, "key": "gpudirect", "partitions": 64}]
    (growth,) = checks_of(sweep, "host", 2)
    assert growth["ratio"] == pytest.approx(0.5) and growth["cold"], growth
    md = markdown(
        {
            "records": sweep,
            "target": "host",
            "options": {},
            "checks": [growth],
            "device": "CPU",
            "date": "-",
            "command": "-",
        }
    )
    assert "GB/s, 0.50x (first runs) [1] |" in md, md


def test_the_faster_of_dasks_shuffles_is_chosen_by_the_figures_the_ratio_sets():
    """Where dg has its first (cold) run only, its ratio is of first runs; the faster of Dask's
    shuffles was chosen by their warm medians, though, so the ratio was over the one slower by
    first runs: 4x, pass, where the faster first run (P2P's) says 2x, miss."""
    dg = _summarise("gpudirect", [{"seconds": 1.0}], 10**9, 2, "", "")
    tasks = _summarise("tasks", [{"seconds": s} for s in (4.0, 1.0, 1.0)], 10**9, 2, "", "")
    p2p = _summarise("p2p", [{"seconds": s} for s in (2.0, 1.5, 1.5)], 10**9, 2, "", "")
    (check,) = checks_of([dg, tasks, p2p], "device", 2)
    assert check["baseline"] == "p2p" and check["cold"], check
    assert check["ratio"] == pytest.approx(2.0) and check["result"] == "miss", check
    (warm,) = checks_of([_ok("gpudirect", 0.25), tasks, p2p], "device", 2)  # all warm: medians
    assert warm["baseline"] == "tasks" and warm["ratio"] == pytest.approx(4.0), warm


@pytest.mark.parametrize("status", ["not run", "error"])
def test_no_verdict_on_the_faster_of_dasks_shuffles_where_one_did_not_run(status):
    """dg against "the faster of Dask's shuffles" passed on the task shuffle alone where P2P
    was not run (--time-limit) or failed: P2P may have been the faster."""
    records = [
        _ok("gpudirect", 0.1),
        _ok("tasks", 1.0),
        _record("p2p", status, note="--time-limit reached"),
    ]
    (check,) = checks_of(records, "device", 2)
    assert check["check"] == "faster of Dask's shuffles" and check["baseline"] == "tasks"
    assert check["ratio"] == pytest.approx(10.0)  # measured against the task shuffle: shown
    assert check["result"] == "not run", check
    # both ran: judged as before
    (both,) = checks_of([*records[:2], _ok("p2p", 2.0)], "device", 2)
    assert both["result"] == "pass"


@pytest.mark.parametrize("budget", [0.0, -3.0])
def test_a_method_left_no_time_is_not_run(budget):
    """--time-limit's budget is taken after the input is made: where making it used what was
    left, the method was "timed out" with a bound of "< -0.250 GB/s" (or a TypeError, an error
    record and a failed run, at exactly 0 s)."""
    release = threading.Event()

    def run_once() -> dict:
        release.wait(30)
        return {"seconds": 1.0, "note": ""}

    try:
        rec, timed_out = timing._measure("gpudirect", run_once, 10**9, 2, 1, budget, lambda: None)
    finally:
        release.set()
    assert rec["status"] == "not run" and not timed_out, rec
    assert "GB/s" not in rec["note"], rec


INJECT = """
import sys

if __name__ == "__main__":
    from dask_gpudirect.bench import shuffle

    def ledger(client):
        raise KeyboardInterrupt  # Ctrl-C as dg's ledger is read, after its runs

    shuffle._ledger = ledger
    from dask_gpudirect.bench import bench

    bench(sys.argv[1:])
"""


@pytest.mark.timeout(HANG_GUARD + 60)
def test_ctrl_c_as_dgs_ledger_is_read_keeps_dgs_runs(tmp_path):
    """The ledger is read after dg.shuffle's runs: Ctrl-C there made dg's record "not run,
    interrupted", its measured runs lost. The Ctrl-C is raised by a stand-in for the ledger's
    read (a signal cannot be timed to land in it)."""
    script = tmp_path / "inject.py"
    script.write_text(textwrap.dedent(INJECT))
    args = ["--gib", str(1 / 1024), "--partitions", "4", "--methods", "gpudirect,tasks"]
    code, result, md, err = _shuffle(
        [sys.executable, str(script)], [*args, "--repeat", "1"], tmp_path
    )
    assert code == 130, err[-6000:]
    by = {r["key"]: r for r in result["records"]}
    assert by["gpudirect"]["status"] == "ok" and len(by["gpudirect"]["runs"]) == 2, by
    assert (by["tasks"]["status"], by["tasks"]["note"]) == ("not run", "interrupted")
