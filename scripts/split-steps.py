# ruff: noqa: B023  (each step runs inside the iteration that made it)
"""What each step of a shuffle stage's split of one chunk costs on the GPU, and what the outputs
cost a frame: where the stage's ``split`` and ``combine`` phases go at 8 and 1024 partitions.

Issue 14: at 8.59 GB on one H200 the slowest stage's split took 95-141 ms and its combine 14-127
ms (8 / 1024 partitions). This times, in one process and on one chunk of ``--gib`` cut into
``--inputs`` inputs and split into each of ``--parts`` outputs, the steps the stage takes
(join, hash, counts, order, gather; then the cut into output frames and their first sizeof)
and the alternatives to them. Run on the GPU machine:

    python3 scripts/split-steps.py --gib 2 --inputs 2,64 --parts 8,256,1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import numpy as np
from best_of import timed
from cupy_split import segment_of


def lean_cut(frame, bounds: np.ndarray) -> list:
    """``frame`` cut at ``bounds`` into frames that view it: one libcudf split, and each frame
    made from its columns with ``frame``'s names and types, without cuDF's per-frame checks."""
    import cudf
    import pylibcudf as plc
    from cudf.core.column import ColumnBase

    index, data = list(frame.index._columns), list(frame._columns)
    dtypes = [c.dtype for c in index + data]
    table = plc.Table([c.to_pylibcudf() for c in index + data])
    name = frame.index.name
    out = []
    for part in plc.copying.split(table, [int(b) for b in bounds[1:-1]]):
        cols = [ColumnBase.create(c, t) for c, t in zip(part.columns(), dtypes, strict=True)]
        idx = cudf.Index._from_column(cols[0], name=name)
        ca = frame._data._from_columns_like_self(cols[1:], verify=False)
        out.append(cudf.DataFrame._from_data(ca, index=idx))
    return out


def counts_by_search(values, lengths: list[int], n: int):
    """``counts[k, j]`` from a stable order by value: rows ordered by (value, input), so one
    search of the ``n * k`` boundaries, where ``bincount`` piles every row onto few counters."""
    import cupy

    order = cupy.argsort(values.astype(np.min_scalar_type(max(n - 1, 0))))
    k = len(lengths)
    source = segment_of(order, np.asarray(lengths))
    composite = values[order].astype(cupy.int64) * k + source
    edges = cupy.searchsorted(composite, cupy.arange(n * k + 1, dtype=cupy.int64))
    return order, cupy.diff(edges).reshape(n, k).T.get()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--inputs", default="2,64")
    parser.add_argument("--parts", default="8,256,1024")
    parser.add_argument("--json")
    args = parser.parse_args()

    import cudf
    import cupy
    import dask_cudf  # noqa: F401  (registers cuDF's sizeof and dispatches)
    import pylibcudf as plc
    import rmm
    from dask.dataframe.shuffle import partitioning_index
    from dask.sizeof import sizeof
    from rmm.allocators.cupy import rmm_cupy_allocator

    from dask_gpudirect.shuffle.split import HashSplit
    from dask_gpudirect.targets import device as target

    rmm.reinitialize(pool_allocator=True, initial_pool_size=40 * 2**30)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    rows = int(args.gib * 2**30 / 32)
    rng = np.random.default_rng(0)
    frame = cudf.DataFrame(
        {
            "key": rng.integers(0, 2**62, rows),
            "x": rng.random(rows),
            "y": rng.random(rows),
            "z": np.arange(rows),
        }
    )
    meta = frame.iloc[:0]
    results = []
    for k in [int(i) for i in args.inputs.split(",")]:
        cuts = np.linspace(0, rows, k + 1).astype(np.int64)
        parts = [frame.iloc[a:b].copy() for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        lengths = [len(p) for p in parts]
        joined = target.concat_frames(parts, meta)
        for n in [int(p) for p in args.parts.split(",")]:
            where = partitioning_index(joined[["key"]], n)
            values = cupy.asarray(where.values)
            narrow = values.astype(np.min_scalar_type(max(n - 1, 0)))
            source = segment_of(cupy.arange(rows, dtype=cupy.int64), np.asarray(lengths))
            order, counts = target.group_order(where, lengths, n)
            ordered = joined.take(order)
            bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
            table = target.to_table(joined)
            order_col = plc.Column.from_array(order)
            steps: dict[str, Callable[[], object]] = {
                "split as the stage does (all)": lambda: HashSplit(
                    ["key"], n, "device", meta
                ).split(list(range(k)), parts),
                "join the inputs": lambda: target.concat_frames(parts, meta),
                "hash (partitioning_index)": lambda: partitioning_index(joined[["key"]], n),
                "hash (murmur3 in pylibcudf)": lambda: plc.hashing.murmurhash3_x86_32(
                    plc.Table([table.columns()[1]]), 0
                ),
                "source of each row (arange + searchsorted)": lambda: segment_of(
                    cupy.arange(rows, dtype=cupy.int64), np.asarray(lengths)
                ),
                "bincount of source * n + value": lambda: cupy.bincount(
                    source * n + values.astype(cupy.int64), minlength=k * n
                ).get(),
                "argsort of the narrow values": lambda: cupy.argsort(narrow),
                "group_order (all)": lambda: target.group_order(where, lengths, n),
                "argsort + counts by search": lambda: counts_by_search(values, lengths, n),
                "take(order) in cuDF": lambda: joined.take(order),
                "gather in pylibcudf, no bounds check": lambda: plc.copying.gather(
                    table, order_col, plc.copying.OutOfBoundsPolicy.DONT_CHECK
                ),
                "cut into N frames: cuDF _split (cut_frame)": lambda: target.cut_frame(
                    ordered, bounds
                ),
                "cut into N frames: lean": lambda: lean_cut(ordered, bounds),
                "cut + first sizeof: cuDF _split": lambda: [
                    sizeof(p) for p in target.cut_frame(ordered, bounds)
                ],
                "cut + first sizeof: lean": lambda: [sizeof(p) for p in lean_cut(ordered, bounds)],
            }
            check = lean_cut(ordered, bounds)
            ref = target.cut_frame(ordered, bounds)
            assert all(a.equals(b) for a, b in zip(check, ref, strict=True))
            assert np.array_equal(counts_by_search(values, lengths, n)[1], counts)
            for step, fn in steps.items():
                seconds = timed(fn, cupy.cuda.get_current_stream().synchronize)
                results.append({"inputs": k, "partitions": n, "step": step, "seconds": seconds})
                print(f"{k:4d} {n:5d}  {step:48s} {seconds * 1e3:9.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gib": args.gib, "rows": rows, "results": results}, f)


if __name__ == "__main__":
    main()
