"""Why dg.read_parquet trails dask_cudf.read_parquet on one GPU (issue 14's read target): the
same 8 files (3 GB of Parquet, bench read's data) read in one cluster by dask_cudf, by
dg.read_parquet at its auto blocksize and at 1, 2 and 4 GB, and by cudf.read_parquet tasks of
1, 3 and 5 groups of files, alternating, the first round left out. Run on the GPU machine:

    source scripts/lent-machine.sh; python3 -u scripts/read-partition-sizes.py THREADS [RMM_POOL]

(one worker of THREADS threads, e.g. ``1`` or ``4 40GB``); prints each run and the medians and
writes exp-read-THREADS.json into $OUT."""

import json
import os
import statistics
import sys
import time

from distributed import wait

import dask_gpudirect as dg
from dask_gpudirect.bench.datasets import dataset
from dask_gpudirect.measure import start_cluster


def main():
    d = "/var/tmp/dask-gpudirect-bench/exp-parquet"
    os.makedirs(d, exist_ok=True)
    print("data", flush=True)
    paths, info = dataset(d, "parquet", 3, 8)
    print("data done", flush=True)
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 26):
                pass
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    pool = sys.argv[2] if len(sys.argv) > 2 else None
    cluster, client = start_cluster("device", 1, threads, "tcp", pool)
    out = {"info": info, "threads": threads, "pool": pool, "runs": {}}

    def dcudf():
        import dask_cudf

        return dask_cudf.read_parquet(d)

    def dgr(bs):
        return lambda: dg.read_parquet(d, client=client, blocksize=bs)

    def per_worker(groups):
        def read(files):
            import cudf

            return cudf.read_parquet(files)

        return lambda: [client.submit(read, g, pure=False) for g in groups]

    configs = [
        ("dask_cudf", dcudf),
        ("dg auto", dgr(None)),
        ("dg 1GB", dgr("1GB")),
        ("dg 2GB", dgr("2GB")),
        ("dg 4GB", dgr("4GB")),
        ("cudf 3 groups", per_worker([paths[0:3], paths[3:6], paths[6:8]])),
        ("cudf 5 groups", per_worker([paths[0:2], paths[2:4], paths[4:6], paths[6:7], paths[7:8]])),
        ("cudf 1 group", per_worker([paths])),
    ]
    print("cluster up", flush=True)
    for rnd in range(3):
        for name, build in configs:
            t0 = time.perf_counter()
            coll = build()
            t1 = time.perf_counter()
            if isinstance(coll, list):
                wait(coll)
                n = len(coll)
            else:
                n = coll.npartitions
                coll = coll.persist()
                wait(coll)
            t2 = time.perf_counter()
            print(rnd, name, n, round(t2 - t0, 3), flush=True)
            del coll
            if rnd:
                r = out["runs"].setdefault(name, {"plan": [], "total": [], "n": n})
                r["plan"].append(t1 - t0)
                r["total"].append(t2 - t0)
            client.run(lambda: __import__("gc").collect())
    for name, r in out["runs"].items():
        tot = statistics.median(r["total"])
        print(
            f"{name:16s} n={r['n']:2d} plan {statistics.median(r['plan']):.3f}s "
            f"total {tot:.3f}s {info['bytes'] / tot / 1e9:6.2f} GB/s  "
            f"all {[round(x, 3) for x in r['total']]}"
        )
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"exp-read-{threads}.json"), "w"))
    client.close()
    cluster.close()


if __name__ == "__main__":
    main()
