"""Load Parquet and .npy shards with dask-gpudirect, shuffle, and print the ledger.

    python examples/quickstart.py DATA_DIR

DATA_DIR holds ``parquet/`` and ``npy/`` (``dask-gpudirect demo --dir DATA_DIR`` writes both).
On a machine with GPUs the data lands in GPU memory (cuDF / CuPy) on a ``LocalCUDACluster``;
elsewhere in host memory (pandas / NumPy) on a ``LocalCluster`` of two worker processes.
"""

import sys

from distributed import Client, LocalCluster

import dask_gpudirect as dg
from dask_gpudirect.cuda import gpu_count


def start_cluster():
    """One worker per GPU with the plugin, or two CPU workers where there is no GPU."""
    if gpu_count():
        return dg.LocalCUDACluster(plugins={dg.GPUDirectPlugin()})
    return LocalCluster(n_workers=2, threads_per_worker=2, plugins={dg.GPUDirectPlugin()})


def to_host(series):
    """A pandas Series, from a cuDF one (device target) or as it is (host target)."""
    return series.to_pandas() if hasattr(series, "to_pandas") else series


def main(root: str) -> None:
    with start_cluster() as cluster, Client(cluster) as client:
        df = dg.read_parquet(f"{root}/parquet", columns=["x", "label"], filters=[("x", ">", 0)])
        by_label = dg.shuffle(df, on="label")  # every label's rows now sit in one partition
        sums = to_host(by_label.groupby("label").x.sum().compute()).sort_index()
        print("sum of x > 0 per label:")
        for label, total in sums.items():
            print(f"  {label}: {total:.6f}")
        arr = dg.read_binary(f"{root}/npy")
        first = float(arr[:, 0].mean().compute())
        print(f"npy records: {arr.shape[0]}, mean of column 0: {first:.6f}")
        print(dg.report(client, by="path").to_string())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
