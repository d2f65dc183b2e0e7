"""How a benchmark times a Dask read: build it, persist it, wait, check what it holds, release.

Shared by ``bench read`` and ``bench read --remote``: each measurement times the whole call
(planning, ``persist()`` and ``wait``), checks the result once (rows, records), and leaves the
workers holding nothing before the next one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._baselines import record
from .common import log, wait_released

if TYPE_CHECKING:
    import dask.array as da
    import dask.dataframe as dd
    from distributed import Client

#: A check of a persisted collection: what it holds, or a RuntimeError where it is wrong.
Check = Callable[[Any], str]


def _persist(
    client: Client, build: Callable[[], Any], check: Check | None = None
) -> tuple[float, str]:
    """Seconds from ``build()`` to every partition persisted; then release and wait until freed."""
    from distributed import futures_of, wait

    start = time.perf_counter()
    persisted = build().persist()
    wait(persisted)
    seconds = time.perf_counter() - start
    failed = [f for f in futures_of(persisted) if f.status != "finished"]
    if failed:
        raise RuntimeError(f"{len(failed)} partition(s) failed: {failed[0].exception()!r}")
    note = check(persisted) if check else ""
    del persisted, failed
    wait_released(client)
    return seconds, note


def dask_measure(
    client: Client,
    key: str,
    cache: str,
    nbytes: int,
    build: Callable[[], Any],
    repeat: int,
    check: Check | None = None,
) -> dict:
    if cache == "warm":
        _, note = _persist(client, build, check)  # warm-up (worker imports, pools), checked
        runs = [_persist(client, build)[0] for _ in range(max(1, repeat))]
    else:
        seconds, note = _persist(client, build, check)
        runs = [seconds]
    note = "; ".join(n for n in (note, f"median of {len(runs)}" if len(runs) > 1 else "") if n)
    return record(
        key,
        cache,
        bytes=nbytes,
        seconds=statistics.median(runs),
        runs=runs,
        note=note,
    )


def rows_check(expected: int) -> Check:
    def check(frame: dd.DataFrame) -> str:
        rows = int(frame.map_partitions(len).compute().sum())
        if rows != expected:
            raise RuntimeError(f"loaded {rows} rows, the files hold {expected}")
        return f"{rows} rows in {frame.npartitions} partitions"

    return check


def _block_records(block: Any) -> int:
    """The records a persisted chunk holds (run on the workers)."""
    return int(block.shape[0])


def records_check(expected: int) -> Check:
    def check(array: da.Array) -> str:
        from distributed import futures_of

        if array.shape[0] != expected:
            raise RuntimeError(f"array has {array.shape[0]} records, the files hold {expected}")
        # the chunks themselves, not the shape the graph declares before anything is read
        futures = futures_of(array)
        client = futures[0].client
        held = sum(client.gather(client.map(_block_records, futures, pure=False)))
        if held != expected:
            raise RuntimeError(f"the chunks hold {held} records, the files hold {expected}")
        return f"{held} records in {array.numblocks[0]} chunks"

    return check


def guarded(key: str, cache: str, fn: Callable[[], dict]) -> dict:
    """``fn()``'s record, or an error record saying why it failed: one failed measurement
    must not lose the others."""
    try:
        return fn()
    except Exception as exc:  # a failed measurement is reported; the others still run
        log("read", f"{key} ({cache}) failed: {type(exc).__name__}: {exc}")
        return record(key, cache, status="error", note=f"{type(exc).__name__}: {exc}")
