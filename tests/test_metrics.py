"""Prometheus counters on each worker's ``/metrics``: scraped over HTTP from real workers.

The counters are running totals kept beside the ledger's records, so they neither drop with
evicted records nor with ``clear()``; a scrape before and after some work differs by exactly
what the ledger recorded in between.
"""

from __future__ import annotations

import collections
import os
import urllib.request

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from distributed.comm import get_address_host
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from util import clear_ledgers, compute, workers_info

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.ledger import COPIES, Ledger
from dask_gpudirect.metrics import LedgerCollector

FAMILIES = ("dask_gpudirect_bytes", "dask_gpudirect_seconds", "dask_gpudirect_copies")

Key = tuple[str, str, str]  # worker, op, path


def parse(text: str) -> dict[str, dict[Key, float]]:
    """Our counter families in Prometheus text: family -> (worker, op, path) -> value."""
    out: dict[str, dict[Key, float]] = {name: {} for name in FAMILIES}
    for family in text_string_to_metric_families(text):
        if family.name in out:
            assert family.type == "counter"
            for sample in family.samples:
                assert sample.name == family.name + "_total"
                key = (sample.labels["worker"], sample.labels["op"], sample.labels["path"])
                assert key not in out[family.name], f"{key} twice in {family.name}"
                out[family.name][key] = sample.value
    return out


def scrape(client: Client) -> dict[str, dict[Key, float]]:
    """Every worker's ``/metrics``, merged; each worker must report only itself."""
    merged: dict[str, dict[Key, float]] = {name: {} for name in FAMILIES}
    for address, info in workers_info(client).items():
        url = f"http://{get_address_host(address)}:{info['services']['dashboard']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            families = parse(response.read().decode())
        for name, samples in families.items():
            assert {worker for worker, _, _ in samples} <= {address}
            merged[name].update(samples)
    return merged


def recorded(records: pd.DataFrame) -> dict[str, dict[Key, float]]:
    """What the counters must have grown by for these ledger records."""
    out: dict[str, dict[Key, float]] = {name: collections.Counter() for name in FAMILIES}
    for r in records.itertuples():
        key = (r.worker, r.op, r.path)
        out["dask_gpudirect_bytes"][key] += r.bytes
        out["dask_gpudirect_seconds"][key] += r.seconds
        out["dask_gpudirect_copies"][key] += r.bytes * r.copies
    return out


def grown(before: dict, after: dict) -> dict[str, dict[Key, float]]:
    return {
        name: {k: v - before[name].get(k, 0) for k, v in after[name].items()} for name in FAMILIES
    }


def test_scraped_counters_grow_by_what_the_ledger_recorded(client, tmp_path):
    path = os.fspath(tmp_path / "a.npy")
    np.save(path, np.arange(60_000, dtype="<i8").reshape(20_000, 3))
    x = dg.read_binary(path, blocksize=24 * 2_000, client=client)
    df = dd.from_pandas(pd.DataFrame({"k": np.arange(4_000) % 37, "v": 1.0}), npartitions=4)
    before = scrape(client)
    clear_ledgers(client)
    compute(client, x)
    dg.shuffle(df, "k", npartitions=4, client=client)
    records = ledger_report.records(client)

    assert {"read", "shuffle"} <= set(records["op"])
    expected = recorded(records)
    delta = grown(before, scrape(client))
    for name in FAMILIES:
        changed = {k: v for k, v in delta[name].items() if v}
        assert changed == pytest.approx({k: v for k, v in expected[name].items() if v}), name
    reads = {k: v for k, v in delta["dask_gpudirect_bytes"].items() if k[1] == "read"}
    assert {path for _, _, path in reads} == {"posix-host"}
    assert sum(reads.values()) == x.nbytes == 480_000
    assert len(reads) == 2  # both workers read, each exports its own


async def heartbeat(dask_worker) -> None:
    await dask_worker.heartbeat()


def test_a_cluster_that_only_shuffles_publishes_its_counts():
    """No GPUDirectPlugin, only dg.shuffle: its bytes are on each worker's /metrics and in its
    heartbeats (what the dashboard page shows), as a reading cluster's are (they were not)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        df = dd.from_pandas(pd.DataFrame({"k": np.arange(4_000) % 37, "v": 1.0}), npartitions=4)
        dg.shuffle(df, "k", npartitions=4, client=client)
        records = ledger_report.records(client)
        assert set(records["op"]) == {"shuffle"}
        scraped = {k: v for k, v in scrape(client)["dask_gpudirect_bytes"].items() if v}
        assert scraped == pytest.approx(
            {k: v for k, v in recorded(records)["dask_gpudirect_bytes"].items() if v}
        )
        client.run(heartbeat)  # the totals reach the scheduler
        beats = [w["metrics"]["gpudirect"] for w in workers_info(client).values()]
        assert all(beat is not None for beat in beats)


def test_removing_the_reader_plugin_leaves_the_shuffle_s_counts_published():
    """The readers' plugin and the shuffle's export the worker's one ledger: taking the
    readers' away stopped the shuffle's counts on /metrics and in the heartbeats too."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        df = dd.from_pandas(pd.DataFrame({"k": np.arange(4_000) % 37, "v": 1.0}), npartitions=4)
        client.register_plugin(dg.GPUDirectPlugin())
        dg.shuffle(df, "k", npartitions=4, client=client)  # the shuffle's plugin too
        client.unregister_worker_plugin("gpudirect")
        assert_a_shuffle_is_published(client, df)


def assert_a_shuffle_is_published(client: Client, df: dd.DataFrame) -> None:
    """A shuffle of ``df`` grows /metrics by what the ledgers record, and every worker's
    heartbeat carries its totals."""
    clear_ledgers(client)
    before = scrape(client)["dask_gpudirect_bytes"]
    dg.shuffle(df, "k", npartitions=4, client=client)
    records = ledger_report.records(client)
    after = scrape(client)["dask_gpudirect_bytes"]
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    assert grown and grown == pytest.approx(
        {k: v for k, v in recorded(records)["dask_gpudirect_bytes"].items() if v}
    )
    client.run(heartbeat)
    beats = [w["metrics"].get("gpudirect") for w in workers_info(client).values()]
    assert all(beat is not None for beat in beats)


def test_counters_outlive_evicted_and_cleared_records():
    book = Ledger("tcp://w:1", max_records=2)
    for _ in range(5):
        book.add(op="read", path="kvikio-compat", nbytes=100, seconds=0.5)
    book.add(op="shuffle", path="local", nbytes=30, seconds=0.0)
    book.clear()
    assert book.records() == []
    registry = CollectorRegistry()
    collector = LedgerCollector()
    collector.ledgers[book.worker] = book
    registry.register(collector)

    got = parse(generate_latest(registry).decode())
    read, local = ("tcp://w:1", "read", "kvikio-compat"), ("tcp://w:1", "shuffle", "local")
    assert got["dask_gpudirect_bytes"] == {read: 500, local: 30}
    assert got["dask_gpudirect_seconds"] == {read: 2.5, local: 0.0}
    # copies counted in bytes: 2 copies of each read byte, none for a piece that never moved
    assert got["dask_gpudirect_copies"] == {read: 500 * COPIES["kvikio-compat"], local: 0}


def record_a_read(dask_worker) -> None:
    """A gds read of as many bytes as the worker's address is long: a value per worker."""
    book = dask_worker.plugins["gpudirect"].ledger
    book.add(op="read", path="gds", nbytes=len(dask_worker.address), seconds=1.0)


def test_two_workers_in_one_process_and_registering_again():
    """One registry per process: one collector serves both workers, labelled apart, and
    registering the plugin again neither raises, nor doubles a series, nor resets a count
    (the ledger is the worker's, not the plugin's)."""
    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            protocol="tcp",
            threads_per_worker=1,
            dashboard_address=":0",
            host="127.0.0.1",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.register_plugin(dg.GPUDirectPlugin())
        client.run(record_a_read)
        client.register_plugin(dg.GPUDirectPlugin(threads=2))  # replaces the first
        client.run(record_a_read)
        workers = set(client.nthreads())
        for info in workers_info(client).values():
            url = f"http://127.0.0.1:{info['services']['dashboard']}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                got = parse(response.read().decode())
            assert got["dask_gpudirect_bytes"] == {(w, "read", "gds"): 2 * len(w) for w in workers}
        client.unregister_worker_plugin("gpudirect")
        url = f"http://127.0.0.1:{info['services']['dashboard']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert parse(response.read().decode())["dask_gpudirect_bytes"] == {}


def test_workers_of_one_process_given_the_plugin_at_start_stop_publishing_when_they_close():
    """``LocalCluster(processes=False, plugins={GPUDirectPlugin()})`` sets up one plugin object
    on both workers: each one's series leaves the process's ``/metrics`` when it closes, not
    only the last one set up (the other's stayed, a worker long gone)."""
    from dask_gpudirect import metrics

    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            threads_per_worker=1,
            dashboard_address=":0",
            plugins={dg.GPUDirectPlugin()},
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.run(record_a_read)
        workers = set(client.nthreads())
        assert workers <= set(metrics.collector().ledgers)
    assert not workers & set(metrics.collector().ledgers)


def pretend_a_gpu(dask_worker, on: bool) -> None:
    """The reader plugin's setup sees a GPU (on): making its device target then fails here
    (no CUDA packages), as a GPU worker's does on a bad kvikio option."""
    import dask_gpudirect.plugin as plugin
    from dask_gpudirect.cuda import gpu_count

    plugin.gpu_count = (lambda: 1) if on else gpu_count


def test_removing_a_reader_plugin_that_failed_its_setup_leaves_the_shuffle_s_counts():
    """A reader plugin whose setup failed at its device target never published the ledger:
    removing it (or registering a good one over it) took the shuffle's export away, so the
    shuffle's counts left /metrics and the heartbeats while its plugin stayed."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        df = dd.from_pandas(pd.DataFrame({"k": np.arange(4_000) % 37, "v": 1.0}), npartitions=4)
        dg.shuffle(df, "k", npartitions=4, client=client)  # the shuffle's plugin publishes
        client.run(pretend_a_gpu, on=True)
        with pytest.raises(ImportError, match="'device' target"):
            client.register_plugin(dg.GPUDirectPlugin())
        client.run(pretend_a_gpu, on=False)
        client.unregister_worker_plugin("gpudirect")  # the failed one, torn down
        assert_a_shuffle_is_published(client, df)
