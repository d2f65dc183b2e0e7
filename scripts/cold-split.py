"""How long a shuffle stage's split takes the first time a process runs it, step by step.

The first ``bench etl`` on a fresh GPU machine took 7.9-9.2 s where the next took 0.2-0.5 s,
the split alone 6.8-7.7 s; on a machine whose GPU tests had run first, 1.4-1.8 s. The suspect is
CuPy, which compiles each kernel (NVRTC) on its first call and keeps it on disk
(``CUPY_CACHE_DIR``, by default ``~/.cupy/kernel_cache``). This times the first and the second
call of each step of the split, and of the receiver's positions, in one process; run it
twice on one empty cache directory (cold, then compiled):

    export CUPY_CACHE_DIR=$(mktemp -d)
    python3 scripts/cold-split.py; python3 scripts/cold-split.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
from best_of import first_two_calls


def main() -> None:
    start = time.perf_counter()
    import cudf
    import cupy
    import dask_cudf  # noqa: F401  (registers cuDF's dispatches)
    from dask.dataframe.shuffle import partitioning_index

    from dask_gpudirect.shuffle.split import HashSplit, Segments
    from dask_gpudirect.targets import device as target

    print(f"imports {time.perf_counter() - start:.2f} s", flush=True)
    rows = 1 << 20
    rng = np.random.default_rng(0)
    frame = cudf.DataFrame({"key": rng.integers(0, 2**62, rows), "x": rng.random(rows)})
    parts = [frame.iloc[: rows // 2], frame.iloc[rows // 2 :]]  # RangeIndexes, as a read's
    meta = frame.iloc[:0]
    lengths = [len(p) for p in parts]

    def twice(step: str, fn: Callable[[], object]) -> None:
        first_two_calls(step, fn, cupy.cuda.runtime.deviceSynchronize)

    twice(
        "join two inputs (RangeIndexes labelled by libcudf)",
        lambda: target.concat_frames(parts, meta),
    )
    joined = target.concat_frames(parts, meta)  # after the join's first call, timed above
    where = partitioning_index(joined[["key"]], 8)
    twice("hash (partitioning_index)", lambda: partitioning_index(joined[["key"]], 8))
    twice("group order, 8 outputs (libcudf)", lambda: target.group_order(where, lengths, 8))
    order, _ = target.group_order(where, lengths, 8)
    twice("take (cuDF)", lambda: joined.take(order))
    twice("split, 8 outputs", lambda: HashSplit(["key"], 8, "device", meta).split([0, 1], parts))
    twice(
        "split, 300 outputs", lambda: HashSplit(["key"], 300, "device", meta).split([0, 1], parts)
    )
    segments = Segments(np.array([0, 10], dtype=np.int64), np.array([5, 5], dtype=np.int64))
    twice("positions of segments (libcudf)", lambda: segments.positions("device"))
    cache = os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))
    kernels = sum(len(files) for _, _, files in os.walk(cache)) if os.path.isdir(cache) else 0
    print(f"CuPy's kernel cache {cache}: {kernels} files", flush=True)


if __name__ == "__main__":
    main()
