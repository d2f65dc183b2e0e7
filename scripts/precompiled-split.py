"""The split's group order from libcudf's precompiled calls (``device.group_order``) against
CuPy's, which it replaced (``cupy_split.group_order``).

On a fresh GPU machine the first shuffle took seconds longer than the next: CuPy's kernels
(``arange``, ``searchsorted``, ``bincount``, casts) compile on their first call (NVRTC), 6.07 s
against 0.07 s compiled (``cold-split.py``, 2026-12-03). libcudf's ship compiled. This script:

1. times the first and second call of each in one process (run it on an empty
   ``CUPY_CACHE_DIR``, where CuPy's compiles; libcudf's runs first, so it pays no CuPy
   start-up),
2. checks that both give the same order and counts over a grid of outputs and inputs (an
   empty input among them),
3. times both warm (best of three) on a chunk the size of the device's default (2 GiB of four
   8-byte columns) for 8 and 1024 outputs.

    export CUPY_CACHE_DIR=$(mktemp -d)
    python3 scripts/precompiled-split.py
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from best_of import first_two_calls, timed
from cupy_split import group_order as group_order_cupy

#: Rows of a 2 GiB chunk of four 8-byte columns (the device target's default chunk).
CHUNK_ROWS = (2 << 30) // 32


def main() -> None:
    import cudf
    import cupy
    import dask_cudf  # noqa: F401  (registers cuDF's dispatches)
    from dask.dataframe.shuffle import partitioning_index

    from dask_gpudirect.shuffle.split import cells_of
    from dask_gpudirect.targets import device

    def sync() -> None:
        cupy.cuda.runtime.deviceSynchronize()

    def destinations(rows: int, n: int, seed: int = 0) -> Any:
        keys = np.random.default_rng(seed).integers(0, 2**62, rows)
        return partitioning_index(cudf.DataFrame({"key": keys}), n)

    where = destinations(1 << 20, 8)
    lengths = [1 << 19, 1 << 19]
    first_two_calls(
        "group order, 8 outputs (libcudf)", lambda: device.group_order(where, lengths, 8), sync
    )
    first_two_calls(
        "group order, 8 outputs (CuPy)", lambda: group_order_cupy(where, lengths, 8), sync
    )

    for n in (1, 8, 300, 70_000):
        for lengths in ([1000], [0, 5000, 3], [4096] * 64):
            where = destinations(sum(lengths), n, seed=n)
            got_order, got_counts = device.group_order(where, lengths, n)
            order, counts = group_order_cupy(where, lengths, n)
            same = bool((got_order.astype(cupy.int64) == order).all()) and np.array_equal(
                got_counts, cells_of(counts)
            )
            print(f"same result, {n} outputs, inputs of {lengths[:3]}...: {same}", flush=True)
            assert same, (n, lengths)

    for n in (8, 1024):
        where = destinations(CHUNK_ROWS, n)
        lengths = [CHUNK_ROWS // 4] * 4
        for name, fn in (("libcudf", device.group_order), ("CuPy", group_order_cupy)):
            seconds = timed(partial(fn, where, lengths, n), sync)
            print(f"warm, {CHUNK_ROWS} rows, {n} outputs, {name}: {seconds * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
