"""Where a worker's ``dg.shuffle`` stage spends its time as the partition count grows.

Issue 14: on one GPU shared by two workers the stage of 8 GiB took 0.21 s at 8 partitions and
0.55 s at 1024 (the splitting, building and keeping each grew by 0.05-0.12 s). The bench's
input (``bench shuffle``'s frame, its partitions dealt to the workers in turn or, with
``--placement blocks``, in blocks of consecutive ones) is shuffled twice
warm; the third run's stage is profiled (cProfile, wall clock) in each worker's stage thread,
and the ``--top`` functions by their own time and by time below them are printed a partition
count at a time. Time the thread waited on its event loop shows as ``on_loop``. On the lent
GPU machine:

    python3 scripts/stage-profile.py --target device --gib 8 --partitions 8,1024 --out $OUT/p.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import dask_gpudirect as dg
from dask_gpudirect.bench.common import wait_released
from dask_gpudirect.bench.shuffle import _Input
from dask_gpudirect.measure import start_cluster, stop_cluster


def _profile_stages(dask_worker) -> None:
    """Wrap the worker's stage in cProfile, its stats kept on the worker."""
    from dask_gpudirect.shuffle.worker import ShuffleService

    if getattr(ShuffleService.stage, "profiled", False):
        return
    stage = ShuffleService.stage

    def profiled(self, exchange, inputs):
        profile = cProfile.Profile()
        try:
            return profile.runcall(stage, self, exchange, inputs)
        finally:
            dask_worker._stage_profile = profile

    profiled.profiled = True
    ShuffleService.stage = profiled


def _stats(dask_worker, top: int) -> str:
    """The last stage's profile: ``top`` functions by own time, then by time below them."""
    out = io.StringIO()
    stats = pstats.Stats(dask_worker._stage_profile, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="device")
    parser.add_argument("--gib", type=float, default=8)
    parser.add_argument("--partitions", default="8,1024")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--placement", default="dealt", choices=["dealt", "blocks"])
    parser.add_argument("--rmm-pool-size", default="30GB")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    protocol = "ucxx" if args.target == "device" else "tcp"
    pool = args.rmm_pool_size if args.target == "device" else None
    with open(args.out, "w") as out:
        for partitions in [int(p) for p in args.partitions.split(",")]:
            cluster, client = start_cluster(args.target, args.workers, 1, protocol, pool)
            try:
                data = _Input(
                    client,
                    args.target,
                    args.gib,
                    partitions,
                    args.workers,
                    placement=args.placement,
                )
                data.make()
                client.run(_profile_stages)
                for _ in range(3):
                    baseline = data.held
                    out_frame = dg.shuffle(data.collection, "key", client=client)
                    del out_frame
                    wait_released(client, baseline)
                for worker, text in sorted(client.run(_stats, top=args.top).items()):
                    print(f"=== {partitions} partitions, {worker}\n{text}", file=out, flush=True)
            finally:
                stop_cluster(cluster, client, print)


if __name__ == "__main__":
    main()
