"""Where a worker's ``keep`` of 512 outputs goes: the shuffle's last phase, Distributed's
``UpdateDataEvent``, 51 ms on a GPU worker against 8 ms for NumPy on the CPU (not explained).
Puts 512 NumPy arrays, pandas frames and cuDF frames into one worker's memory three times each,
timing Dask's sizeof, the event and the keys' release, and prints the third run's profile; on a
cluster of two workers sharing the GPU (Distributed's SpillBuffer holds the data), then on a
dg.LocalCUDACluster of one (dask-cuda's). On the lent GPU machine:

    bash .gpu/install.sh && source scripts/lent-machine.sh && python3 scripts/keep-phase.py

Run on one H200 on 2026-12-05 (docs/benchmarks/2026-12-05-h200-keep-phase-588ca0d.log): 512 cuDF
outputs put in 14-20 ms, sized in 8-12 ms a pass, so Distributed's put is not most of the 51 ms.
"""

import cProfile
import io
import pstats
import time

OUTPUTS, ROWS = 512, 500_000  # about 8 MB an output: 8.6 GB in 1024 partitions, two workers


def _maker(kind: str):
    """A function that makes one output of ``kind``: two columns (or one array) of ROWS."""
    if kind == "cudf":
        import cudf
        import cupy

        return lambda: cudf.DataFrame({"a": cupy.arange(ROWS), "b": cupy.ones(ROWS)})
    import numpy as np

    if kind == "pandas":
        import pandas as pd

        return lambda: pd.DataFrame({"a": np.arange(ROWS), "b": np.ones(ROWS)})
    return lambda: np.arange(ROWS)


def probe(dask_worker, kind: str) -> dict:
    """On a worker: the seconds of sizeof, the event and the release of OUTPUTS outputs, three
    times; the third event's profile."""
    from dask.sizeof import sizeof
    from distributed.worker_state_machine import FreeKeysEvent, UpdateDataEvent

    make = _maker(kind)
    out: dict = {"data": type(dask_worker.data).__name__}
    for attempt in range(3):
        parts = {f"probe-{kind}-{attempt}-{i}": make() for i in range(OUTPUTS)}
        start = time.perf_counter()
        for value in parts.values():
            sizeof(value)
        out[f"sizeof{attempt}"] = time.perf_counter() - start
        profile = cProfile.Profile() if attempt == 2 else None
        start = time.perf_counter()
        if profile:
            profile.enable()
        dask_worker.handle_stimulus(UpdateDataEvent(data=parts, stimulus_id=f"p-{time.time()}"))
        if profile:
            profile.disable()
        out[f"update{attempt}"] = time.perf_counter() - start
        start = time.perf_counter()
        free = FreeKeysEvent(keys=list(parts), stimulus_id=f"f-{time.time()}")
        dask_worker.handle_stimulus(free)
        out[f"free{attempt}"] = time.perf_counter() - start
        if profile:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
            out["profile"] = text.getvalue()
        del parts
    return out


def main() -> None:
    from dask_gpudirect.measure import start_cluster, stop_cluster

    for workers in (2, 1):
        cluster, client = start_cluster("device", workers, 1, "ucxx", "40GB")
        try:
            address = sorted(client.scheduler_info()["workers"])[0]
            for kind in ("numpy", "pandas", "cudf"):
                result = client.run(probe, kind=kind, workers=[address])[address]
                profile = result.pop("profile")
                print(f"== workers={workers} kind={kind} {result}", flush=True)
                if kind != "numpy":
                    print(profile[:9000], flush=True)
        finally:
            stop_cluster(cluster, client, print)


if __name__ == "__main__":
    main()
