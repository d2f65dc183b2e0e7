"""dask-gpudirect: Parquet and binary shards straight into GPU memory, GPU-to-GPU shuffles over
UCX, and a ledger of the path every byte took."""

from __future__ import annotations

from . import config  # noqa: F401  (loads the gpudirect.* defaults into dask.config)
from .collections import read_binary, read_parquet
from .errors import (
    ClusterError,
    ConfigError,
    GPUDirectError,
    InputError,
    OptionError,
    ShuffleError,
)
from .ledger_report import report
from .plugin import GPUDirectPlugin
from .shuffle import dask_method
from .shuffle.api import shuffle, shuffle_array

dask_method.install()  # Dask's shuffle_method="gpudirect"

__all__ = [
    "ClusterError",
    "ConfigError",
    "GPUDirectError",
    "GPUDirectPlugin",
    "InputError",
    "LocalCUDACluster",
    "OptionError",
    "read_binary",
    "read_parquet",
    "report",
    "shuffle",
    "shuffle_array",
    "ShuffleError",
]


def __getattr__(name: str) -> type:
    if name == "LocalCUDACluster":  # imported on use: dask-cuda is the optional cuda13 extra
        from . import cluster

        if cluster.dask_cuda is None:
            raise ImportError(
                "dg.LocalCUDACluster needs dask-cuda: pip install 'dask-gpudirect[cuda13]'. "
                + cluster.WITHOUT_GPU
            )
        return cluster.LocalCUDACluster
    raise AttributeError(f"module 'dask_gpudirect' has no attribute {name!r}")
