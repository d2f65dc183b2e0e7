"""``dask-gpudirect bench etl`` end to end on the host target, at a tiny size.

Run as a subprocess, as a user would: the command writes its Parquet files, starts and stops its
own cluster, and must not meet the session clusters of this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from pandas.testing import assert_frame_equal
from util import GC, HANG_GUARD, PLACED_PHASES, clear_ledgers, compute, interrupt_at

from dask_gpudirect import ledger_report
from dask_gpudirect.bench.datasets import dataset
from dask_gpudirect.bench.etl import _pipeline, etl, read_bytes
from dask_gpudirect.bench.etl_report import checks_of, disagreeing, sweep

METHODS = ["gpudirect", "combine", "tasks", "p2p", "dask-gpudirect", "dg-dask"]
#: dg.read_parquet's planning phases, in order (``dask_gpudirect.collections.last_phases``).
READ_PHASES = ("survey", "footers", "meta", "partitions")
#: The group-bys of a sweep of two key counts (``--keys 16,256``); "scan" is the read alone.
QUERIES = ["2^4 keys", "2^8 keys", "unique-key"]
SCAN_METHODS = ["gpudirect", "tasks"]  # on the host target


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_etl_host(tmp_path):
    pytest.importorskip("matplotlib")
    out = {ext: tmp_path / f"etl.{ext}" for ext in ("json", "md", "png")}
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "etl", "--target", "host"]
    cmd += ["--dir", str(tmp_path / "data"), "--gib", str(4 / 1024), "--files", "8"]
    cmd += ["--keys", "256,16", "--repeat", "1", "--no-progress"]
    cmd += ["--json", str(out["json"]), "--markdown", str(out["md"]), "--plot", str(out["png"])]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert "bench etl" in proc.stdout and "checks" in proc.stdout

    result = json.loads(out["json"].read_text())
    assert result["benchmark"] == "etl" and result["target"] == "host"
    data = result["data"]
    assert data["files"] == 8 and data["rows"] == 8 * ((4 << 20) // 40 // 8)
    assert sorted(os.listdir(tmp_path / "data")) == ["_bench.json"] + [
        f"part-{i:03d}.parquet" for i in range(8)
    ]

    by = {(r["query"], r["key"]): r for r in result["records"]}
    runs = [(q, m) for q in QUERIES for m in METHODS] + [("scan", m) for m in SCAN_METHODS]
    assert sorted(by) == sorted(runs)
    paths = sorted(str(p) for p in (tmp_path / "data").glob("*.parquet"))
    for rec in by.values():
        assert rec["status"] == "ok", rec
        # GB/s of the bytes the query reads (four columns of the files'), not the files' bytes
        key = result["queries"][rec["query"]]
        assert rec["bytes"] == read_bytes(paths, [key, "x", "y", "z"]) < data["bytes"], rec
        assert len(rec["runs"]) == 2 and rec["seconds"] > 0 and rec["gbps"] > 0, rec
        assert "->" in rec["note"], rec  # input -> output partitions
    # where dg's time went: each phase waited for, inside the total (combine's partial sums run
    # in the read's tasks, Dask fuses them, so its shuffle too starts while they run; the
    # group-by is the shuffle's then=, run by each stage on the outputs it builds)
    steps = "read, shuffle and group-by"
    for query, method in [(q, m) for q in QUERIES for m in ("gpudirect", "combine")]:
        rec = by[query, method]
        for seconds, phases in zip(rec["runs"], rec["phases"], strict=True):
            inside = ("shuffle: ", "client: ", "plan: ")
            pipeline = {k: s for k, s in phases.items() if not k.startswith(inside)}
            assert list(pipeline) == ["plan", steps], rec
            assert 0 < sum(pipeline.values()) <= seconds, rec
            # the read's planning, phase by phase, inside its time
            planning = {k: s for k, s in phases.items() if k.startswith("plan: ")}
            assert list(planning) == [f"plan: {p}" for p in READ_PHASES], rec
            assert sum(planning.values()) <= pipeline["plan"], rec
            # and the stage's own phases, measured on the workers inside the shuffle's time
            # (the stage waited for its inputs, read as it ran: the read is inside the shuffle)
            stage = {k: s for k, s in phases.items() if k.startswith("shuffle: ")}
            wanted = {"wait for inputs", "split", "combine", "then", "keep"}
            assert {f"shuffle: {p}" for p in wanted} <= set(stage), rec
            assert 0 < stage["shuffle: then"] <= pipeline[steps], rec
            assert max(stage.values()) <= pipeline[steps], rec
            # and the client's, one after another inside it (no wait for the inputs first)
            client = {k: s for k, s in phases.items() if k.startswith("client: ")}
            assert list(client) == [f"client: {p}" for p in (*PLACED_PHASES, GC)], rec
            assert sum(client.values()) - client[f"client: {GC}"] <= pipeline[steps]
        assert by[query, "tasks"]["phases"] == [{}, {}]  # Dask's pipeline is one graph
        # which engine moved the bytes, where the package's exchange did (pandas: its own)
        for method in ("gpudirect", "combine", "dask-gpudirect", "dg-dask"):
            assert by[query, method]["note"].endswith(", engine distributed"), by[query, method]
        assert "engine" not in by[query, "tasks"]["note"]
        # and where the exchange under Dask's own group-by spent the time, inside the run
        for dasks in (by[query, "dask-gpudirect"], by[query, "dg-dask"]):
            for seconds, phases in zip(dasks["runs"], dasks["phases"], strict=True):
                assert {"shuffle: split", "shuffle: combine", "client: stages"} <= set(phases)
                assert max(phases.values()) <= seconds, dasks
        # Dask's group-by of dg's read: dg's partitions in, as many out, as dg's pipeline
        assert by[query, "dg-dask"]["note"] == by[query, "gpudirect"]["note"]
    for phases in by["scan", "gpudirect"]["phases"]:  # the read alone, no shuffle
        assert [k for k in phases if not k.startswith("plan: ")] == [
            "plan",
            "read",
            "read: longest task",
        ], phases
        assert 0 < phases["read: longest task"] <= phases["read"], phases
    assert result["queries"] == {
        "2^4 keys": "keys_16",
        "2^8 keys": "keys_256",
        "unique-key": "unique",
        "scan": "keys_16",
    }
    groups_of = {"2^4 keys": 16, "2^8 keys": 256, "unique-key": data["rows"], "scan": data["rows"]}
    for query, groups in groups_of.items():
        fingerprints = result["fingerprints"][query]
        assert sorted(fingerprints) == sorted(SCAN_METHODS if query == "scan" else METHODS)
        for fp in fingerprints.values():  # every row counted once, every key in one partition
            assert fp["z"] == data["z_sum"] and fp["groups"] == groups, (query, fp)

    checks = {c["check"]: c for c in result["checks"]}
    for query in QUERIES:
        agree = checks[
            f"{query}: combine, dask-gpudirect, dg-dask, gpudirect, p2p, tasks give one result"
        ]
        assert agree["result"] == "pass"
        for method, name in [
            ("gpudirect", "dg"),
            ("combine", "dg, summed before the shuffle"),
            ("dask-gpudirect", "Dask's group-by on dg's shuffle"),
            ("dg-dask", "Dask's group-by on dg's read and shuffle"),
        ]:
            speedup = checks[f"{query}: {name}'s speed-up over Dask's task shuffle"]
            ratio = by[query, "tasks"]["seconds"] / by[query, method]["seconds"]
            assert speedup["ratio"] == pytest.approx(ratio)
            assert speedup["target"] is None and speedup["result"] == "-"  # targets: GPUs only
    assert checks["scan: gpudirect, tasks give one result"]["result"] == "pass"
    read = checks["scan: dg's speed-up over Dask's read_parquet"]
    assert read["ratio"] == pytest.approx(
        by["scan", "tasks"]["seconds"] / by["scan", "gpudirect"]["seconds"]
    )
    markdown = out["md"].read_text()
    dasks_rows = [line for line in markdown.splitlines() if "shuffle_method='gpudirect')" in line]
    assert len(dasks_rows) == 2 * len(QUERIES)  # Dask's read and dg's, each query
    assert all("; last run: its exchange (shuffle: " in r for r in dasks_rows)
    assert (
        "| unique-key | dg.read_parquet -> groupby(split_out=N, shuffle_method='gpudirect') |"
        in (markdown)
    )
    assert "| 2^8 keys | dd.read_parquet -> groupby(split_out=N, shuffle_method='p2p') |" in (
        markdown
    )
    # the sweep: each group-by's seconds by its key's distinct values, one column per method
    sweep = markdown[markdown.index("Seconds by distinct keys") :].splitlines()[2:7]
    assert sweep[0] == (
        "| query | distinct keys | dg, s | dg, summed before the shuffle, s "
        "| Dask's task shuffle, s | Dask's P2P shuffle, s | Dask's group-by on dg's shuffle, s "
        "| Dask's group-by on dg's read and shuffle, s |"
    )
    for line, query in zip(sweep[2:], QUERIES, strict=True):
        cells = line.strip("| ").split(" | ")
        assert cells[:2] == [query, str(groups_of[query])], line
        seconds = [by[query, m]["seconds"] for m in METHODS]
        assert cells[2:] == [f"{s:.3f}" for s in seconds], line
    assert "| scan | dd.read_parquet(...).persist() |" in markdown
    assert "cudf-polars" not in markdown and "rapidsmpf" not in markdown  # GPU-only methods
    assert out["png"].stat().st_size > 0


def test_data_folder_of_other_files_is_refused_not_emptied(tmp_path):
    """``--dir`` of a user's files: refused, every file kept (they were deleted, ``--dir .``
    the working directory); a folder the bench wrote is rewritten for another dataset, and a
    file the user put there stays."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "important.txt").write_text("precious")
    with pytest.raises(click.ClickException, match="holds files the bench did not write"):
        dataset(str(tmp_path / "mine"), "etl", 1 / 1024, 2, keys=[16])
    assert (tmp_path / "mine" / "important.txt").read_text() == "precious"
    ours = tmp_path / "ours"
    dataset(str(ours), "etl", 1 / 1024, 3, keys=[16])
    (ours / "notes.txt").write_text("mine")
    paths, _ = dataset(str(ours), "etl", 1 / 1024, 2, keys=[16])
    assert sorted(os.listdir(ours)) == ["_bench.json", "notes.txt", "part-000.parquet",
                                        "part-001.parquet"]  # fmt: skip
    assert paths == [str(ours / "part-000.parquet"), str(ours / "part-001.parquet")]


def test_sizes_past_what_can_be_written_are_said_not_a_traceback(tmp_path):
    """``--keys`` past int64 is a usage error; ``--gib`` past the machine's memory says the data
    cannot be written (both ended in a traceback)."""
    too_many = CliRunner().invoke(etl, ["--dir", str(tmp_path / "a"), "--keys", str(2**64)])
    assert too_many.exit_code == 2 and "counts go up to 2^62" in too_many.output
    huge = ["--target", "host", "--dir", str(tmp_path / "b"), "--gib", "100000", "--files", "1"]
    result = CliRunner().invoke(etl, huge)
    assert result.exit_code == 1, result.output
    assert "Error: cannot write the data (MemoryError" in result.output


def test_combine_shuffles_partial_sums_not_rows(tcp, tmp_path):
    """``combine`` sums each read partition by key before the shuffle, as Dask's and
    cudf-polars' group-bys do: it moves a row per key and partition, not every row, and sums to
    the same result as the plain pipeline."""
    paths, data = dataset(str(tmp_path), "etl", 4 / 1024, 8, keys=[16])
    moved, results = {}, {}
    for method in ("gpudirect", "combine"):
        clear_ledgers(tcp)
        _, out, _, _ = _pipeline(tcp, method, paths, "keys_16", "2^4 keys")
        results[method] = compute(tcp, out).sort_index()
        moved[method] = ledger_report.records(tcp).query("op == 'shuffle'")["bytes"].sum()
    assert len(results["combine"]) == 16 and results["combine"]["z"].sum() == data["z_sum"]
    assert_frame_equal(results["combine"], results["gpudirect"])
    assert 0 < moved["combine"] < moved["gpudirect"] / 100


def _result(fingerprints: dict, z_sum: int, seconds: dict, queries=QUERIES) -> dict:
    records = [
        {"key": key, "query": query, "status": "ok", "seconds": s}
        for query in queries
        for key, s in seconds.items()
    ]
    return {
        "queries": {query: "key" for query in queries},
        "records": records,
        "fingerprints": {query: fingerprints for query in queries},
        "data": {"z_sum": z_sum},
    }


def _shuffle_checks(*args) -> list[dict]:
    """The checks of the two shuffle queries (the scan, not in these results, left out)."""
    return [c for c in checks_of(*args) if not c["check"].startswith("scan:")]


def test_checks_catch_a_wrong_result_and_judge_the_gpu_target():
    good = {"groups": 10, "z": 500, "kz": 7000, "x": 1.5}
    split = {**good, "groups": 11}  # one key in two output partitions
    rounding = {**good, "x": 1.5 * (1 + 1e-12)}  # float sums added in another order
    seconds = {"gpudirect": 1.0, "tasks": 5.0}

    ok = _shuffle_checks(_result({"gpudirect": good, "tasks": rounding}, 500, seconds), "device", 2)
    assert [(c["result"], c["target"]) for c in ok] == [("pass", None), ("pass", 4.0)] * len(
        QUERIES
    )
    assert ok[1]["ratio"] == pytest.approx(5.0)

    wrong = _shuffle_checks(_result({"gpudirect": split, "tasks": good}, 500, seconds), "device", 2)
    assert wrong[0]["result"] == "miss"
    assert wrong[1]["result"] == "wrong result"  # no speed-up judged of a wrong result
    assert disagreeing(wrong)  # which fails the run
    lost = _shuffle_checks(_result({"gpudirect": good, "tasks": good}, 501, seconds), "device", 2)
    assert lost[0]["result"] == "miss"  # both agree, but not with the data written
    assert lost[1]["result"] == "wrong result" and disagreeing(lost)
    assert not disagreeing(ok)
    slow = _shuffle_checks(
        _result({"gpudirect": good}, 500, {"gpudirect": 2.0, "tasks": 5.0}), "device", 2
    )
    assert slow[1]["result"] == "miss"
    one_gpu = _shuffle_checks(_result({"gpudirect": good}, 500, seconds), "device", 1)
    assert one_gpu[1]["target"] is None and one_gpu[1]["result"] == "-"


def test_a_figure_of_one_cold_run_is_set_against_first_runs():
    """cudf-polars' cold run alone against dg's warm median judged dg's speed-up on a first
    run's one-off costs; where either has no warm run, both first runs are compared."""
    from dask_gpudirect.bench.etl_report import markdown
    from dask_gpudirect.bench.timing import _summarise

    good = {"groups": 10, "z": 500, "kz": 7000, "x": 1.5}
    result = _result({"gpudirect": good, "polars": good}, 500, {})
    for query in result["queries"]:
        dg = _summarise("gpudirect", [{"seconds": s} for s in (4.0, 1.0, 1.0)], 10**9, 2, "", "")
        polars = _summarise("polars", [{"seconds": 2.0}], 10**9, 2, "", "")
        result["records"] += [{**dg, "query": query}, {**polars, "query": query}]
    checks = {c["check"]: c for c in checks_of(result, "device", 2)}
    speedup = checks["2^4 keys: dg's speed-up over cudf-polars DaskEngine"]
    assert (speedup["ratio"], speedup["result"]) == (0.5, "miss"), speedup  # was 2.0, pass
    assert speedup["cold"]
    result |= {"checks": list(checks.values()), "target": "device", "options": {}}
    md = markdown(result | {"device": "GPU", "date": "-", "command": "-"})
    assert "speed-up over cudf-polars DaskEngine | 0.50x (first runs) | >= 1.00x | miss |" in md
    assert "| 2^4 keys | 10 | 1.000 | 2.000 | 0.50x (first runs) |" in md, md


def test_a_result_written_before_the_key_sweep_is_still_judged_and_written():
    """Results committed before ``--keys`` took a sweep name no queries: their group-by by a key
    of many repeats was ``many-keys``, and they still render, with no sweep table."""
    good = {"groups": 10, "z": 500, "kz": 7000, "x": 1.5}
    seconds = {"gpudirect": 1.0, "tasks": 5.0}
    result = _result({"gpudirect": good, "tasks": good}, 500, seconds, ["many-keys", "unique-key"])
    del result["queries"]
    checks = {c["check"]: c for c in checks_of(result, "device", 2)}
    assert checks["many-keys: dg's speed-up over Dask's task shuffle"]["ratio"] == 5.0
    assert checks["unique-key: gpudirect, tasks give one result"]["result"] == "pass"
    assert sweep(result) == ([], [])


def test_both_engines_are_judged_against_tasks_and_cudf_polars():
    good = {"groups": 10, "z": 500, "kz": 7000, "x": 1.5}
    seconds = {"gpudirect": 2.0, "rapidsmpf": 1.0, "polars": 1.5, "tasks": 8.0}
    result = _result(dict.fromkeys(seconds, good), 500, seconds)
    checks = {c["check"]: c for c in checks_of(result, "device", 2)}
    for query in QUERIES:
        assert checks[f"{query}: gpudirect, polars, rapidsmpf, tasks give one result"][
            "result"
        ] == ("pass")
        polars = checks[f"{query}: dg's speed-up over cudf-polars DaskEngine"]
        assert (polars["ratio"], polars["target"], polars["result"]) == (0.75, 1.0, "miss")
        ours = checks[f"{query}: dg on RapidsMPF's speed-up over cudf-polars DaskEngine"]
        assert (ours["ratio"], ours["result"]) == (1.5, "pass")
        tasks = checks[f"{query}: dg on RapidsMPF's speed-up over Dask's task shuffle"]
        assert (tasks["ratio"], tasks["target"], tasks["result"]) == (8.0, 4.0, "pass")


def test_the_scan_is_judged_against_dask_and_cudf_polars_on_any_gpu_count():
    """The read alone: dg at least as fast as Dask's read_parquet and cudf-polars' scan, on one
    GPU as on many (no exchange is involved); no target on the host target."""
    good = {"groups": 1000, "z": 500, "kz": 7000, "x": 1.5}
    seconds = {"gpudirect": 2.0, "polars": 1.0, "tasks": 3.0}
    result = _result(dict.fromkeys(seconds, good), 500, seconds, ["scan"])
    checks = {c["check"]: c for c in checks_of(result, "device", 1)}
    assert checks["scan: gpudirect, polars, tasks give one result"]["result"] == "pass"
    dask = checks["scan: dg's speed-up over Dask's read_parquet"]
    assert (dask["ratio"], dask["target"], dask["result"]) == (1.5, 1.0, "pass")
    polars = checks["scan: dg's speed-up over cudf-polars DaskEngine"]
    assert (polars["ratio"], polars["target"], polars["result"]) == (0.5, 1.0, "miss")
    host = {c["check"]: c for c in checks_of(result, "host", 2)}
    assert host["scan: dg's speed-up over Dask's read_parquet"]["target"] is None
    assert not any("rapidsmpf" in name for name in checks if name.startswith("scan:"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "gpudirect,spark"], "--methods: unknown ['spark']"),
        (["--methods", "polars", "--target", "host"], "--methods polars: runs on GPU workers only"),
        (["--target", "device"], "needs a GPU"),
        (["--files", "0"], "--files"),
        (["--keys", "16,16"], "--keys"),
        (["--keys", "0"], "--keys"),
    ],
)
def test_bad_options_are_named(tmp_path, args, message):
    """Refused before any file is written or cluster started."""
    from dask_gpudirect.cuda import gpu_count

    if gpu_count() and "device" in args:
        pytest.skip("a GPU is visible here")
    result = CliRunner().invoke(etl, ["--dir", str(tmp_path / "data"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "data").exists()


@pytest.mark.timeout(HANG_GUARD + 60)
def test_an_interrupted_run_names_every_method_it_did_not_measure(tmp_path):
    """Ctrl-C (or ``timeout -s INT``) in the middle: the tables kept what was measured and left
    out the methods not reached, cudf-polars' among them on a GPU, as if never asked for; each is
    now a "not run" row saying the run was interrupted, and the command exits 130."""
    out = {ext: tmp_path / f"etl.{ext}" for ext in ("json", "md")}
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", "etl", "--target", "host"]
    cmd += ["--dir", str(tmp_path / "data"), "--gib", str(1 / 1024), "--files", "4"]
    cmd += ["--keys", "16", "--repeat", "1", "--no-progress"]
    cmd += ["--json", str(out["json"]), "--markdown", str(out["md"])]
    code, log = interrupt_at(cmd, "2^4 keys: measuring combine")  # once its second method starts
    assert code == 130, log[-4000:]

    result = json.loads(out["json"].read_text())
    assert result["interrupted"] is True
    by = {(r["query"], r["key"]): r for r in result["records"]}
    planned = [("2^4 keys", m) for m in METHODS] + [("unique-key", m) for m in METHODS]
    planned += [("scan", m) for m in SCAN_METHODS]
    assert sorted(by) == sorted(planned)  # every asked-for method has its row
    assert by["2^4 keys", "gpudirect"]["status"] == "ok"
    untouched = [by[q, m] for q, m in planned[len(METHODS) :]]  # the queries after the first
    assert {(r["status"], r["note"]) for r in untouched} == {("not run", "interrupted")}
    markdown = out["md"].read_text()
    rows = [r for r in markdown.splitlines() if r.startswith(("| unique-key |", "| scan |"))]
    assert len(rows) == len(untouched), markdown
    assert all(" not run [" in r for r in rows), markdown
    assert "] interrupted" in markdown


_POLARS_FAILS = """
import sys, types
if __name__ == "__main__":
    for name in ("cudf_polars", "cudf_polars.engine", "cudf_polars.engine.dask",
                 "cudf_polars.engine.hardware_binding"):
        sys.modules[name] = types.ModuleType(name)
    class DaskEngine:
        def __init__(self, **kw):
            raise RuntimeError("cudf-polars engine cannot start")
    sys.modules["cudf_polars.engine.dask"].DaskEngine = DaskEngine
    sys.modules["cudf_polars.engine.hardware_binding"].HardwareBindingPolicy = lambda **kw: None
    import dask_gpudirect.bench.etl as etl
    etl.DEVICE_ONLY = ("rapidsmpf",)  # cudf-polars let run on the host target
    etl.gpu_count = lambda: 1
    real = etl.start_cluster
    etl.start_cluster = lambda target, *a, **k: real("host", *a, **k)
    etl.etl.main(sys.argv[1:])
"""


@pytest.mark.timeout(HANG_GUARD + 60)
def test_cudf_polars_failing_first_leaves_the_dask_methods_measured(tmp_path):
    """cudf-polars runs first: its engine failing to start stopped the run, every Dask-run
    method "not run" and cudf-polars itself not named as failed; it is an error and the rest
    are measured, as when it ran last. cudf-polars needs a GPU: a stand-in whose engine fails
    to start takes its place, let run on the host target."""
    script = tmp_path / "polars_fails.py"
    script.write_text(_POLARS_FAILS)
    out = tmp_path / "etl.json"
    cmd = [sys.executable, str(script), "--target", "host", "--dir", str(tmp_path / "data")]
    cmd += ["--gib", str(1 / 1024), "--files", "2", "--keys", "16", "--repeat", "1"]
    cmd += ["--methods", "polars,gpudirect,tasks", "--no-progress", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 1, proc.stderr[-4000:]  # a failed measurement
    result = json.loads(out.read_text())
    assert "error" not in result, result.get("error")
    by = {(r["query"], r["key"]): r for r in result["records"]}
    assert {by[q, "polars"]["status"] for q in ("2^4 keys", "unique-key", "scan")} == {"error"}
    for query in ("2^4 keys", "unique-key", "scan"):
        for method in ("gpudirect", "tasks"):
            assert by[query, method]["status"] == "ok", by[query, method]
