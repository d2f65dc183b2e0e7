"""Budgeted runs for ``dask-gpudirect bench shuffle``: one method, its runs, its record.

A method gets one warm-up and ``--repeat`` timed runs within a time budget. Each run is called in
a thread of its own so that one that overruns can be abandoned (the caller then restarts the
cluster); no run starts that the fastest run so far says cannot finish in what is left. The runs
become one record: the median of the warm runs, GB/s per GPU, and why there were fewer runs than
asked.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from .common import log


class _TimedOut(Exception):
    """A run did not finish within its budget; it was abandoned."""


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C (or ``timeout -s INT``) during a method: ``record`` holds the runs it finished."""

    def __init__(self, record: dict):
        super().__init__()
        self.record = record


def _call(fn: Callable[[], dict], timeout: float) -> dict:
    """``fn()`` in a daemon thread, abandoned after ``timeout`` seconds (``_TimedOut``).

    A thread, because ``dg.shuffle`` blocks until the exchange is done and Dask's ``wait`` can be
    left the same way: the caller then restarts the cluster, which ends the work itself.
    """
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="bench-shuffle-run", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout))
    if thread.is_alive():
        raise _TimedOut(f"no result after {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _gbps(nbytes: int, seconds: float | None, per: int) -> float | None:
    return nbytes / seconds / 1e9 / per if seconds else None


def _record(key: str, status: str = "ok", **fields: Any) -> dict:
    rec: dict[str, Any] = {
        "key": key,
        "status": status,
        "bytes": 0,
        "seconds": None,
        "runs": [],
        "note": "",
    }
    rec.update(fields)
    return rec


def _measure(
    key: str,
    run_once: Callable[[], dict],
    nbytes: int,
    per: int,
    repeat: int,
    budget: float,
    after: Callable[[], None],
    bench: str = "shuffle",
) -> tuple[dict, bool]:
    """One warm-up and ``repeat`` timed runs of ``run_once`` within ``budget`` seconds.

    ``run_once`` returns ``{"seconds": s, "note": ...}`` and may add fields that are kept per
    run; ``after`` runs between runs (release, wait). Returns the record, and whether a run timed
    out (the caller must then restart the cluster). ``bench`` names the progress lines.
    """
    if budget <= 0:  # no time was left for it: nothing ran, nothing timed out
        return _record(key, "not run", note=f"no time left of its budget ({budget:.0f} s)"), False
    deadline = time.monotonic() + budget
    runs: list[dict] = []
    note, stop = "", ""  # what the runs say; why fewer runs than asked
    for i in range(1 + repeat):
        left = deadline - time.monotonic()
        if runs and min(r["seconds"] for r in runs) * 1.2 > left:
            stop = f"budget of {budget:.0f} s reached after {len(runs)} run(s)"
            break
        try:
            out = _call(run_once, left)
        except KeyboardInterrupt:
            if not runs:
                raise
            stop = f"interrupted during run {i + 1}"
            raise _Interrupted(_summarise(key, runs, nbytes, per, note, stop)) from None
        except _TimedOut as exc:
            log(bench, f"{key} run {i + 1}: timed out ({exc})")
            if not runs:
                return _record(
                    key,
                    "timed out",
                    bytes=nbytes,
                    note=f"no run finished within its budget of {budget:.0f} s "
                    f"(< {_gbps(nbytes, budget, per):.3f} GB/s per worker)",
                ), True
            stop = f"run {i + 1} timed out at the budget of {budget:.0f} s"
            return _summarise(key, runs, nbytes, per, note, stop), True
        note = note or out.get("note", "")
        runs.append(out)  # kept, whatever interrupts the release after it
        speed = _gbps(nbytes, out["seconds"], per)
        log(
            bench,
            f"{key} run {i + 1}/{1 + repeat}: {out['seconds']:.3f} s, {speed:.3f} GB/s per worker",
        )
        try:
            after()
        except KeyboardInterrupt:
            stop = f"interrupted after run {i + 1}"
            raise _Interrupted(_summarise(key, runs, nbytes, per, note, stop)) from None
    return _summarise(key, runs, nbytes, per, note, stop), False


def _summarise(key: str, runs: list[dict], nbytes: int, per: int, note: str, stop: str) -> dict:
    """The record of ``runs``: the median of the warm runs, or the first run if it is all."""
    seconds = [r["seconds"] for r in runs]
    warm = seconds[1:]
    figure = statistics.median(warm) if warm else seconds[0]
    if not warm:
        stop = "; ".join(s for s in (stop, "the first (cold) run only") if s)
    extra: dict[str, Any] = {
        k: [r[k] for r in runs] for k in runs[0] if k not in ("seconds", "note")
    }
    return _record(
        key,
        bytes=nbytes,
        seconds=figure,
        runs=seconds,
        first_seconds=seconds[0],
        best_seconds=min(warm or seconds),
        warm_runs=len(warm),
        gbps=_gbps(nbytes, figure, 1),
        gbps_per_gpu=_gbps(nbytes, figure, per),
        best_gbps_per_gpu=_gbps(nbytes, min(warm or seconds), per),
        first_gbps_per_gpu=_gbps(nbytes, seconds[0], per),
        note=note,
        stopped=stop,
        **extra,
    )
