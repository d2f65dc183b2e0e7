"""How the scripts that time a step take its time: the best of a few runs after a warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(fn: Callable[[], object], sync: Callable[[], None], repeat: int = 3) -> float:
    """The best of ``repeat`` runs of ``fn`` (after one warm-up), ``sync`` after each (the GPU's
    stream, or nothing on the host), in seconds."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def first_two_calls(step: str, fn: Callable[[], object], sync: Callable[[], None]) -> None:
    """Print how long the first and the second call of ``fn`` take, ``sync`` before and after
    each: what compiling on first use (CuPy's kernels) costs a step."""
    for call in ("first", "second"):
        sync()
        began = time.perf_counter()
        fn()
        sync()
        print(f"{step:50s} {call:6s} {time.perf_counter() - began:8.3f} s", flush=True)
