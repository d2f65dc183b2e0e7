"""Load Parquet and .npy shards with dask-gpudirect and print the ledger.

    python examples/quickstart.py DATA_DIR

DATA_DIR holds ``parquet/`` and ``npy/`` (``dask-gpudirect demo --dir DATA_DIR`` writes both).
On a machine with GPUs the data lands in GPU memory (cuDF / CuPy); elsewhere in host memory.
"""

import sys

from distributed import Client, LocalCluster

import dask_gpudirect as dg
from dask_gpudirect.cuda import gpu_count


def main(root: str) -> None:
    if gpu_count():
        cluster = dg.LocalCUDACluster(plugins={dg.GPUDirectPlugin()})
    else:
        cluster = LocalCluster(n_workers=2, plugins={dg.GPUDirectPlugin()})
    with cluster, Client(cluster) as client:
        df = dg.read_parquet(f"{root}/parquet", columns=["id", "x"], filters=[("x", ">", 0)])
        print(df.groupby(df.id % 10).x.mean().compute())
        arr = dg.read_binary(f"{root}/npy")
        print(arr.mean(axis=0).compute())
        print(dg.report(client))


if __name__ == "__main__":
    main(sys.argv[1])
