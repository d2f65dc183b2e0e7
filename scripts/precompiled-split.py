"""A split's group order made of libcudf's precompiled calls, against the CuPy one it would replace.

On a fresh GPU machine the first shuffle takes seconds longer than the next: the device target's
``group_order`` (CuPy's ``arange``, ``searchsorted``, ``bincount`` and casts) is compiled by
NVRTC on its first call, 6.07 s against 0.07 s compiled (``cold-split.py``, 2026-12-03).
libcudf's kernels ship compiled. :func:`group_order_libcudf` gives the same order and counts
from a cast, a stable sort of the narrowed destinations, a repeat, two binary operations, a
gather and a search. This script, for the GPU session that decides whether it replaces the CuPy
one in ``dask_gpudirect/targets/device.py``:

1. times the first and second call of each in one process (run it on an empty
   ``CUPY_CACHE_DIR``, where the CuPy one compiles),
2. checks that both give the same order and counts over a grid of outputs and inputs (an
   empty input among them),
3. times both warm (best of three) on a chunk the size of the device's default (2 GiB of four
   8-byte columns) for 8 and 1024 outputs.

    export CUPY_CACHE_DIR=$(mktemp -d)
    python3 scripts/precompiled-split.py

Written on a machine without a GPU (2026-12-03): not yet run.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from best_of import first_two_calls, timed

#: Rows of a 2 GiB chunk of four 8-byte columns (the device target's default chunk).
CHUNK_ROWS = (2 << 30) // 32


def group_order_libcudf(where: Any, lengths: list[int], n: int) -> tuple[Any, np.ndarray]:
    """``device.group_order``'s result (the stable order that groups ``where``'s values, and
    ``counts[k, j]``) from libcudf calls alone. The sort is of the destinations narrowed to the
    fewest bytes that hold ``n - 1`` (a radix pass a byte); the counts are where each
    ``(output, input)`` pair starts among the ordered rows: ``key = output * inputs + input``
    rises along that order, so a search of every key gives them."""
    import cupy
    import pylibcudf as plc

    inputs = len(lengths)
    wide = plc.DataType(plc.TypeId.INT64 if inputs * n >= 1 << 31 else plc.TypeId.INT32)
    narrow = wide
    if n <= 1 << 16:
        narrow = plc.DataType(plc.TypeId.UINT8 if n <= 1 << 8 else plc.TypeId.UINT16)
    values = where._column.to_pylibcudf()
    asc, after = [plc.types.Order.ASCENDING], [plc.types.NullOrder.AFTER]
    order = plc.sorting.stable_sorted_order(plc.Table([plc.unary.cast(values, narrow)]), asc, after)
    runs = plc.filling.sequence(inputs, plc.Scalar.from_py(0, wide), plc.Scalar.from_py(1, wide))
    source = plc.filling.repeat(
        plc.Table([runs]), plc.Column.from_array(np.asarray(lengths, dtype=np.int32))
    ).columns()[0]
    op = plc.binaryop.BinaryOperator
    key = plc.binaryop.binary_operation(
        plc.unary.cast(values, wide), plc.Scalar.from_py(inputs, wide), op.MUL, wide
    )
    key = plc.binaryop.binary_operation(key, source, op.ADD, wide)
    ordered = plc.copying.gather(plc.Table([key]), order, plc.copying.OutOfBoundsPolicy.DONT_CHECK)
    needles = plc.filling.sequence(
        inputs * n + 1, plc.Scalar.from_py(0, wide), plc.Scalar.from_py(1, wide)
    )
    starts = plc.search.lower_bound(ordered, plc.Table([needles]), asc, after)
    counts = np.diff(cupy.asarray(starts).get().astype(np.int64)).reshape(n, inputs).T
    return cupy.asarray(order), np.ascontiguousarray(counts)


def main() -> None:
    import cudf
    import cupy
    import dask_cudf  # noqa: F401  (registers cuDF's dispatches)
    from dask.dataframe.shuffle import partitioning_index

    from dask_gpudirect.targets import device

    def sync() -> None:
        cupy.cuda.runtime.deviceSynchronize()

    def destinations(rows: int, n: int, seed: int = 0) -> Any:
        keys = np.random.default_rng(seed).integers(0, 2**62, rows)
        return partitioning_index(cudf.DataFrame({"key": keys}), n)

    where = destinations(1 << 20, 8)
    lengths = [1 << 19, 1 << 19]
    first_two_calls(
        "group order, 8 outputs (libcudf)", lambda: group_order_libcudf(where, lengths, 8), sync
    )
    first_two_calls(
        "group order, 8 outputs (CuPy)", lambda: device.group_order(where, lengths, 8), sync
    )

    for n in (1, 8, 300, 70_000):
        for lengths in ([1000], [0, 5000, 3], [4096] * 64):
            where = destinations(sum(lengths), n, seed=n)
            got_order, got_counts = group_order_libcudf(where, lengths, n)
            order, counts = device.group_order(where, lengths, n)
            same = bool((got_order.astype(cupy.int64) == order).all()) and np.array_equal(
                got_counts, counts
            )
            print(f"same result, {n} outputs, inputs of {lengths[:3]}...: {same}", flush=True)
            assert same, (n, lengths)

    for n in (8, 1024):
        where = destinations(CHUNK_ROWS, n)
        lengths = [CHUNK_ROWS // 4] * 4
        for name, fn in (("libcudf", group_order_libcudf), ("CuPy", device.group_order)):
            seconds = timed(partial(fn, where, lengths, n), sync)
            print(f"warm, {CHUNK_ROWS} rows, {n} outputs, {name}: {seconds * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
