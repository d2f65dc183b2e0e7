"""How a device shuffle stage's split could cut its rows: the package's own (Dask's hash, a stable
radix sort of the output numbers, a gather) against libcudf's ``partition`` (stable, by a map of
output and input) and ``hash_partition`` (one call, murmur3; is its assignment Dask's, and does it
keep the rows' order?), on one ``bench etl`` partition's rows (54 Mi: an int64 key, x, y, z),
alone on the GPU. ``python3 scripts/split-kernels.py``."""

import time
from functools import partial

import cudf
import cupy
import numpy as np
import pylibcudf as plc
from dask.dataframe.shuffle import partitioning_index

from dask_gpudirect.shuffle.split import HashSplit
from dask_gpudirect.targets import device

rows = 54 * 2**20
rs = cupy.random.RandomState(0)
frame = cudf.DataFrame(
    {
        "key": rs.randint(0, 2**62, rows, dtype="int64"),
        "x": rs.random_sample(rows),
        "y": rs.random_sample(rows),
        "z": rs.randint(0, 1000, rows),
    }
)


def timed(f, reps=5):
    out = f()
    ts = []
    for _ in range(reps):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        out = f()
        cupy.cuda.runtime.deviceSynchronize()
        ts.append(time.perf_counter() - t0)
    return out, min(ts) * 1e3, float(np.median(ts)) * 1e3


def ours(split, parts):
    return split.split(list(range(len(parts))), parts)


def by_partition(n, lengths):
    """libcudf's stable partition by output, then input: the counts the stage needs."""
    inputs = len(lengths)
    where = partitioning_index(frame[["key"]], n)
    source = cupy.repeat(cupy.arange(inputs, dtype="int32"), lengths)
    index = cudf.Series(where.values.astype("int32") * inputs + source)
    table = device.to_table(frame, False)
    return plc.partitioning.partition(table, index._column.to_pylibcudf(), n * inputs)


def by_hash(n):
    return plc.partitioning.hash_partition(device.to_table(frame, False), [0], n)


for n in (4, 256, 1024):
    split = HashSplit(["key"], n, "device", frame.head(0), index=False)
    for inputs in (1, 2):
        parts = [frame] if inputs == 1 else [frame.iloc[: rows // 2], frame.iloc[rows // 2 :]]
        lengths = [len(p) for p in parts]
        (ordered, counts), best, med = timed(partial(ours, split, parts))
        print(f"n={n} inputs={inputs}: ours {best:.1f} ms (median {med:.1f})", flush=True)
        (table, offsets), best, med = timed(partial(by_partition, n, lengths))
        theirs = device.from_table(table, frame.head(0), False)
        same = bool((theirs["key"].values == ordered["key"].values).all())
        sizes = np.diff(np.asarray(list(offsets) + [len(frame)]))[: n * inputs]
        same_counts = bool((sizes.reshape(n, inputs).T == counts).all())
        print(
            f"n={n} inputs={inputs}: libcudf partition {best:.1f} ms (median {med:.1f}); "
            f"same rows in the same order {same}, same counts {same_counts}",
            flush=True,
        )
    (table, offsets), best, med = timed(partial(by_hash, n))
    theirs = device.from_table(table, frame.head(0), False)
    where = partitioning_index(frame[["key"]], n).values
    counts = cupy.bincount(where, minlength=n).get()
    sizes = np.diff(np.asarray(list(offsets) + [len(frame)]))[:n]
    order = ours(split, [frame])[0]
    stable = bool((theirs["key"].values == order["key"].values).all())
    print(
        f"n={n}: libcudf hash_partition {best:.1f} ms (median {med:.1f}); Dask's counts "
        f"{bool((sizes == counts).all())}, Dask's order {stable}",
        flush=True,
    )
