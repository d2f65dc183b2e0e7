"""The GPU suite: skipped where no GPU is visible, run on the lent H200 by scripts/gpu-suite.sh.

Each module starts one ``dg.LocalCUDACluster`` (GPU time is scarce): ``cuda_tcp`` or
``cuda_ucxx``, both with ``plugins={dg.GPUDirectPlugin(threads=4)}``. Nothing here creates a
CUDA context in the test process before a cluster starts: CuPy and cuDF are imported inside
tests, after the module's cluster is up.
"""

from __future__ import annotations

import cloudpickle
import gpu_helpers
import pytest

# Worker processes cannot import the tests directory: ship the probes by value.
cloudpickle.register_pickle_by_value(gpu_helpers)


def pytest_collection_modifyitems(config, items):
    from dask_gpudirect.cuda import gpu_count

    if gpu_count():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: dask_gpudirect.cuda.gpu_count() == 0")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _cuda_cluster(protocol: str):
    pytest.importorskip("dask_cuda")
    if protocol == "ucxx":
        pytest.importorskip("distributed_ucxx")
    from distributed import Client

    import dask_gpudirect as dg

    cluster = dg.LocalCUDACluster(
        protocol=protocol,
        dashboard_address=None,
        plugins={dg.GPUDirectPlugin(threads=gpu_helpers.PLUGIN_THREADS)},
    )
    client = Client(cluster)
    return cluster, client


@pytest.fixture(scope="module")
def cuda_tcp():
    """A client of this module's ``dg.LocalCUDACluster`` over tcp (one worker per GPU)."""
    cluster, client = _cuda_cluster("tcp")
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def cuda_ucxx():
    """A client of this module's ``dg.LocalCUDACluster`` over UCXX (``protocol="ucxx"``)."""
    cluster, client = _cuda_cluster("ucxx")
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    """The round-trip Parquet dataset: 3 files, 3 row groups each, many types, nulls."""
    directory = tmp_path_factory.mktemp("parquet")
    return str(directory), gpu_helpers.write_parquet_dataset(directory)
