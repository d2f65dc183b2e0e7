"""The device split's bookkeeping as CuPy did it until the libcudf version replaced it (CuPy
compiles its kernels on their first call: 6 s of a fresh machine's first shuffle). The scripts
that measured it, and the one that compares the two, share these."""

from __future__ import annotations

from typing import Any

import numpy as np


def segment_of(rows: Any, lengths: Any) -> Any:
    """Which of the segments of ``lengths`` rows (NumPy or CuPy), laid end to end, each of
    ``rows`` (CuPy) falls in: one search on the GPU."""
    import cupy

    return cupy.searchsorted(cupy.cumsum(cupy.asarray(lengths)), rows, side="right")


def group_order(where: Any, lengths: list[int], n: int) -> tuple[Any, np.ndarray]:
    """``device.group_order``'s result from CuPy: a stable argsort of the narrowest type that
    holds ``n - 1`` and a ``bincount`` of ``input * n + value``."""
    import cupy

    values = cupy.asarray(where.values)
    source = segment_of(cupy.arange(len(values), dtype=cupy.int64), np.asarray(lengths))
    counts = cupy.bincount(source * n + values.astype(cupy.int64), minlength=len(lengths) * n)
    order = cupy.argsort(values.astype(np.min_scalar_type(max(n - 1, 0))))
    return order, counts.get().reshape(len(lengths), n)
