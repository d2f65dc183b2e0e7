"""What one Dask round trip costs in the bench's cluster, by UCXX progress mode, on this machine.

Issue 14: on one H200 shared by two workers, each phase of ``bench etl``'s dg pipeline (the read,
the group-by) took about 30 ms more than its longest task, and the survey 20 ms. This times the
round trips those phases are made of, in ``measure.start_cluster``'s cluster (the bench's), with
UCXX progressed as ``--mode`` says (in this process and the workers):

- ``run``: ``client.run`` of a no-op on every worker; ``run_on_scheduler``: of a no-op;
- ``submit``: one no-op task per worker, waited for;
- ``persist``: a 2-partition ``from_map`` of tiny frames, built, then persisted and waited for,
  and split into the time before the first task started and after the last one stopped (the
  workers' clocks, as Distributed records a task's start and stop);
- ``survey``: the read's survey of the files (:func:`dask_gpudirect.cluster.survey`);
- ``read``: ``dg.read_parquet(files)`` (planned from the cache), then persisted and split the
  same way.

    for mode in thread blocking thread-polling; do
        python3 scripts/dask-round-trips.py --mode $mode --json $OUT/rt-$mode.json; done
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from etl_arguments import add_cluster_and_data


def _noop(**_: object) -> None:
    return None


def _tiny(i: int, target: str):
    """A one-row frame of the target's type."""
    if target == "device":
        import cudf

        return cudf.DataFrame({"a": [i]})
    import pandas

    return pandas.DataFrame({"a": [i]})


def _timed_persist(client, make) -> dict[str, float]:
    """Seconds of one persist-and-wait, and how much of it came before the first task started,
    inside the tasks, and after the last one stopped."""
    from distributed import futures_of, wait

    from dask_gpudirect.bench.common import wait_released
    from dask_gpudirect.bench.etl import compute_spans

    frame = make()
    start = time.time()
    frame = frame.persist()
    wait(frame)
    end = time.time()
    keys = [f.key for f in futures_of(frame)]
    spans = [s for found in client.run(compute_spans, keys=keys).values() for s in found]
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    del frame
    wait_released(client)  # the next persist of the same keys computes them again
    return {
        "total": end - start,
        "before": first - start,
        "tasks": last - first,
        "after": end - last,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="thread")
    add_cluster_and_data(parser)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    os.environ["UCXPY_PROGRESS_MODE"] = args.mode
    os.environ["UCXPY_ENABLE_PYTHON_FUTURE"] = "1"

    import dask.dataframe as dd
    from distributed import wait

    import dask_gpudirect as dg
    from dask_gpudirect import discovery
    from dask_gpudirect.bench.datasets import dataset, key_column
    from dask_gpudirect.cluster import survey
    from dask_gpudirect.measure import start_cluster, stop_cluster

    paths, _ = dataset(args.dir, "etl", args.gib, args.files, keys=[2**24])
    cluster, client = start_cluster(args.target, args.workers, 1, args.protocol, "40GB")
    workers = list(client.nthreads())
    listing = discovery.Listing(None, recursive=True)
    probes = {
        "run": lambda: client.run(_noop),
        "run_on_scheduler": lambda: client.run_on_scheduler(_noop),
        "submit": lambda: wait([client.submit(_noop, pure=False, workers=[w]) for w in workers]),
        "survey": lambda: survey(client, paths, listing),
    }
    persists = {
        "persist": lambda: dd.from_map(_tiny, range(len(workers)), target=args.target),
        "read": lambda: dg.read_parquet(
            paths, columns=[key_column(2**24), "x", "y", "z"], client=client
        ),
    }
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, fn in probes.items():
            fn()
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            rows[name] = {"median": statistics.median(times), "best": min(times)}
        for name, make in persists.items():
            _timed_persist(client, make)
            runs = [_timed_persist(client, make) for _ in range(args.repeat)]
            for part in runs[0]:
                rows[f"{name}: {part}"] = {
                    "median": statistics.median(r[part] for r in runs),
                    "best": min(r[part] for r in runs),
                }
    finally:
        stop_cluster(cluster, client, print)
    print(f"mode {args.mode}, {args.workers} workers, {args.protocol}, target {args.target}")
    for name, row in rows.items():
        print(f"{name:22} median {row['median'] * 1e3:7.2f} ms  best {row['best'] * 1e3:7.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
