"""``--plot`` and ``dask-gpudirect bench plot``: the committed H200 results and a real host run.

Each picture must be a PNG of a real chart, and what it draws must come from the result: the
ceilings, the measured bars and the targets of the device runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner
from util import HANG_GUARD

from dask_gpudirect.bench import bench
from dask_gpudirect.bench.plot import _read_panels, _shuffle_panels, draw

pytest.importorskip("matplotlib")

DOCS = pathlib.Path(__file__).parent.parent / "docs" / "benchmarks"
READ_JSON = DOCS / "2026-11-29-h200-read.json"
SHUFFLE_JSON = DOCS / "2026-11-29-h200-x2-shuffle.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METHODS = ["gpudirect", "tasks", "p2p", "raw"]


def assert_png(path: pathlib.Path, min_width: int) -> None:
    """A PNG file of at least ``min_width`` pixels, with more than a blank canvas in it."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 20_000, len(data)
    pixels = imread(path)
    assert pixels.shape[1] >= min_width and pixels.shape[0] >= 300, pixels.shape
    assert pixels.std() > 0.05  # bars and text, not a blank canvas


@pytest.mark.parametrize("name", [READ_JSON, SHUFFLE_JSON], ids=["read", "shuffle"])
def test_bench_plot_committed_results(tmp_path, name):
    out = tmp_path / "out" / "chart.png"  # the folder is made
    result = CliRunner().invoke(bench, ["plot", str(name), str(out)])
    assert result.exit_code == 0, result.output
    assert_png(out, min_width=800)


def test_read_chart_draws_the_ceilings_and_targets():
    result = json.loads(READ_JSON.read_text())
    warm, cold = _read_panels(result)
    gbps = {(r["key"], r["cache"]): r["gbps"] for r in result["records"]}
    assert warm["ceiling"] == gbps[("h2d-pinned", "-")]
    assert cold["ceiling"] == gbps[("dd-direct", "cold")]
    assert len(warm["rows"]) == 7 and len(cold["rows"]) == 7
    labels = [r["label"] for r in warm["rows"]]
    binary = labels.index("dg.read_binary(dir).persist()")
    assert warm["rows"][binary]["value"] == gbps[("dg-binary", "warm")]
    assert warm["rows"][binary]["kind"] == "dg"
    # 0.85x the pinned copy on the binary row; 1x tuned cuDF and 2x dask_cudf on the Parquet row
    marks = sorted((round(v, 2), row) for row, v, _ in warm["targets"])
    parquet = labels.index("dg.read_parquet(dir).persist()")
    assert marks == sorted(
        [
            (round(0.85 * gbps[("h2d-pinned", "-")], 2), binary),
            (round(1.0 * gbps[("cudf-tuned", "warm")], 2), parquet),
            (round(2.0 * gbps[("dask-default", "warm")], 2), parquet),
        ]
    )
    assert [round(v, 2) for _, v, _ in cold["targets"]] == [
        round(1.5 * gbps[("dd-direct", "cold")], 2)
    ] * 2


def test_shuffle_chart_draws_the_raw_transfer_and_both_targets():
    result = json.loads(SHUFFLE_JSON.read_text())
    (panel,) = _shuffle_panels(result)
    per_gpu = {r["key"]: r["gbps_per_gpu"] for r in result["records"]}
    assert panel["ceiling"] == per_gpu["raw"]
    assert [r["value"] for r in panel["rows"]] == [per_gpu[k] for k in METHODS]
    faster = max(per_gpu["tasks"], per_gpu["p2p"])
    assert sorted(round(v, 3) for _, v, _ in panel["targets"]) == sorted(
        [round(3 * faster, 3), round(0.5 * per_gpu["raw"], 3)]
    )
    assert all(row == 0 for row, _, _ in panel["targets"])  # on dg.shuffle's bar
    assert any("miss" in text for _, _, text in panel["targets"])


def test_host_shuffle_chart_has_no_targets_and_shows_what_did_not_run(tmp_path):
    result = json.loads(SHUFFLE_JSON.read_text())
    result["target"] = "host"
    for check in result["checks"]:
        check["target"], check["result"] = None, "-"
    p2p = next(r for r in result["records"] if r["key"] == "p2p")
    p2p.update(status="timed out", gbps_per_gpu=None)
    (panel,) = _shuffle_panels(result)
    assert panel["targets"] == [] and panel["unit"] == "GB/s per worker"
    assert [r["status"] for r in panel["rows"] if r["value"] is None] == ["timed out"]
    draw(result, str(tmp_path / "host.png"))
    assert_png(tmp_path / "host.png", min_width=700)


def test_bench_plot_refuses_other_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    result = CliRunner().invoke(bench, ["plot", str(other), str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "not the JSON of" in result.output
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("# not json\n", "not the JSON of"),
        ("[]", "not the JSON of"),
        ('{"benchmark": "shuffle"}', "lacks what its chart needs"),
    ],
    ids=["markdown", "a list", "no records"],
)
def test_bench_plot_refuses_what_is_no_bench_result(tmp_path, content, says):
    results = tmp_path / "r.json"
    results.write_text(content)
    result = CliRunner().invoke(bench, ["plot", str(results), str(tmp_path / "x.png")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "x.png").exists()


def test_bench_plot_writes_where_it_says(tmp_path):
    """An OUT of no format is a PNG of that name plus ``.png``, as the command says; an OUT
    under a file is a usage error."""
    result = CliRunner().invoke(bench, ["plot", str(READ_JSON), str(tmp_path / "chart")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'chart.png'}" in result.output
    assert_png(tmp_path / "chart.png", min_width=700)
    (tmp_path / "afile").touch()
    result = CliRunner().invoke(bench, ["plot", str(READ_JSON), str(tmp_path / "afile" / "x.png")])
    assert result.exit_code == 2 and "cannot write there" in result.output


@pytest.mark.parametrize("command", ["plot", "shuffle"])
def test_a_format_matplotlib_does_not_write_is_refused_at_the_start(tmp_path, command):
    """Refused before the run (``--plot x.xyz`` ran the whole bench, then failed with a
    traceback and printed no table)."""
    out = str(tmp_path / "x.xyz")
    args = ["plot", str(READ_JSON), out] if command == "plot" else ["shuffle", "--plot", out]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 2, result.output
    assert "matplotlib writes no .xyz file" in result.output
    assert not os.path.exists(out)


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "x.png"
    # --plot fails at the start, before any data is written or cluster started
    result = CliRunner().invoke(
        bench, ["read", "--dir", str(tmp_path / "data"), "--plot", str(out)]
    )
    assert result.exit_code == 2
    assert 'pip install "dask-gpudirect[plot]"' in result.output
    assert not (tmp_path / "data").exists() and not out.exists()
    result = CliRunner().invoke(bench, ["plot", str(READ_JSON), str(out)])
    assert result.exit_code == 2 and "dask-gpudirect[plot]" in result.output


@pytest.mark.timeout(HANG_GUARD + 60)
def test_bench_read_host_plot(tmp_path):
    """A tiny real ``bench read`` on the host target draws its chart and reports progress."""
    out_json, out_png = tmp_path / "read.json", tmp_path / "read.png"
    size = str(1 / 1024)  # 1 MiB of each format
    cmd = [
        sys.executable,
        "-m",
        "dask_gpudirect.bench",
        "read",
        "--target",
        "host",
        "--dir",
        str(tmp_path / "data"),
        "--binary-gib",
        size,
        "--parquet-gib",
        size,
        "--files",
        "2",
        "--repeat",
        "1",
        "--no-drop-cache",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    ]
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_png(out_png, min_width=800)
    result = json.loads(out_json.read_text())
    (warm, _) = _read_panels(result)
    assert [r["value"] is not None for r in warm["rows"]] == [
        False,  # the pinned copy: no GPU
        True,
        True,
        False,  # cudf-tuned: device only
        True,
        True,
        True,
    ]
    # progress is on by default; stderr is not a terminal, so plain lines, no control codes
    assert "bench read: measurements: 14/14 (100%)" in proc.stderr
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
