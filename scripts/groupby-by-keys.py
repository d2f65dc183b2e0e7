"""cuDF's group-by sum of one ``bench etl`` partition's rows (54 Mi: an int64 key, x, y, z) by
the key's distinct values, sorted and not, alone on the GPU: what ``bench etl``'s group-by
tasks cost without a second worker on the same GPU. ``python3 scripts/groupby-by-keys.py``."""

import time

import cudf
import cupy

rows = 54 * 2**20
rs = cupy.random.RandomState(0)
base = {"x": rs.random_sample(rows), "y": rs.random_sample(rows), "z": rs.randint(0, 1000, rows)}
for keys in (1024, 65536, 2**24, 2**62):
    df = cudf.DataFrame({"k": rs.randint(0, keys, rows, dtype="int64"), **base})
    for sort in (True, False):
        ts = []
        for _ in range(4):
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            out = df.groupby("k", sort=sort).sum()
            cupy.cuda.runtime.deviceSynchronize()
            ts.append(time.perf_counter() - t0)
        print(
            f"keys {keys}: sort={sort}: {min(ts[1:]) * 1e3:.1f} ms, groups {len(out)}", flush=True
        )
