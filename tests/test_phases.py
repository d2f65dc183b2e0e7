"""The phase clock the logs and benchmarks report with, and the garbage collector's share."""

from __future__ import annotations

import gc

from dask_gpudirect.phases import Phases


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # a reference cycle: only the collector frees it


def test_a_clock_counts_the_collectors_time_inside_its_phases():
    clock = Phases()
    with clock("work"):
        _cycles(200_000)
        gc.collect()
    clock.count_collections()
    collected = clock.seconds["garbage collection"]
    assert 0 < collected <= clock.seconds["work"]
    # a clock made after a collection does not count it
    later = Phases()
    later.count_collections()
    assert later.seconds["garbage collection"] < collected
