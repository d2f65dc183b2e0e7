"""examples/ecg/pipeline.py on worker processes that may outnumber the GPUs, started as
``bench ... --workers N`` starts them (two workers on one H200 stand in for nvidia-h200-x2;
dask-cuda's LocalCUDACluster refuses more workers than GPUs). Takes the pipeline's options:

    python3 scripts/ecg-shared-gpu.py --workers 2 --size large --loader direct

or, for the whole GPU run, ``ECG_PIPELINE=scripts/ecg-shared-gpu.py ECG_ARGS="--workers 2"
bash scripts/ecg-gpu.sh OUT_DIR``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "ecg"))

import pipeline  # noqa: E402

from dask_gpudirect.measure import start_cluster  # noqa: E402


def shared_cluster(target: str, workers: int | None, threads: int, protocol: str | None):
    """The pipeline's cluster, from the benchmarks' own cluster start (no RMM pool, as the
    pipeline's dg.LocalCUDACluster has none); the pipeline opens its own client."""
    default = "ucxx" if target == "device" else "tcp"
    cluster, client = start_cluster(target, workers, threads, protocol or default, None)
    client.close()
    return cluster


if __name__ == "__main__":  # worker processes are spawned: they import this file
    pipeline.start_cluster = shared_cluster
    pipeline.main()
