"""Where the time of one run of ``bench etl``'s dg pipeline goes between the processes.

Issue 14: on one H200 shared by two workers each phase of the pipeline (read, shuffle,
group-by) took 20-30 ms more than its longest task. This runs the pipeline as the bench does
(``dg.shuffle`` of the unpersisted ``dg.read_parquet(...)``, a group-by per partition, waited for)
in the bench's cluster and prints one run's timeline, in ms from its start, from the clocks of
the one machine: the client's calls, and for every task the scheduler's transitions and the
workers' (the task received, started, finished) from Distributed's own stories.

    python3 scripts/etl-timeline.py --json $OUT/etl-timeline.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time

from etl_arguments import add_cluster_and_data


def _scheduler_story(dask_scheduler, keys: list, since: float) -> list:
    """The transitions of ``keys`` and of the shuffle's stage tasks (named by the shuffle)."""
    stages = {
        s[0]
        for s in dask_scheduler.transition_log
        if isinstance(s[0], str) and s[0].startswith("gpudirect-shuffle-") and s[-1] >= since
    }
    return [(str(s[0]), s[1], s[2], s[-1]) for s in dask_scheduler.story(*keys, *stages)]


def _worker_story(dask_worker, keys: list, since: float) -> list:
    stages = {
        s[0]
        for s in dask_worker.state.log
        if isinstance(s[0], str) and s[0].startswith("gpudirect-shuffle-") and s[-1] >= since
    }
    return [
        (str(s[0]), str(s[1]), str(s[2]), float(s[-1]))
        for s in dask_worker.state.story(*keys, *stages)
        if isinstance(s[-1], float)
    ]


def _pipeline(client, paths: list[str], columns: list[str], key: str, marks: list) -> tuple:
    """One run of the bench's dg pipeline, each call's start in ``marks``; the read's partition
    keys and the result."""
    from distributed import wait

    import dask_gpudirect as dg
    from dask_gpudirect.bench.etl import _sum_by  # the bench's own group-by

    def mark(name: str) -> None:
        marks.append((name, time.time()))

    mark("read_parquet")
    df = dg.read_parquet(paths, columns=columns, client=client)
    mark("shuffle")  # of the read, unpersisted: the stages take the partitions as they are read
    shuffled = dg.shuffle(df, key, client=client)
    mark("persist group-by")
    out = shuffled.map_partitions(_sum_by, key, meta=_sum_by(shuffled._meta, key)).persist()
    mark("wait group-by")
    wait(out)
    mark("end")
    return df.optimize().__dask_keys__(), out


def main() -> None:
    from dask_gpudirect.bench.datasets import dataset, key_column

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_and_data(parser)
    parser.add_argument("--key", default=key_column(2**24))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="profile one more run's client")
    parser.add_argument("--json")
    args = parser.parse_args()

    from dask.base import tokenize
    from distributed import futures_of

    import dask_gpudirect as dg
    from dask_gpudirect.bench.common import wait_released
    from dask_gpudirect.cluster import progress_ucx_in_a_thread
    from dask_gpudirect.measure import start_cluster, stop_cluster
    from dask_gpudirect.shuffle import coordinator

    progress_ucx_in_a_thread()
    paths, _ = dataset(args.dir, "etl", args.gib, args.files, keys=[2**24])
    cluster, client = start_cluster(args.target, args.workers, 1, args.protocol, "40GB")
    columns = [args.key, "x", "y", "z"]
    try:
        for _ in range(args.runs):
            marks: list[tuple[str, float]] = []
            read, out = _pipeline(client, paths, columns, args.key, marks)
            keys = [*read, *(f.key for f in futures_of(out))]
            stages = dict(coordinator.last_phases)
            sched = client.run_on_scheduler(_scheduler_story, keys=keys, since=marks[0][1])
            workers = client.run(_worker_story, keys=keys, since=marks[0][1])
            del out
            wait_released(client)
        if args.profile:  # one more run, the client's thread profiled
            profile = cProfile.Profile()
            profile.enable()
            _pipeline(client, paths, columns, args.key, [])
            profile.disable()
            wait_released(client)
        meta = dg.read_parquet(paths, columns=columns, client=client)._meta
        tokens = []  # what naming an expression that holds the meta costs
        for _ in range(20):
            start = time.perf_counter()
            tokenize(meta)
            tokens.append(time.perf_counter() - start)
    finally:
        stop_cluster(cluster, client, print)
    t0 = marks[0][1]
    events = [(t - t0, "client", name) for name, t in marks]
    events += [(t - t0, "scheduler", f"{k[-60:]} {a}->{b}") for k, a, b, t in sched]
    for w, story in workers.items():
        name = f"worker {w.rsplit(':', 1)[-1]}"
        events += [(t - t0, name, f"{k[-60:]} {a} {b[:30]}") for k, a, b, t in story]
    events = sorted(e for e in events if e[0] > -0.001)
    for at, who, what in events:
        print(f"{at * 1e3:8.1f} ms  {who:14} {what}")
    if args.profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    print(f"tokenize(meta) on the client: median {statistics.median(tokens) * 1e3:.2f} ms")
    print("client shuffle phases:", {k: round(v * 1e3, 1) for k, v in stages.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "events": events, "shuffle": stages, "tokenize_s": tokens},
                f,
                indent=1,
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
