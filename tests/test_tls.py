"""TLS comms with the plugin: loads and shuffles over ``tls://`` with certificates made here.

``Security.temporary()`` (Distributed's, backed by ``cryptography``) makes a self-signed
certificate that the scheduler, the workers and the client all require, so every comm in this
module is encrypted; a client without it cannot connect.
"""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from util import PatientNanny, assert_hash_partitions, partitions

import dask_gpudirect as dg

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def security():
    from distributed.security import Security

    return Security.temporary()


@pytest.fixture(scope="module")
def client(security):
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            protocol="tls",
            security=security,
            dashboard_address=None,
            host="127.0.0.1",
            worker_class=PatientNanny,
        ) as cluster,
        Client(cluster, security=security) as c,
    ):
        yield c


def test_every_address_is_tls(client):
    assert client.scheduler.address.startswith("tls://")
    assert all(w.startswith("tls://") for w in client.nthreads())


def test_load_and_shuffle_over_tls(client, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.int64))
    arr = dg.read_binary(tmp_path / "x.npy", client=client)
    np.testing.assert_array_equal(client.compute(arr).result(), np.arange(1000))

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"k": rng.integers(0, 20, 400), "v": np.arange(400)})
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=3, client=client)
    assert_hash_partitions(partitions(client, out), pdf, "k", 3)
    paths = set(dg.ledger_report.records(client).query("op == 'shuffle'").path)
    assert paths <= {"tcp-host", "local"} and "tcp-host" in paths  # TLS runs over TCP sockets


def test_a_client_with_another_certificate_is_refused(client):
    """A certificate the cluster's CA did not sign cannot connect."""
    from distributed.security import Security

    with pytest.raises((OSError, TimeoutError)):
        Client(client.scheduler.address, security=Security.temporary(), timeout="3s")
