"""Load Parquet onto a running cluster, shuffle it by a key, and print which path the bytes took.

    python examples/multinode/client.py ucxx://node1:8786 --data '/data/*.parquet' \
        --columns id,x --filter x '>' 0 --on id

The scheduler address is the first argument (or ``$DASK_SCHEDULER_ADDRESS``). TLS and UCX
settings come from Dask config, as for every Distributed client: ``DASK_DISTRIBUTED__COMM__TLS__*``
for a ``tls://`` scheduler, ``DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=True`` for ``ucxx://``
(see docs/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from distributed import Client

import dask_gpudirect as dg


def literal(text: str):
    """A filter's value from the command line: ``3`` -> 3, ``0.5`` -> 0.5, ``a`` -> "a"."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scheduler", nargs="?", default=os.environ.get("DASK_SCHEDULER_ADDRESS"))
    parser.add_argument("--data", required=True, help="a Parquet file, directory or glob")
    parser.add_argument("--columns", default=None, help="comma-separated columns to load")
    parser.add_argument(
        "--filter",
        nargs=3,
        action="append",
        metavar=("COLUMN", "OP", "VALUE"),
        help="a row filter, e.g. --filter x '>' 0 (repeat to AND them)",
    )
    parser.add_argument("--on", required=True, help="the column to shuffle by")
    parser.add_argument("--npartitions", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1, help="wait for this many workers")
    args = parser.parse_args(argv)
    if not args.scheduler:
        parser.error("give the scheduler address (or set $DASK_SCHEDULER_ADDRESS)")

    with Client(args.scheduler, timeout="60s") as client:
        client.wait_for_workers(args.workers, timeout=300)
        print(f"{len(client.nthreads())} worker(s) at {client.scheduler.address}")

        columns = args.columns.split(",") if args.columns else None
        filters = [(c, op, literal(v)) for c, op, v in args.filter] if args.filter else None
        df = dg.read_parquet(args.data, columns=columns, filters=filters, client=client)
        print(f"read_parquet: {df.npartitions} partition(s), columns {list(df.columns)}")

        start = time.perf_counter()
        out = dg.shuffle(df, on=args.on, npartitions=args.npartitions, client=client)
        rows = int(out.map_partitions(len).sum().compute())
        keys = int(out[args.on].nunique().compute())
        print(
            f"shuffle on {args.on!r}: {out.npartitions} partition(s), {rows} rows, {keys} keys, "
            f"{time.perf_counter() - start:.1f} s"
        )
        print(dg.report(client, by="path").to_string(index=False))


if __name__ == "__main__":
    main()
