"""The ``/gpudirect`` dashboard page: served by a real scheduler, fed by worker heartbeats."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
from bokeh.client import pull_session
from util import compute, workers_info

import dask_gpudirect as dg
from dask_gpudirect.bandwidth import COLORS, PathBandwidth, rates
from dask_gpudirect.dashboard import DashboardPlugin
from dask_gpudirect.metrics import HEARTBEAT


def worker_totals(dask_worker) -> dict[str, int]:
    """Bytes per path in the worker's ledger totals (what its heartbeats should carry)."""
    totals: dict[str, int] = {}
    for (_, path), t in dask_worker.plugins["gpudirect"].ledger.totals().items():
        totals[path] = totals.get(path, 0) + t.bytes
    return totals


def heartbeats_caught_up(client, expected: dict[str, dict[str, int]], timeout: float = 10):
    """Wait until every worker's last heartbeat on the scheduler carries ``expected``."""
    deadline = time.monotonic() + timeout
    while True:
        workers = workers_info(client)
        got = {w: info["metrics"].get(HEARTBEAT, {}).get("bytes") for w, info in workers.items()}
        if got == expected:
            return
        assert time.monotonic() < deadline, f"heartbeats say {got}, ledgers {expected}"
        time.sleep(0.1)


def test_page_shows_bytes_per_path_per_worker_after_a_load(tcp, tmp_path):
    path = os.fspath(tmp_path / "a.npy")
    np.save(path, np.arange(30_000, dtype="<i4").reshape(10_000, 3))
    compute(tcp, dg.read_binary(path, blocksize=12 * 1_000, client=tcp))  # registers the page
    expected = tcp.run(worker_totals)
    assert all(totals["posix-host"] > 0 for totals in expected.values())
    heartbeats_caught_up(tcp, expected)

    url = tcp.dashboard_link.replace("/status", "/gpudirect")
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert "bokeh" in response.read().decode()
    with pull_session(url=url) as session:  # the document the page's websocket serves
        figure = session.document.select_one({"name": "gpudirect_bandwidth"})
        data = figure.renderers[0].data_source.data
    got: dict[str, dict[str, int]] = {}
    for worker, path, nbytes in zip(data["worker"], data["path"], data["bytes"], strict=True):
        got.setdefault(worker, {})[path] = nbytes
    assert got == expected
    assert data["color"] == [COLORS[path] for path in data["path"]]


def test_rates_between_two_heartbeats():
    first = {"time": 10.0, "bytes": {"gds": 100}}
    assert rates(None, first) == {"gds": 0.0}
    later = {"time": 12.0, "bytes": {"gds": 500, "ucx-device": 60}}
    assert rates(first, later) == {"gds": 200.0, "ucx-device": 30.0}
    restarted = {"time": 13.0, "bytes": {"gds": 50}}  # the worker restarted
    assert rates(later, restarted) == {"gds": 0.0}


def fake_scheduler(**samples) -> SimpleNamespace:
    workers = {w: SimpleNamespace(metrics={HEARTBEAT: s}) for w, s in samples.items()}
    return SimpleNamespace(workers=workers)


def test_component_keeps_each_workers_rate_until_its_next_heartbeat():
    scheduler = fake_scheduler(a={"time": 1.0, "bytes": {"gds": 0}})
    plot = PathBandwidth(scheduler)
    plot.update()
    scheduler.workers["a"].metrics[HEARTBEAT] = {"time": 3.0, "bytes": {"gds": 4_000}}
    scheduler.workers["b"] = SimpleNamespace(metrics={})  # no plugin: no bars
    plot.update()
    plot.update()  # no new heartbeat: the same rate, not zero
    data = plot.source.data
    assert list(zip(data["y"], data["rate"], data["bytes"], strict=True)) == [
        (("a", "gds"), 2_000.0, 4_000)
    ]
    assert list(plot.root.y_range.factors) == [("a", "gds")]
    assert "1.95 kiB/s" in plot.root.title.text
    del scheduler.workers["a"]
    plot.update()
    assert plot.source.data["y"] == [] and plot.samples == {}


def test_no_page_without_the_dask_dashboard():
    scheduler = SimpleNamespace(http_application=SimpleNamespace(applications=[]))
    asyncio.run(DashboardPlugin().start(scheduler))
    assert scheduler.http_application.applications == []
