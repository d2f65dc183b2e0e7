"""Seconds per named phase of one call (a shuffle's stage or client side, a read's planning),
for the logs and the benchmarks, which say where a missed target's time went."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator


class Phases:
    """Seconds spent in each phase, summed over the times it is entered."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def __str__(self) -> str:
        return ", ".join(f"{phase} {s:.3f} s" for phase, s in self.seconds.items())
