"""examples/ecg on the host target: the pipeline end to end as a subprocess at small size
(real data, a real LocalCluster with worker processes), and the parts it relies on.

The thresholds are what the detector reaches on the small dataset (seed 0: every kind at 0.94
or more, all abnormal beats at 1.0; the medium dataset: 0.96 or more per kind), less a margin of
two or three beats per kind.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from util import HANG_GUARD

ROOT = Path(__file__).resolve().parent.parent
ECG = ROOT / "examples" / "ecg"
sys.path.insert(0, str(ECG))

import beats as bt  # noqa: E402
import generate as gen  # noqa: E402
import pipeline  # noqa: E402

LAST_LINE = re.compile(r"precision=(\d+\.\d{4}) recall=(\d+\.\d{4}) beats_per_s=(\d+\.\d)")
MIN_OVERALL = 0.95  # precision and recall over all abnormal kinds
MIN_PER_KIND = 0.85  # precision and recall of each kind (about 20 beats each)


def run_pipeline(data: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [sys.executable, str(ECG / "pipeline.py"), "--size", "small", "--target", "host"]
    cmd += ["--data", str(data), "--json", str(out), "--jobs", "1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ecg")
    proc, result = run_pipeline(tmp / "data", tmp / "direct.json", "--plot", str(tmp / "b.png"))
    return proc, result, tmp


def label_files(data: Path) -> list[np.ndarray]:
    meta = json.loads((data / "meta.json").read_text())
    return [np.load(data / "labels" / s["file"]) for s in meta["shards"]]


def test_last_line(direct):
    proc, result, _ = direct
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    m = LAST_LINE.fullmatch(last)
    assert m, last
    ev = result["evaluation"]
    assert float(m[1]) == pytest.approx(ev["precision"], abs=1e-4)
    assert float(m[2]) == pytest.approx(ev["recall"], abs=1e-4)
    assert float(m[3]) == pytest.approx(result["beats_per_s"], abs=0.1)
    assert result["beats_per_s"] > 0


def test_every_labelled_beat_scored_once(direct):
    _, result, tmp = direct
    labels = label_files(tmp / "data")
    labelled = sum(len(lab) for lab in labels)
    ev = result["evaluation"]
    assert labelled > 500
    assert ev["labelled_beats"] == labelled
    assert ev["matched_once"] == labelled
    assert ev["missed"] == 0
    assert ev["matched_more_than_once"] == 0
    assert ev["duplicate_rows"] == 0
    # the shuffle neither lost nor made beats, and it mixed them across chunks
    assert result["beats_after_shuffle"] == result["detected_beats"] == ev["scored_beats"]
    assert ev["scored_beats"] == labelled + ev["unlabelled_detections"]
    assert result["shuffle_mixing"] > 0.5


def test_precision_and_recall(direct):
    _, result, _ = direct
    ev = result["evaluation"]
    assert ev["precision"] >= MIN_OVERALL
    assert ev["recall"] >= MIN_OVERALL
    for kind in gen.KINDS[1:]:
        m = ev["per_kind"][kind]
        assert m["labelled"] >= 10, (kind, m)
        assert m["precision"] >= MIN_PER_KIND, (kind, m)
        assert m["recall"] >= MIN_PER_KIND, (kind, m)


def test_ledger_and_stages(direct):
    _, result, tmp = direct
    reads = [r for r in result["ledger"] if r["op"] == "read"]
    assert {r["path"] for r in reads} == {"posix-host"}
    assert result["ledger_read_bytes"] == result["data"]["bytes"]
    shuffles = {r["path"] for r in result["ledger"] if r["op"] == "shuffle"}
    assert shuffles and shuffles <= {"local", "tcp-host"}
    stages = [s["stage"] for s in result["stages"]]
    assert stages == ["load", "detect", "fit", "shuffle", "score", "evaluate"]
    total = sum(s["seconds"] for s in result["stages"])
    assert result["end_to_end_seconds"] == pytest.approx(total)
    if (tmp / "b.png").exists():  # matplotlib is optional
        assert (tmp / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_naive_loader_gives_the_same_beats(direct, tmp_path):
    _, first, tmp = direct
    proc, naive = run_pipeline(tmp / "data", tmp_path / "naive.json", "--loader", "naive")
    assert LAST_LINE.fullmatch(proc.stdout.rstrip("\n").splitlines()[-1])
    assert naive["evaluation"] == first["evaluation"]
    assert not [r for r in naive["ledger"] if r["op"] == "read"]
    assert naive["naive_bytes_outside_ledger"] == naive["data"]["bytes"]


# --- the parts ----------------------------------------------------------------------------------


def test_the_pipeline_keeps_a_dataset_of_another_abnormal_share(tmp_path):
    """A dataset generated with --abnormal 0.2 is read by the pipeline given the same share
    (it was replaced by one of the default 0.09, the user's data deleted)."""
    meta = gen.generate(str(tmp_path / "data"), "small", abnormal=0.2, jobs=1, log=lambda _: None)
    proc, result = run_pipeline(tmp_path / "data", tmp_path / "out.json", "--abnormal", "0.2")
    assert f"generate: using the {len(meta['shards'])} shards" in proc.stdout
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["abnormal"] == 0.2
    labelled = sum(sum(s["beats"][k] for k in gen.KINDS[1:]) for s in meta["shards"])
    assert result["evaluation"]["labelled_abnormal"] == labelled


def test_generator_is_deterministic_and_labels_fit_the_signal(tmp_path):
    a = gen.generate(str(tmp_path / "a"), "small", jobs=1, log=lambda _: None)
    b = gen.generate(str(tmp_path / "b"), "small", jobs=2, log=lambda _: None)
    assert a["shards"] == b["shards"]
    name = a["shards"][0]["file"]
    x = np.load(tmp_path / "a" / "signals" / name)
    assert x.dtype == np.float32 and x.shape == (90 * gen.FS, 12)
    assert np.array_equal(x, np.load(tmp_path / "b" / "signals" / name))
    labels = np.load(tmp_path / "a" / "labels" / name)
    kinds = labels[:, 1]
    assert set(np.unique(kinds)) <= set(range(len(gen.KINDS)))
    assert np.all(np.diff(labels[:, 0]) > 0.25 * gen.FS)
    assert np.all(kinds[:2] == 0) and np.all(kinds[-2:] == 0)
    assert not np.any((kinds[1:] > 0) & (kinds[:-1] > 0))
    abnormal = sum(sum(s["beats"][k] for k in gen.KINDS[1:]) for s in a["shards"])
    total = sum(sum(s["beats"].values()) for s in a["shards"])
    assert 0.05 < abnormal / total < 0.13  # --abnormal 0.09, less the normal ends
    # each labelled R peak is the largest deflection of lead II near it
    ii = x[:, gen.LEADS.index("II")]
    for r in labels[labels[:, 1] == 0, 0][:20]:
        assert abs(int(np.argmax(ii[r - 40 : r + 40])) - 40) <= 3


def test_size_for_gib():
    size = gen.size_for("large", gib=10)
    assert size.seconds == 3600 and size.hours == 4
    assert abs(size.nbytes - 10 * 2**30) < 2 * 4 * 3600 * gen.BYTES_PER_SECOND


def test_sliding_max_matches_brute_force():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(1000).astype(np.float32)
    for half in (1, 2, 7, 100):
        want = [a[max(i - half, 0) : i + half + 1].max() for i in range(a.size)]
        assert np.array_equal(bt.sliding_max(a, half), np.array(want))


def test_a_chunk_that_is_not_a_whole_shard_fails_loudly(tmp_path):
    meta = gen.generate(str(tmp_path), "small", jobs=1, log=lambda _: None)
    s = meta["shards"][0]
    x = np.load(tmp_path / "signals" / s["file"])
    assert bt.detect_and_cut(x, 0, 0, s["first_record"]).shape[1] == bt.COLUMNS
    with pytest.raises(ValueError, match="one chunk per file"):
        bt.detect_and_cut(x[1000:], 0, 0, s["first_record"])  # a second chunk of the file


def test_match_counts_duplicates_and_misses():
    labels = np.array([[1000, 0], [1500, 2], [2000, 0], [2600, 1]])
    r = np.array([1003, 1498, 1498, 2650, 3000])  # 2000 missed, 1500 scored twice, 3000 extra
    times, truth = pipeline.match(r, labels)
    assert times.tolist() == [1, 2, 0, 1]
    assert truth.tolist() == [0, 2, 2, 1, -1]


def test_workers_below_one_are_refused():
    """--workers 0 started two workers, as if not given."""
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--workers", "0"])
    assert pipeline.parse_args(["--workers", "3"]).workers == 3
