"""A cuDF ETL job: revenue per region and day from orders joined to customers.

    python examples/etl.py DATA_DIR OUT_DIR [--sample] [--rows N] [--scheduler-address ADDR]

DATA_DIR holds ``orders/`` (``order_id, customer_id, day, amount, status``) and ``customers/``
(``customer_id, region, segment``) as Parquet; ``--sample`` writes a small random set there first.
The job reads only the columns it needs and skips cancelled orders and small amounts at read
time, shuffles both tables on ``customer_id`` so that each key's rows meet in one partition,
joins partition by partition, sums per region and day, and writes
``OUT_DIR/revenue_by_region.parquet``.

With GPUs the partitions are cuDF frames on a ``LocalCUDACluster`` (give ``--scheduler-address``
for a running ``ucxx://`` cluster, where the shuffle goes GPU to GPU); without, pandas frames on
a ``LocalCluster`` of two worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client, LocalCluster

import dask_gpudirect as dg
from dask_gpudirect.cuda import gpu_count

REGIONS = np.array(["north", "south", "east", "west"])
STATUSES = np.array(["paid", "shipped", "cancelled"])
MIN_AMOUNT = 5.0  # orders below this are noise for revenue


def write_sample(root: pathlib.Path, rows: int, files: int = 4, seed: int = 0) -> None:
    """Orders in ``files`` Parquet files and one customer table, with a key per 20 orders."""
    rng = np.random.default_rng(seed)
    customers = max(rows // 20, 1)
    (root / "orders").mkdir(parents=True, exist_ok=True)
    (root / "customers").mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for i in range(files):
        n = max(0, min(per_file, rows - i * per_file))  # the last files of a few rows: empty
        orders = pa.table(
            {
                "order_id": np.arange(i * per_file, i * per_file + n, dtype="int64"),
                "customer_id": rng.integers(0, customers, n, dtype="int64"),
                "day": rng.integers(1, 29, n, dtype="int32"),
                "amount": rng.gamma(2.0, 20.0, n).round(2),
                "status": rng.choice(STATUSES, n, p=[0.6, 0.3, 0.1]),
            }
        )
        pq.write_table(orders, root / "orders" / f"part-{i}.parquet", row_group_size=n // 4 or 1)
    table = pa.table(
        {
            "customer_id": np.arange(customers, dtype="int64"),
            "region": rng.choice(REGIONS, customers),
            "segment": rng.choice(np.array(["retail", "business"]), customers),
        }
    )
    pq.write_table(table, root / "customers" / "customers.parquet")


def revenue_by_region(data: pathlib.Path, client: Client):
    """Read, shuffle both sides on the key, join partition by partition, group: a
    one-partition result."""
    orders = dg.read_parquet(
        data / "orders",
        columns=["customer_id", "day", "amount"],
        filters=[("status", "!=", "cancelled"), ("amount", ">=", MIN_AMOUNT)],
        client=client,
    )
    customers = dg.read_parquet(
        data / "customers", columns=["customer_id", "region"], client=client
    )
    parts = max(orders.npartitions, customers.npartitions)
    # a join on columns needs no row labels: ignore_index leaves them behind (fewer bytes)
    orders = dg.shuffle(orders, "customer_id", parts, client=client, ignore_index=True)
    customers = dg.shuffle(customers, "customer_id", parts, client=client, ignore_index=True)
    # both sides sit where Dask's shuffle on the key puts them, and Dask knows it: its merge
    # runs partition by partition (partition j meets partition j), with no shuffle of its own
    joined = orders.merge(customers, on="customer_id", how="inner")
    return (
        joined.groupby(["region", "day"])
        .amount.agg(["sum", "count"])
        .rename(columns={"sum": "revenue", "count": "orders"})
        .reset_index()
        .compute()
        .sort_values(["region", "day"], ignore_index=True)
    )


def start_cluster():
    """One worker per GPU with the plugin, or two CPU workers where there is no GPU."""
    if gpu_count():
        return dg.LocalCUDACluster(plugins={dg.GPUDirectPlugin()})
    return LocalCluster(n_workers=2, threads_per_worker=2, plugins={dg.GPUDirectPlugin()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--sample", action="store_true", help="write a sample dataset to DATA")
    parser.add_argument("--rows", type=int, default=200_000, help="orders in the sample")
    parser.add_argument("--scheduler-address", help="a running cluster (default: a local one)")
    args = parser.parse_args()
    if args.sample:
        write_sample(args.data, args.rows)
    with contextlib.ExitStack() as stack:
        if args.scheduler_address:
            client = stack.enter_context(Client(args.scheduler_address))
        else:
            client = stack.enter_context(Client(stack.enter_context(start_cluster())))
        result = revenue_by_region(args.data, client)
        args.out.mkdir(parents=True, exist_ok=True)
        result.to_parquet(args.out / "revenue_by_region.parquet", index=False)
        print(result.head(8))
        print(f"{len(result)} rows -> {args.out / 'revenue_by_region.parquet'}")
        print(dg.report(client, by="path").to_string())


if __name__ == "__main__":
    main()
