"""How one worker's share of a Parquet read could be cut into libcudf calls, timed on this GPU.

Issue 14: ``dg.read_parquet`` reads a worker's partition of small files in one libcudf call,
which reads every file's footer, then the column chunks (kvikio), then decodes: no overlap of
the reads with the decoding, and footers the worker planned from already are parsed again.
This times, outside Dask, one process per worker (``--procs``, all reading at once, as workers
sharing a GPU do), the same files read as:

- ``io only``: the files' bytes into device buffers by kvikio (the read's floor);
- ``decode only``: libcudf decoding those buffers (the decode's floor);
- ``1 call``: what dg does today; ``1 call, footers given``: with the parsed footers passed in;
- ``K calls``: the files cut into K runs, each decoded by its own thread on its own CUDA
  stream, then concatenated (reads of one overlap decodes of another).

    python3 scripts/parquet-read-variants.py --dir /var/tmp/dask-gpudirect-bench/etl \
        --gib 2 --files 256 --procs 2 --json $OUT/read-variants.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

COLUMNS = ["key", "x", "y", "z"]
KVIKIO = {"threads": 16, "task_size": 4 << 20, "compat_mode": "AUTO"}


def _variants(paths: list[str], calls: list[int]) -> dict:
    """Each variant as a function of no arguments that reads ``paths`` and waits for the GPU."""
    import cupy
    import kvikio
    import pylibcudf as plc
    import rmm
    from rmm.pylibrmm.stream import Stream

    from dask_gpudirect.targets.device import configure_kvikio

    configure_kvikio(KVIKIO)
    footers = plc.io.parquet_metadata.read_parquet_footers(plc.io.SourceInfo(paths))

    def options(sources: list) -> plc.io.parquet.ParquetReaderOptions:
        built = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo(sources)).build()
        built.set_column_names(COLUMNS)
        return built

    def io_only() -> list:
        files = [kvikio.CuFile(path, "r") for path in paths]
        buffers = [rmm.DeviceBuffer(size=os.path.getsize(p)) for p in paths]
        reads = [f.pread(cupy.asarray(b)) for f, b in zip(files, buffers, strict=True)]
        for read in reads:
            read.get()
        for f in files:
            f.close()
        return buffers

    loaded = io_only()

    def decode_only() -> None:
        plc.io.parquet.read_parquet(options(loaded))

    def one_call(given: bool) -> None:
        plc.io.parquet.read_parquet(options(paths), parquet_metadatas=footers if given else None)

    pool = ThreadPoolExecutor(max(calls))

    def k_calls(k: int, given: bool) -> None:
        runs = [list(range(i, len(paths), k)) for i in range(k)]  # file i to call i % k

        def one(run: list[int]):
            stream = Stream()
            table = plc.io.parquet.read_parquet(
                options([paths[i] for i in run]),
                stream=stream,
                parquet_metadatas=[footers[i] for i in run] if given else None,
            ).tbl
            stream.synchronize()
            return table

        tables = list(pool.map(one, runs))
        plc.concatenate.concatenate(tables)

    def sync(fn):
        def run() -> None:
            fn()
            cupy.cuda.runtime.deviceSynchronize()

        return run

    variants = {
        "footers": lambda: plc.io.parquet_metadata.read_parquet_footers(plc.io.SourceInfo(paths)),
        "io only": io_only,
        "decode only": decode_only,
        "1 call": lambda: one_call(False),
        "1 call, footers given": lambda: one_call(True),
    }
    for k in calls:
        variants[f"{k} calls"] = lambda k=k: k_calls(k, False)
        variants[f"{k} calls, footers given"] = lambda k=k: k_calls(k, True)
    return {name: sync(fn) for name, fn in variants.items()}


def _worker(rank: int, paths: list[str], calls: list[int], repeat: int, barrier, out) -> None:
    """One process: every variant, ``repeat`` times after a warm-up, in step with the others;
    a variant that fails is left out, its error printed."""
    import traceback

    seconds: dict[str, list[float]] = {}
    try:
        variants = _variants(paths, calls)
        for name, fn in variants.items():
            for i in range(repeat + 1):
                barrier.wait(timeout=120)
                start = time.perf_counter()
                try:
                    fn()
                except Exception:
                    traceback.print_exc()
                    continue
                elapsed = time.perf_counter() - start
                if i:
                    seconds.setdefault(name, []).append(elapsed)
    except Exception:
        traceback.print_exc()
    out.put((rank, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/var/tmp/dask-gpudirect-bench/etl")
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--files", type=int, default=256)
    parser.add_argument("--keys", type=int, default=2**24)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--calls", default="2,4,8")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    from dask_gpudirect.bench.datasets import dataset

    print("writing or reusing the data", flush=True)
    paths, _ = dataset(args.dir, "etl", args.gib, args.files, keys=[args.keys])
    print("data ready", flush=True)
    calls = [int(c) for c in args.calls.split(",")]
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(args.procs), ctx.Queue()
    shares = [paths[r :: args.procs] for r in range(args.procs)]
    procs = [
        ctx.Process(target=_worker, args=(r, shares[r], calls, args.repeat, barrier, out))
        for r in range(args.procs)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    nbytes = sum(os.path.getsize(p) for p in paths)
    rows = []
    for name in results[0]:
        if any(len(results[r].get(name, ())) != args.repeat for r in results):
            continue  # failed somewhere
        # a repetition's wall time: the slowest process of it (they started together)
        walls = [max(results[r][name][i] for r in results) for i in range(args.repeat)]
        rows.append({"variant": name, "median_s": statistics.median(walls), "best_s": min(walls)})
    print(f"{len(paths)} files, {nbytes / 1e9:.2f} GB, {args.procs} process(es) at once")
    print(f"{'variant':28} {'median ms':>10} {'best ms':>8} {'GB/s':>7}")
    for row in rows:
        gbps = nbytes / row["median_s"] / 1e9
        print(
            f"{row['variant']:28} {row['median_s'] * 1e3:10.1f} {row['best_s'] * 1e3:8.1f} "
            f"{gbps:7.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "bytes": nbytes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
