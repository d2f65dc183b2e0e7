"""Shared fixtures: real LocalClusters with worker processes, reused across tests.

Starting a cluster costs seconds on a 2-core machine, so the tcp and ucxx clusters live for
the whole session and tests that need a pristine cluster (registration) start their own.
Tests pass ``client=`` explicitly and compute with ``client.compute``: two clients live in
this process, and dask's default client is whichever was made last.
"""

from __future__ import annotations

import os

import cloudpickle
import pytest
import util
from distributed import Client, LocalCluster

# Worker processes cannot import the tests directory: ship the helpers by value.
cloudpickle.register_pickle_by_value(util)

PROTOCOLS = ["tcp", "ucxx"]


def ucx_environment() -> None:
    """Environment UCX needs on this CPU-only machine, set before ucxx is first imported.

    ``UCX_TLS=tcp`` keeps UCX on TCP sockets. The cluster also starts without it (UCX then
    picks shared memory/CMA as well), but those depend on the container (ptrace rules, /dev/shm
    size); TCP works anywhere and is what a CPU-only run should exercise. Worker processes
    inherit the variable, so client, scheduler and workers agree on one transport.
    ``UCX_WARN_UNUSED_ENV_VARS=n`` silences UCX's warning about ``UCX_MEMTYPE_CACHE``, which
    distributed-ucxx sets and this UCX no longer reads.
    Nothing else is needed: ``distributed-ucxx`` registers the ``ucxx://`` comm itself.
    """
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


def start_cluster(protocol: str, n_workers: int = 2, threads: int = 2) -> LocalCluster:
    """A LocalCluster with worker processes over ``protocol`` (dashboard on a free port)."""
    if protocol == "ucxx":
        pytest.importorskip("distributed_ucxx")
        ucx_environment()
    return LocalCluster(
        protocol=protocol,
        n_workers=n_workers,
        threads_per_worker=threads,
        processes=True,
        dashboard_address=":0",
        host="127.0.0.1",
    )


def _cluster_client(protocol: str):
    cluster = start_cluster(protocol)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(2)
    return cluster, client


@pytest.fixture(scope="session")
def tcp_client():
    """A session-wide client of a 2-worker (2 threads each) tcp LocalCluster."""
    cluster, client = _cluster_client("tcp")
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def ucxx_client():
    """A session-wide client of a 2-worker ucxx LocalCluster (UCX over TCP, see above)."""
    cluster, client = _cluster_client("ucxx")
    yield client
    client.close()
    cluster.close()


@pytest.fixture(params=PROTOCOLS)
def client(request):
    """The tcp and the ucxx client in turn, made current for the test."""
    c = request.getfixturevalue(f"{request.param}_client")
    with c.as_current():
        yield c


@pytest.fixture
def tcp(tcp_client):
    """The tcp client only, made current: for tests about input, not about comms."""
    with tcp_client.as_current():
        yield tcp_client
