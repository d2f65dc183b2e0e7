"""What a shuffle stage's per-partition work costs on this machine, one primitive at a time.

Issue 14: ``dg.shuffle`` spends milliseconds per partition on the GPU, outside the exchange.
This times, in one process and on one frame cut into N partitions, each cuDF (device) or pandas
(host) step a stage may take per input or per output, so that the stage can be built from the
cheap ones. Run on the GPU machine:

    python3 scripts/shuffle-primitives.py --target device --gib 1 --parts 8,256,1024

Prints a table of milliseconds per partition (and in all) and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from best_of import timed
from cupy_split import segment_of


def slices(frame, bounds: np.ndarray, copy: bool) -> list:
    """``frame`` cut at ``bounds``: views of it, or copies with memory of their own."""
    cut = [frame.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [c.copy() for c in cut] if copy else cut


def profiled(steps: dict[str, Callable[[], object]], path: str, top: int = 25) -> None:
    """cProfile of each step (one run, after the timed ones), its ``top`` functions by own
    time, appended to ``path``: where a per-partition cost goes inside cuDF or Dask."""
    import cProfile
    import io
    import pstats

    with open(path, "a") as out:
        for step, fn in steps.items():
            profile = cProfile.Profile()
            profile.runcall(fn)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
            out.write(f"## {step}\n\n{text.getvalue()}\n")


def group_order_int64(where, lengths: list[int], n: int):
    """The group order as the stage made it before: int64 sort keys (eight radix passes)."""
    import cupy

    values = cupy.asarray(where.values).astype(cupy.int64)
    source = segment_of(cupy.arange(len(values), dtype=cupy.int64), np.asarray(lengths))
    counts = cupy.bincount(source * n + values, minlength=len(lengths) * n)
    return cupy.argsort(values), counts.get().reshape(len(lengths), n)


def splitter(n: int, meta):
    """The stage's own splitter on ``key`` into ``n`` outputs."""
    from dask_gpudirect.shuffle.split import HashSplit

    return HashSplit(["key"], n, "device", meta)


def received_halves(joined, n: int, meta) -> tuple[list, object, np.ndarray]:
    """What a receiver holds when two senders each split half of ``joined``: their pieces,
    the segments that list the outputs' rows, and the outputs' bounds."""
    from dask_gpudirect.shuffle.split import assembly_segments

    half = len(joined) // 2
    frames, pieces = [], []
    for i, part in enumerate((joined.iloc[:half].copy(), joined.iloc[half:].copy())):
        ordered, counts = splitter(n, meta).split([i], [part])
        frames.append(ordered)
        pieces.append(((i,), 0, counts))
    segments, sizes = assembly_segments(pieces, range(n))
    return frames, segments, np.concatenate([[0], np.cumsum(sizes)])


def outputs_by(few: int, n: int, meta, received: tuple) -> list:
    """The stage's outputs of ``received`` with ``split.FEW_SEGMENTS`` set to ``few``: 0 forces
    the join and gather, a large number the slices."""
    from dask_gpudirect.shuffle import split

    frames, segments, bounds = received
    kept, split.FEW_SEGMENTS = split.FEW_SEGMENTS, few
    try:  # a copy of the list: ``outputs`` empties it, and each timed repeat reuses the pieces
        return splitter(n, meta).outputs(list(frames), segments, bounds, range(n), {})
    finally:
        split.FEW_SEGMENTS = kept


_WORKER: list = []


def kept(parts: list) -> None:
    """``parts`` put into a real (in-process) worker's memory as the shuffle keeps its outputs,
    then freed: the worker's state machine, its data buffer and Dask's sizeof, per key."""
    from distributed import LocalCluster
    from distributed.utils import sync
    from distributed.worker_state_machine import FreeKeysEvent

    if not _WORKER:
        cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
        _WORKER.extend([cluster, next(iter(cluster.workers.values()))])
    worker = _WORKER[1]
    keys = [("primitives", i) for i in range(len(parts))]

    async def put() -> None:
        worker.update_data(dict(zip(keys, parts, strict=True)))

    async def free() -> None:
        worker.handle_stimulus(FreeKeysEvent(keys=keys, stimulus_id=f"free-{time.time()}"))

    sync(worker.loop, put)
    sync(worker.loop, free)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", choices=["host", "device"], default="device")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--parts", default="8,256,1024")
    parser.add_argument("--json")
    parser.add_argument("--profile", help="append cProfiles of the per-output steps here")
    parser.add_argument("--rmm-pool", action="store_true", help="an RMM pool, as the workers have")
    args = parser.parse_args()
    device = args.target == "device"
    if device and args.rmm_pool:
        import cupy
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator

        rmm.reinitialize(pool_allocator=True, initial_pool_size=40 * 2**30)
        cupy.cuda.set_allocator(rmm_cupy_allocator)
    rows = int(args.gib * 2**30 / 32)
    rng = np.random.default_rng(0)
    data = {
        "key": rng.integers(0, 2**62, rows),
        "x": rng.random(rows),
        "y": rng.random(rows),
        "z": np.arange(rows),
    }
    from dask.dataframe.shuffle import partitioning_index
    from dask.sizeof import sizeof

    if device:
        import cudf
        import cupy
        import dask_cudf  # noqa: F401  (registers cuDF's sizeof and dispatches)
        import pylibcudf as plc

        from dask_gpudirect.targets import device as target

        frame = cudf.DataFrame(data)

        def sync() -> None:
            cupy.cuda.get_current_stream().synchronize()

        xp = cupy
    else:
        import pandas as pd

        from dask_gpudirect.targets import host as target

        frame = pd.DataFrame(data)

        def sync() -> None:
            pass

        xp = np
    from dask.dataframe.dispatch import concat

    results = []
    for n in [int(p) for p in args.parts.split(",")]:
        bounds = np.linspace(0, rows, n + 1).astype(np.int64)
        parts = [frame.iloc[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        lengths = [len(p) for p in parts]
        joined = concat(parts)
        order = xp.arange(rows)
        steps: dict[str, Callable[[], object]] = {
            "concat of the N inputs": lambda parts=parts: concat(parts),
            "hash + group order (one chunk)": lambda joined=joined, n=n, lengths=lengths: (
                target.group_order(partitioning_index(joined[["key"]], n), lengths, n)
            ),
            "take per output (N gathers)": lambda joined=joined, bounds=bounds, order=order: [
                joined.take(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ],
            "one take, N slices (views)": lambda joined=joined, bounds=bounds, order=order: slices(
                joined.take(order), bounds, copy=False
            ),
            "one take, N slice copies": lambda joined=joined, bounds=bounds, order=order: slices(
                joined.take(order), bounds, copy=True
            ),
            "sizeof of N outputs": lambda parts=parts: [sizeof(p) for p in parts],
            "sizeof of N slices of one frame": lambda joined=joined, bounds=bounds: [
                sizeof(p) for p in slices(joined, bounds, copy=False)
            ],
        }
        if device:

            def contiguous(joined=joined, bounds=bounds, order=order):
                table = target.to_table(joined.take(order))
                views = plc.copying.split(table, [int(b) for b in bounds[1:-1]])
                return [target.from_table(v, joined.iloc[:0]) for v in views]

            def plc_concat(parts=parts):
                tables = [target.to_table(p) for p in parts]
                return target.from_table(plc.concatenate.concatenate(tables), parts[0].iloc[:0])

            steps["one take + pylibcudf split + N frames (views)"] = contiguous
            steps["concat through pylibcudf tables"] = plc_concat
            steps["one take, cuDF _split (views: the stage's cut_frame)"] = (
                lambda joined=joined, bounds=bounds, order=order: target.cut_frame(
                    joined.take(order), bounds
                )
            )
            steps["sizeof of N cut_frame outputs"] = lambda j=joined, b=bounds: [
                sizeof(p) for p in target.cut_frame(j, b)
            ]
            steps["concat_frames of the N inputs (the stage's join)"] = (
                lambda parts=parts, meta=frame.iloc[:0]: target.concat_frames(parts, meta)
            )
            meta = frame.iloc[:0]
            received = received_halves(joined, n, meta)
            steps["hash alone (partitioning_index)"] = lambda joined=joined, n=n: (
                partitioning_index(joined[["key"]], n)
            )
            steps["group order, int64 sort keys"] = lambda joined=joined, n=n, lengths=lengths: (
                group_order_int64(partitioning_index(joined[["key"]], n), lengths, n)
            )
            steps["split as the stage does (join, hash, group order, take)"] = (
                lambda parts=parts, n=n, meta=meta: splitter(n, meta).split(
                    list(range(len(parts))), parts
                )
            )
            steps["outputs of 2 pieces: join, gather, cut (many segments)"] = (
                lambda n=n, meta=meta, received=received: outputs_by(0, n, meta, received)
            )
            steps["outputs of 2 pieces: one concatenate of slices, cut (few segments)"] = (
                lambda n=n, meta=meta, received=received: outputs_by(10**9, n, meta, received)
            )
            steps["group-by sum of each of the N partitions"] = lambda parts=parts: [
                p.groupby("key").sum() for p in parts
            ]
        steps["worker.update_data of N outputs, then freed"] = lambda parts=parts: kept(parts)
        steps["worker.update_data of N slices, then freed"] = lambda j=joined, b=bounds: kept(
            slices(j, b, copy=False)
        )
        steps["worker.update_data of N cut_frame outputs, then freed"] = (
            lambda j=joined, b=bounds: kept(target.cut_frame(j, b))
        )  # fmt: skip
        for step, fn in steps.items():
            seconds = timed(fn, sync)
            results.append({"partitions": n, "step": step, "seconds": seconds})
            print(f"{n:6d}  {step:42s} {seconds * 1e3:9.2f} ms  {seconds / n * 1e6:9.1f} us/part")
        if args.profile and n == max(int(p) for p in args.parts.split(",")):
            per_output = ("sizeof", "cut_frame", "slices (views)", "concat_frames", "update_data")
            profiled({k: f for k, f in steps.items() if any(w in k for w in per_output)},
                     args.profile)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "gib": args.gib, "rows": rows, "results": results}, f)


if __name__ == "__main__":
    main()
