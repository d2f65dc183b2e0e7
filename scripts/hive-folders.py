"""A read of many one-file hive folders (``k=0/`` ... ``k=N-1/``) on one GPU: ``dg.read_parquet``
against ``dask_cudf.read_parquet``, both persisted, warm; the median of three runs after a
first. Each checks the same sums (x, and the folder key as integers).

Run on the lent GPU machine from a folder outside the repository, so that ``PYTHONPATH`` picks
the tree measured (an older tree unpacked with ``git archive REV dask_gpudirect | tar -x -C
_before`` measures "before"):

    PYTHONPATH=$REPO:/tmp/site TAG=after python3 $REPO/scripts/hive-folders.py

``N`` folders (1000) of ``ROWS`` rows (20,000) under ``ROOT`` (/var/tmp/hive), written once;
the results go to ``$OUT/hive-$TAG.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.environ.get("ROOT", "/var/tmp/hive")
N, ROWS = int(os.environ.get("N", 1000)), int(os.environ.get("ROWS", 20000))
TAG = os.environ.get("TAG", "after")


def write() -> None:
    if os.path.exists(f"{ROOT}/done{N}"):
        return
    rng = np.random.default_rng(0)
    for i in range(N):
        folder = f"{ROOT}/k={i}"
        os.makedirs(folder, exist_ok=True)
        columns = {
            "a": rng.integers(0, 1 << 30, ROWS),
            "x": rng.random(ROWS),
            "y": rng.random(ROWS),
        }
        pq.write_table(pa.table(columns), f"{folder}/part.parquet")
    open(f"{ROOT}/done{N}", "w").close()


def main() -> None:
    write()
    import dask_cudf
    from distributed import Client, wait

    import dask_gpudirect as dg

    print(TAG, dg.__file__, flush=True)
    out: dict = {"tag": TAG, "N": N, "rows": ROWS}
    plugins = {dg.GPUDirectPlugin()}
    with (
        dg.LocalCUDACluster(n_workers=1, protocol="tcp", plugins=plugins) as cluster,
        Client(cluster),
    ):

        def timed(make):
            seconds = []
            for _ in range(4):
                start = time.perf_counter()
                df = make().persist()
                wait(df)
                seconds.append(time.perf_counter() - start)
                sums = (float(df.x.sum().compute()), int(df.k.astype("int64").sum().compute()))
                npartitions = df.npartitions
                del df
            return {
                "seconds": statistics.median(seconds[1:]),
                "first": seconds[0],
                "npartitions": npartitions,
                "xsum": sums[0],
                "ksum": sums[1],
            }

        reads = {
            "dg": lambda: dg.read_parquet(ROOT),
            "dask_cudf": lambda: dask_cudf.read_parquet(ROOT),
        }
        for name, make in reads.items():
            try:
                out[name] = timed(make)
            except Exception as exc:
                out[name] = {"error": repr(exc)[:500]}
            print(name, out[name], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"hive-{TAG}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
