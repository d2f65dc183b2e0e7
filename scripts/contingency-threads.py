"""How long ``dg.shuffle_array``'s counts table takes the client, drawn in blocks of outputs in
threads (``split.contingency``) against one generator row by row (the way before ``0b4c1aa``),
at 8 to 1024 chunks of 8192 records: ``python3 scripts/contingency-threads.py``."""

from __future__ import annotations

import os
import time

import numpy as np

from dask_gpudirect.shuffle.split import contingency


def row_by_row(seed: int, sizes: list[int]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    remaining = np.array(sizes, dtype=np.int64)
    counts = np.zeros((len(sizes), len(sizes)), dtype=np.int64)
    for i, n in enumerate(sizes):
        counts[i] = rng.multivariate_hypergeometric(remaining, n)
        remaining -= counts[i]
    return counts


def best(draw, sizes: list[int]) -> float:
    times = []
    for seed in range(3):
        start = time.perf_counter()
        draw(seed, sizes)
        times.append(time.perf_counter() - start)
    return min(times)


if __name__ == "__main__":
    print(f"{os.cpu_count()} CPUs")
    for chunks in (8, 64, 256, 1024):
        sizes = [8192] * chunks
        print(
            f"{chunks} chunks: blocks in threads {best(contingency, sizes) * 1e3:.1f} ms, "
            f"row by row {best(row_by_row, sizes) * 1e3:.1f} ms"
        )
