"""Progress: ``dg.shuffle(progress=True)`` on a real cluster, the bar's two ways of drawing, and
the CLI's ``--no-progress``.

Where the output is not a terminal (pytest's capture, CI logs) a bar must be plain lines: no
carriage returns, no escape codes.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from util import HANG_GUARD, assert_hash_partitions, compute, partitions

import dask_gpudirect as dg
from dask_gpudirect import progress

CONTROL = re.compile(r"[\r\x1b]")


def frame(n: int = 4000) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"k": rng.integers(0, 100, n), "v": rng.random(n)})


def test_shuffle_progress_plain_lines(tcp, capsys):
    pdf = frame()
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=5, progress=True)
    err = capsys.readouterr().err
    assert not CONTROL.search(err), repr(err)
    # lines only at the end of each phase here (the next would come after LINE_INTERVAL)
    lines = [line for line in err.splitlines() if line.startswith("dg.shuffle")]
    assert len(lines) == 2, err
    assert lines[0].startswith("dg.shuffle: input partitions: 4/4 (100%)"), lines
    got = re.match(
        r"dg.shuffle \w+: pieces received: (\d+)/(\d+) \(100%\), stages done (\d)/\3", lines[1]
    )
    assert got, lines
    # every input sends a piece to each worker that holds input (both own outputs here)
    assert got[1] == got[2] and int(got[2]) == 4 * int(got[3]), lines
    assert_hash_partitions(partitions(tcp, out), pdf, "k", 5)


def fails_on_the_first(part: pd.DataFrame) -> pd.DataFrame:
    """The input partition that holds row 0 fails."""
    if 0 in part.index:
        raise ValueError("bad input partition")
    return part


def test_a_failed_input_is_not_counted_as_computed(tcp, capsys):
    """One of 3 inputs failed: the bar says 2 of 3 were computed, not 3/3 (100%)."""
    pdf = frame(600)
    df = dd.from_pandas(pdf, npartitions=3).map_partitions(fails_on_the_first, meta=pdf)
    with pytest.raises(ValueError, match="bad input partition"):
        dg.shuffle(df, "k", progress=True, client=tcp)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dg.")]
    assert len(lines) == 1 and lines[0].endswith("(stopped)"), lines
    assert lines[0].startswith("dg.shuffle: input partitions: 2/3 (66%)"), lines


def test_shuffle_progress_live_bar(tcp, capsys, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr is a terminal
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    arr = dd.from_pandas(frame(), npartitions=3).to_dask_array(lengths=True)
    out = dg.shuffle_array(arr, seed=7, progress=True)
    err = capsys.readouterr().err
    assert "\x1b[" in err and "pieces received" in err
    assert "dg.shuffle_array: input chunks" in err and "dg.shuffle " not in err
    got = tcp.compute(out).result()
    expected = arr.compute()
    assert sorted(map(tuple, got)) == sorted(map(tuple, expected))
    assert not np.array_equal(got, expected)


def test_shuffle_without_progress_is_silent(tcp, capsys):
    pdf = frame(500)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=2), "k")
    assert "dg.shuffle" not in capsys.readouterr().err
    assert_hash_partitions(partitions(tcp, out), pdf, "k", 2)


def test_the_config_turns_progress_on_for_dasks_own_shuffles(tcp, capsys):
    """``gpudirect.shuffle.progress`` shows the bar where no ``progress=`` can be passed: a Dask
    group-by on ``shuffle_method="gpudirect"``."""
    pdf = frame()
    df = dd.from_pandas(pdf, npartitions=4)
    sums = df.groupby("k").v.sum(split_out=3, shuffle_method="gpudirect")
    with dask.config.set({"gpudirect.shuffle.progress": True}):
        got = compute(tcp, sums)
    err = capsys.readouterr().err
    assert "dg.shuffle: input partitions: 4/4 (100%)" in err, err
    assert len(got) == pdf["k"].nunique()


def test_plain_lines_are_rate_limited(monkeypatch):
    file = io.StringIO()
    bar = progress.Bar("work", 10, Console(file=file, force_terminal=False))
    for done in range(1, 6):
        bar.update(done)
    assert file.getvalue() == ""  # within LINE_INTERVAL of the start: nothing yet
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    bar.update(6, detail="half")
    bar.update(6, detail="half")  # nothing moved: no new line
    bar.update(7, total=20, label="more work")
    bar.close()
    lines = file.getvalue().splitlines()
    # a line when the count moves and when a phase ends, never the same one twice
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        "work: 6/10 (60%), half",
        "more work: 7/20 (35%)",
    ]
    assert not CONTROL.search(file.getvalue())


def test_a_failed_run_says_so():
    file = io.StringIO()
    with pytest.raises(RuntimeError), progress.Bar("work", 4, Console(file=file)) as bar:
        bar.update(1)
        raise RuntimeError("boom")
    assert file.getvalue().startswith("work: 1/4 (25%)")
    assert file.getvalue().rstrip().endswith("(stopped)")


def test_live_bar_in_a_terminal():
    file = io.StringIO()
    console = Console(file=file, force_terminal=True, force_interactive=True, width=100)
    with progress.Bar("work", 4, console) as bar:
        bar.print("a message above the bar")
        bar.update(4)
    text = file.getvalue()
    assert "\x1b[" in text and "a message above the bar" in text and "4/4" in text


@pytest.mark.timeout(HANG_GUARD + 60)
def test_demo_no_progress(tmp_path):
    """``dask-gpudirect demo --no-progress`` shows no bar and no spinner, only its results."""
    cmd = [sys.executable, "-m", "dask_gpudirect.cli", "demo", "--no-progress"]
    cmd += ["--dir", str(tmp_path / "demo")]
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Ledger" in proc.stdout and "partitions per worker" in proc.stdout
    assert "loading Parquet" not in proc.stderr + proc.stdout
    assert not CONTROL.search(proc.stderr), proc.stderr[-2000:]
