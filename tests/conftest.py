"""Shared fixtures: real LocalClusters with worker processes, reused across tests.

Starting a cluster costs seconds on a 2-core machine, so the tcp and ucxx clusters live for
the whole session and tests that need a pristine cluster (registration) start their own.
Tests pass ``client=`` explicitly and compute with ``client.compute``: two clients live in
this process, and dask's default client is whichever was made last.
"""

from __future__ import annotations

import cloudpickle
import pytest
import util
from distributed import Client
from object_servers import http_url, local_data, s3, s3_proxy  # noqa: F401  (fixtures for every test)

# Worker processes cannot import the tests directory: ship the helpers by value.
cloudpickle.register_pickle_by_value(util)

PROTOCOLS = ["tcp", "ucxx"]


def _cluster_client(protocol: str):
    cluster = util.start_cluster(protocol)
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
    """A session-wide client of a 2-worker ucxx LocalCluster (UCX over TCP, see util.py)."""
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
