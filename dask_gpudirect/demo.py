"""``dask-gpudirect demo``: write a small dataset, load it with the plugin, show where and how."""

from __future__ import annotations

import contextlib
import os
import pathlib
from typing import TYPE_CHECKING

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from .cuda import gpu_count
from .progress import Bar, wait

if TYPE_CHECKING:
    import pandas as pd
    from distributed import SpecCluster


def write_sample(root: pathlib.Path, files: int = 4, rows: int = 200_000) -> None:
    """A small Parquet dataset and a directory of ``.npy`` shards under ``root``."""
    rng = np.random.default_rng(0)
    (root / "parquet").mkdir(parents=True, exist_ok=True)
    (root / "npy").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        table = pa.table(
            {
                "id": np.arange(i * rows, (i + 1) * rows, dtype="int64"),
                "x": rng.standard_normal(rows),
                "y": rng.standard_normal(rows),
                "label": rng.integers(0, 10, rows, dtype="int32"),
            }
        )
        pq.write_table(table, root / "parquet" / f"part-{i}.parquet", row_group_size=rows // 4)
        np.save(root / "npy" / f"shard-{i}.npy", rng.standard_normal((rows // 8, 16), dtype="f4"))


def _start_cluster(workers: int) -> tuple[SpecCluster, str]:
    if gpu_count():
        from . import GPUDirectPlugin, LocalCUDACluster

        return LocalCUDACluster(plugins={GPUDirectPlugin()}), "LocalCUDACluster (GPU)"
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=2, dashboard_address=":0")
    return cluster, "LocalCluster (no GPU found: host target)"


def _table(title: str, frame: pd.DataFrame) -> Table:
    table = Table(title=title)
    for column in frame.columns:
        numeric = frame[column].dtype.kind in "if"
        table.add_column(str(column), justify="right" if numeric else "left", overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    return table


def _makeable(ctx: click.Context, param: click.Parameter, root: pathlib.Path) -> pathlib.Path:
    """``--dir``, made where it is missing: a usage error before the cluster starts where it
    cannot be (a file on its way, a folder this process may not write)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(f"{str(root)!r}: cannot make it ({exc.strerror})") from None
    return root


@click.command()
@click.option(
    "--dir",
    "root",
    default="demo-data",
    type=click.Path(file_okay=False, writable=True, path_type=pathlib.Path),
    callback=_makeable,
)
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="CPU workers when there is no GPU",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Progress on stderr (plain lines when it is not a terminal).",
)
def demo(root: pathlib.Path, workers: int, progress: bool) -> None:
    """Write a sample dataset, start a local cluster, load it, and show the path of every byte."""
    from distributed import Client, futures_of

    import dask_gpudirect as dg

    console = Console()
    with console.status("writing the sample dataset") if progress else contextlib.nullcontext():
        write_sample(root)
    cluster, kind = _start_cluster(workers)
    with cluster, Client(cluster) as client:
        console.print(f"cluster: {kind}, {len(client.nthreads())} worker(s)")
        df = dg.read_parquet(root / "parquet", columns=["id", "x", "label"]).persist()
        arr = dg.read_binary(os.fspath(root / "npy")).persist()
        loads = futures_of([df, arr])
        shown = Bar("loading Parquet and .npy shards", len(loads)) if progress else None
        with shown or contextlib.nullcontext():
            wait(client, loads, shown)
        console.print(
            f"Parquet -> {type(df._meta).__module__.split('.')[0]} DataFrame: {len(df):,} rows, "
            f"{df.npartitions} partitions; .npy -> {type(arr._meta).__module__.split('.')[0]} "
            f"array {arr.shape} {arr.dtype}, {arr.numblocks[0]} chunks"
        )
        where = client.who_has(df)
        per_worker: dict[str, int] = {}
        for workers_of_key in where.values():
            for w in workers_of_key:
                per_worker[w] = per_worker.get(w, 0) + 1
        console.print(
            "partitions per worker: "
            + ", ".join(f"{w}: {n}" for w, n in sorted(per_worker.items()))
        )
        console.print(_table("Ledger: bytes by worker and path", dg.report(client)))
