"""Logs every garbage collection over 10 ms of each Python process that starts with this
directory on PYTHONPATH (a benchmark's client and its Dask workers alike), to stderr:

    PYTHONPATH=scripts/gc-pauses:$PYTHONPATH python3 -m dask_gpudirect.bench etl ... 2> gc.log

Workers' stderr reaches the benchmark's log. How the worker GC pauses behind
``gpudirect.worker.freeze-gc`` were found (docs/benchmarks).
"""

import gc
import os
import sys
import time

_started: list[float] = []


def _log(phase: str, info: dict) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        ms = (time.perf_counter() - _started.pop()) * 1000
        if ms > 10:
            sys.stderr.write(
                f"GCLOG pid={os.getpid()} gen={info['generation']} {ms:.0f} ms "
                f"collected={info['collected']}\n"
            )


gc.callbacks.append(_log)
