"""Seconds per named phase of one call (a shuffle's stage or client side, a read's planning),
for the logs and the benchmarks, which say where a missed target's time went."""

from __future__ import annotations

import collections
import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any


class Phases:
    """Seconds spent in each phase, summed over the times it is entered."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._collected = gc_seconds()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def count_collections(self) -> None:
        """Record the garbage collector's seconds since this clock was made as ``"garbage
        collection"``: time inside the other phases, not beside them."""
        self.seconds["garbage collection"] = gc_seconds() - self._collected

    def __str__(self) -> str:
        return ", ".join(f"{phase} {s:.3f} s" for phase, s in self.seconds.items())


class _Collections:
    """Seconds this process has spent in Python's garbage collector (every thread waits for a
    collection) since it was first asked: a full collection of a process that holds cuDF's
    objects took 110-170 ms on an H200 worker, and lands inside whatever phase triggered it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None


_collections = _Collections()


def gc_seconds() -> float:
    """:class:`_Collections`' count: where it grows between a phase's start and end, that
    much of the phase was the garbage collector's."""
    if _collections not in gc.callbacks:
        gc.callbacks.append(_collections)
    return _collections.seconds
