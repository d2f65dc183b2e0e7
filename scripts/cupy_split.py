"""The device split's bookkeeping as CuPy did it until the libcudf version replaced it (CuPy
compiles its kernels on their first call: 6 s of a fresh machine's first shuffle), and the
receiver's segments as a table filled slot by slot (CuPy from 2^18 slots, else NumPy) until the
column order of ``split.assembly_segments`` replaced it. The scripts that measured them, and
those that compare old and new, share these."""

from __future__ import annotations

import itertools
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


def slot_segments(pieces: list, outputs: range, xp: Any) -> tuple[Any, Any, np.ndarray]:
    """``split.assembly_segments``' starts, lengths and sizes as the table of ``(output,
    input)`` slots made them, with ``xp`` (NumPy or CuPy): each piece's segments scattered into
    their slots, the empty ones dropped, and runs that continue each other joined."""
    if all(max(a) < min(b) for (a, _, _), (b, _, _) in itertools.pairwise(pieces)):
        pieces = [((i[0],), f, c.sum(axis=0, keepdims=True)) for i, f, c in pieces]
    inputs = np.concatenate([np.asarray(i, dtype=np.int64) for i, _, _ in pieces])
    rank = np.zeros(int(inputs.max()) + 1, dtype=np.int64)
    rank[np.sort(inputs)] = np.arange(len(inputs))
    width = len(inputs)
    sizes = np.zeros(len(outputs), dtype=np.int64)
    start = xp.zeros(len(outputs) * width, dtype=xp.int64)
    length = xp.zeros(len(outputs) * width, dtype=xp.int64)
    offset = 0
    for ins, first, counts in pieces:
        js = np.arange(first - outputs.start, first - outputs.start + counts.shape[1])
        sizes[js] += counts.sum(axis=0)
        rows = xp.asarray(counts).T.ravel()
        slot = (xp.asarray(js)[:, None] * width + xp.asarray(rank[list(ins)])).ravel()
        length[slot] = rows
        start[slot] = offset + xp.cumsum(rows) - rows
        offset += int(counts.sum())
    kept = xp.flatnonzero(length)
    start, length = start[kept], length[kept]
    if not len(start):
        return start, length, sizes
    new = xp.ones(len(start), dtype=bool)
    new[1:] = start[1:] != start[:-1] + length[:-1]
    firsts = xp.flatnonzero(new)
    ends = xp.cumsum(length)[xp.concatenate([firsts[1:] - 1, xp.asarray([len(start) - 1])])]
    return start[new], xp.concatenate([ends[:1], ends[1:] - ends[:-1]]), sizes
