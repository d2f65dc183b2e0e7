"""The receiver's segments (``split.assembly_segments``, NumPy) against the slot table they
replaced (``cupy_split.slot_segments``: CuPy from 2^18 slots, else NumPy), at the shapes a
two-worker shuffle gives a receiver: 4, 128 and 512 outputs in one group, pieces from two
senders of two chunks each, the senders' inputs interleaved (every other partition, as Dask
places a persisted frame) or contiguous. The same rows in the same order, and the best of
five warm calls of each (CuPy's first call, which compiles on a fresh machine, is timed apart):

    python3 scripts/receiver-segments.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import numpy as np
from cupy_split import slot_segments

from dask_gpudirect.shuffle.split import assembly_segments, cells_of
from dask_gpudirect.targets.host import positions


def pieces_of(partitions: int, interleaved: bool, seed: int = 0) -> list:
    """A receiver's pieces: half of ``partitions`` outputs, rows of every input for each."""
    rng = np.random.default_rng(seed)
    outputs = partitions // 2
    senders = [range(w, partitions, 2) if interleaved else
               range(w * outputs, (w + 1) * outputs) for w in range(2)]  # fmt: skip
    pieces = []
    for sent in senders:
        half = len(sent) // 2
        for chunk in (tuple(sent[:half]), tuple(sent[half:])):
            counts = rng.poisson(8_400_000 // 40 // partitions, (len(chunk), outputs))
            pieces.append((chunk, 0, counts.astype(np.int64)))
    return sorted(pieces, key=lambda piece: piece[0][0])


def best_ms(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def main() -> None:
    import cupy

    def on_gpu(pieces: list, outputs: range) -> tuple:
        out = slot_segments(pieces, outputs, cupy)
        cupy.cuda.runtime.deviceSynchronize()
        return out

    began = time.perf_counter()
    on_gpu(pieces_of(8, True), range(4))
    print(f"slot table (CuPy), first call in this process: {time.perf_counter() - began:.3f} s")
    for partitions in (8, 256, 1024):
        for interleaved in (True, False):
            pieces = pieces_of(partitions, interleaved)
            outputs = range(partitions // 2)
            sparse = [(chunk, first, cells_of(counts)) for chunk, first, counts in pieces]
            new, sizes = assembly_segments(sparse, outputs)
            for name, xp in (("NumPy", np), ("CuPy", cupy)):
                starts, lengths, old_sizes = slot_segments(pieces, outputs, xp)
                old = positions(cupy.asnumpy(starts), cupy.asnumpy(lengths))
                same = np.array_equal(old, new.positions("host"))
                same = same and np.array_equal(old_sizes, sizes)
                assert same, f"{partitions} partitions: slot table ({name}) differs"
            shape = f"{partitions:>5} partitions, {'interleaved' if interleaved else 'contiguous '}"
            calls = {
                "cells (NumPy)": partial(assembly_segments, sparse, outputs),
                "slots (NumPy)": partial(slot_segments, pieces, outputs, np),
                "slots (CuPy)": partial(on_gpu, pieces, outputs),
            }
            times = {name: best_ms(call) for name, call in calls.items()}
            cells = "  ".join(f"{name} {ms:6.2f} ms" for name, ms in times.items())
            print(f"{shape} ({len(new.starts):>6} segments, equal): {cells}", flush=True)


if __name__ == "__main__":
    main()
