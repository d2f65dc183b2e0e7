"""dask-gpudirect: Parquet and binary shards straight into GPU memory, GPU-to-GPU shuffles over
UCX, and a ledger of the path every byte took."""

from __future__ import annotations

import importlib.util

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
    "OptionError",
    "read_binary",
    "read_parquet",
    "report",
    "shuffle",
    "shuffle_array",
    "ShuffleError",
]
if importlib.util.find_spec("dask_cuda") is not None:  # the cuda13 extra: else not offered
    __all__.append("LocalCUDACluster")


def __getattr__(name: str) -> type:
    if name == "LocalCUDACluster":  # imported on use: dask-cuda is the optional cuda13 extra
        from . import cluster

        if cluster.dask_cuda is None:
            # an AttributeError (PEP 562): hasattr and getattr(dg, name, None) say it is not
            # there, and a star import skips it (it is in __all__ only with dask-cuda)
            raise AttributeError(
                "dg.LocalCUDACluster needs dask-cuda: pip install 'dask-gpudirect[cuda13]'. "
                + cluster.WITHOUT_GPU
            )
        return cluster.LocalCUDACluster
    raise AttributeError(f"module 'dask_gpudirect' has no attribute {name!r}")
