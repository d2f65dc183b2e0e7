"""The cluster's ledger, read from the client: every worker's records, and ``dg.report``'s sums.

The records are kept on the workers (:mod:`dask_gpudirect.ledger`); here they are gathered with
``client.run`` and summed per worker, per path or per shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import numbers
import warnings
from typing import TYPE_CHECKING, Any

from dask import config
from dask.utils import parse_timedelta

from . import ledger
from .cluster import answered
from .connection import connected
from .errors import InputError

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client, Worker


def _worker_records(dask_worker: Worker) -> dict[str, list[Any]]:
    return ledger.of(dask_worker).columns()


CONNECT_TIMEOUT = "distributed.comm.timeouts.connect"


async def _asked(client: Client, timeout: float) -> dict[str, dict[str, list[Any]] | None]:
    """Each worker's records, every worker asked at once and given ``timeout`` seconds; None
    for one that gave no answer."""

    async def one(worker: str) -> dict[str, list[Any]] | None:
        try:
            answer = await asyncio.wait_for(
                client.run(_worker_records, workers=[worker], on_error="return"), timeout
            )
        except TimeoutError:
            return None
        found, _ = answered(answer)  # gone while asked: none; another error raised
        return found.get(worker)

    workers = list(await client.scheduler.ncores())
    found = await asyncio.gather(*map(one, workers))
    return dict(zip(workers, found, strict=True))


def records(client: Client | None = None) -> pd.DataFrame:
    """Every ledger record of every worker, one row each. A worker that gives no answer within
    ``distributed.comm.timeouts.connect`` (stopped, or gone meanwhile) is left out, with a
    warning naming it: the others' records are not held back by it."""
    import pandas as pd

    client = connected(client)
    timeout = parse_timedelta(config.get(CONNECT_TIMEOUT))
    answers = client.sync(_asked, client, timeout)
    silent = sorted(w for w, rs in answers.items() if rs is None)
    if silent:
        warnings.warn(
            f"dg.report: worker(s) {', '.join(silent)} gave no answer within {timeout:g} s "
            f"({CONNECT_TIMEOUT}): their records are left out",
            RuntimeWarning,
            stacklevel=2,
        )
    found = [cols for cols in answers.values() if cols is not None]
    return pd.DataFrame(
        {name: [v for cols in found for v in cols[name]] for name in ledger.FIELDS},
        columns=list(ledger.FIELDS),
    )


def report(
    client: Client | None = None, by: str = "worker", window: str | float | None = None
) -> pd.DataFrame:
    """The cluster's ledger, summed into one of three views.

    - ``by="worker"`` (default): per worker, op and path. Columns ``worker, op, path, count,
      bytes, seconds, copies, GB/s``.
    - ``by="path"``: per op and path over the whole cluster (the same columns less ``worker``).
    - ``by="shard"``: every loaded shard (reads only), slowest first (lowest GB/s). Columns
      ``shard, file, worker, path, count, bytes, seconds, GB/s``; ``count`` is how often that
      worker loaded it.

    ``window`` (``"10s"``, seconds, a timedelta) also splits the worker and path views into
    windows of that length by the time each record was made (when its read or transfer ended);
    a leading ``window`` column holds each window's start (UTC). Windows without records are
    left out.

    ``copies`` is what the path costs per byte; ``GB/s`` is bytes over the summed seconds of the
    reads or transfers (per reader, not the window's throughput), NaN where they took no
    measurable time (listed last in the shard view).
    """
    import pandas as pd

    if by not in _VIEWS:
        raise InputError(None, f"by={by!r}: use one of {', '.join(map(repr, _VIEWS))}")
    if window is not None and by == "shard":
        raise InputError(None, "window= splits the worker and path views, not by='shard'")
    seconds = None if window is None else _window_seconds(window)
    df = records(client)
    keys = _VIEWS[by]
    if by == "shard":
        out = _summed(df[df["op"] == "read"], keys).drop(columns="copies")
        return out.sort_values(["GB/s", "seconds"], ascending=[True, False], ignore_index=True)
    if seconds is not None:
        start = (df["time"].astype(float) // seconds) * seconds
        df = df.assign(window=pd.to_datetime(start, unit="s", utc=True))
        keys = ["window", *keys]
    return _summed(df, keys)


def _window_seconds(window: Any) -> float:
    """``window`` (``"10s"``, seconds, a timedelta) in seconds, or an InputError saying why not."""
    seconds = None
    if isinstance(window, (str, numbers.Real, datetime.timedelta)) and not isinstance(window, bool):
        with contextlib.suppress(KeyError, ValueError):  # dask's parser: "ten", "-1s"
            seconds = parse_timedelta(
                window if not isinstance(window, numbers.Real) else float(window)
            )
    if seconds is None:
        raise InputError(None, f"window={window!r}: give a duration, e.g. '10s', 30 or a timedelta")
    if seconds <= 0:
        raise InputError(None, f"window={window!r}: must be longer than zero")
    return float(seconds)


#: The keys each view of :func:`report` sums over.
_VIEWS: dict[str, list[str]] = {
    "worker": ["worker", "op", "path"],
    "path": ["op", "path"],
    "shard": ["shard", "file", "worker", "path"],
}


def _summed(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df``'s records summed per ``keys``: count, bytes, seconds, copies (per byte), GB/s."""
    # one path's records may cost different copies (tcp-host-staged: 2 in a node, 5 across
    # nodes): weighed by their bytes, as the counters' copies_total / bytes_total are
    out = (
        df.assign(copied=df["bytes"] * df["copies"])
        .groupby(keys, as_index=False)
        .agg(
            count=("bytes", "size"),
            bytes=("bytes", "sum"),
            seconds=("seconds", "sum"),
            copied=("copied", "sum"),
            most=("copies", "max"),
        )
        .sort_values(keys, ignore_index=True)
    )
    per_byte = out.pop("copied") / out["bytes"].where(out["bytes"] > 0)
    out["copies"] = per_byte.fillna(out.pop("most")).astype(float)  # no bytes: the path's cost
    # no time measured (a read too quick for the clock): no rate, not the slowest one
    out["GB/s"] = out["bytes"] / out["seconds"].where(out["seconds"] > 0) / 1e9
    return out
