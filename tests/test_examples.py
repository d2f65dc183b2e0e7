"""examples/quickstart.py and examples/etl.py, run as a user runs them, on the host target.

Without a GPU both start a ``LocalCluster`` of two worker processes (their own fallback), so
this runs the same code path as on a GPU machine up to the target. Their printed and written
results are checked against pandas computing the same thing from the same files.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from util import HANG_GUARD

from dask_gpudirect.demo import write_sample

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=EXAMPLES.parent,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def ledger_has(printed: str, op: str, path: str) -> bool:
    """Whether the printed ``dg.report(client, by="path")`` has a row for ``op`` and ``path``."""
    return re.search(rf"^\d+\s+{op}\s+{path}\s", printed, re.M) is not None


@pytest.mark.timeout(HANG_GUARD + 60)
def test_quickstart(tmp_path):
    out = run_quickstart(tmp_path)
    assert ledger_has(out, "read", "posix-host")
    assert ledger_has(out, "shuffle", "tcp-host")


def run_quickstart(tmp_path) -> str:
    """Run quickstart.py on a sample and check its results against pandas; its output."""
    write_sample(tmp_path, files=3, rows=20_000)
    out = run_example(str(EXAMPLES / "quickstart.py"), str(tmp_path))

    frame = pd.read_parquet(tmp_path / "parquet")
    expected = frame[frame.x > 0].groupby("label").x.sum()
    printed = dict(re.findall(r"^  (\d+): (-?[\d.]+)$", out, re.M))
    assert {int(k) for k in printed} == set(expected.index)
    for label, total in expected.items():
        assert float(printed[str(label)]) == pytest.approx(total, abs=1e-5)

    npy = np.concatenate([np.load(p) for p in sorted((tmp_path / "npy").glob("*.npy"))])
    records, mean = re.search(r"npy records: (\d+), mean of column 0: (-?[\d.]+)", out).groups()
    assert int(records) == len(npy)
    assert float(mean) == pytest.approx(npy[:, 0].mean(dtype="f8"), abs=1e-5)
    return out


@pytest.mark.timeout(HANG_GUARD + 60)
def test_etl(tmp_path):
    printed = run_etl(tmp_path)
    assert ledger_has(printed, "shuffle", "tcp-host")  # the join moved rows


@pytest.mark.timeout(HANG_GUARD + 60)
def test_etl_of_fewer_rows_than_files(tmp_path):
    """5 rows in 4 files: the last file is empty (it failed: "negative dimensions")."""
    run_etl(tmp_path, rows=5)


def run_etl(tmp_path, rows: int = 20000) -> str:
    """Run etl.py on a sample and check what it wrote against pandas; its output."""
    data, out = tmp_path / "data", tmp_path / "out"
    printed = run_example(
        str(EXAMPLES / "etl.py"), str(data), str(out), "--sample", "--rows", str(rows)
    )

    orders = pd.read_parquet(data / "orders")
    customers = pd.read_parquet(data / "customers")
    kept = orders[(orders.status != "cancelled") & (orders.amount >= 5.0)]
    expected = (
        kept.merge(customers, on="customer_id")
        .groupby(["region", "day"])
        .amount.agg(revenue="sum", orders="count")
        .reset_index()
    )
    got = pd.read_parquet(out / "revenue_by_region.parquet")
    assert len(got) == len(expected)
    assert len(expected) > 0 or rows < 100  # a sample of a few rows may keep none
    pd.testing.assert_frame_equal(
        got.astype({"region": str}), expected.astype({"region": str}), check_dtype=False
    )
    assert f"{len(expected)} rows -> " in printed
    return printed


def test_quickstart_without_its_argument_says_how_to_run_it():
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True,
                          text=True, timeout=HANG_GUARD)  # fmt: skip
    assert proc.returncode == 1 and "python examples/quickstart.py DATA_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr  # it was an IndexError
