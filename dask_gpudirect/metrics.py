"""Each worker's ledger totals, published two ways: Prometheus counters on the worker's
``/metrics``, and bytes per path in its heartbeats, for the dashboard page on the scheduler.

Distributed's worker ``/metrics`` serves ``prometheus_client.REGISTRY``, one per process, so one
collector per process serves the ledgers of every worker in it; a ``worker`` label keeps two
workers of one process (``LocalCluster(processes=False)``) apart.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from time import time
from typing import Any

import prometheus_client
from distributed.http.prometheus import PrometheusCollector
from prometheus_client.core import CounterMetricFamily, Metric

from .ledger import Ledger

#: Where the totals travel in a heartbeat: the scheduler's ``WorkerState.metrics[HEARTBEAT]``.
HEARTBEAT = "gpudirect"

_lock = threading.Lock()
#: worker address -> how many plugins export its ledger (the readers' and the shuffle's share
#: the worker's one ledger: removing one must leave the other's export)
_exports: dict[str, int] = {}


class LedgerCollector(PrometheusCollector):
    """The running totals of this process's ledgers as ``dask_gpudirect_*_total`` counters."""

    def __init__(self) -> None:
        super().__init__(server=None)  # one per process, not per server: see the module doc
        self.subsystem = "gpudirect"
        self.ledgers: dict[str, Ledger] = {}

    def describe(self) -> list[Metric]:
        """The families without samples: what the registry checks names against."""
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        with _lock:
            ledgers = sorted(self.ledgers.items())
        for worker, ledger in ledgers:
            for (op, path), totals in sorted(ledger.totals().items()):
                for field, family in families.items():
                    family.add_metric([worker, op, path], getattr(totals, field))
        yield from families.values()

    def _families(self) -> dict[str, CounterMetricFamily]:
        """One counter family per field of :class:`~dask_gpudirect.ledger.Totals`."""
        labels = ["worker", "op", "path"]
        return {
            "bytes": CounterMetricFamily(
                self.build_name("bytes"),
                "Bytes read or transferred, per op and path",
                labels=labels,
                unit="bytes",
            ),
            "seconds": CounterMetricFamily(
                self.build_name("seconds"),
                "Seconds spent reading or transferring, per op and path",
                labels=labels,
                unit="seconds",
            ),
            "copied_bytes": CounterMetricFamily(
                self.build_name("copies"),
                "Copies made, counted in bytes: each read or transfer adds its bytes times the "
                "copies its path costs per byte (copies_total / bytes_total = copies per byte)",
                labels=labels,
            ),
        }


@functools.cache
def collector() -> LedgerCollector:
    """This process's collector, registered with Prometheus on first use (under ``_lock``)."""
    instance = LedgerCollector()
    prometheus_client.REGISTRY.register(instance)
    return instance


def heartbeat(ledger: Ledger) -> dict[str, Any]:
    """What a heartbeat carries: the worker's clock and its bytes per path since it began."""
    nbytes: dict[str, int] = {}
    for (_, path), totals in ledger.totals().items():
        nbytes[path] = nbytes.get(path, 0) + totals.bytes
    return {"time": time(), "bytes": nbytes}


def export(worker: Any, ledger: Ledger) -> None:
    """Publish ``ledger``'s totals: on this process's ``/metrics`` and in ``worker``'s heartbeats.

    A second export for the same worker (the plugin registered again) replaces the first.
    """
    with _lock:
        ledgers = collector().ledgers
        again = ledgers.get(worker.address) is ledger
        _exports[worker.address] = _exports.get(worker.address, 0) + 1 if again else 1
        ledgers[worker.address] = ledger
    # A new dict, not an update: a heartbeat may be iterating the old one across an await.
    worker.metrics = {**worker.metrics, HEARTBEAT: lambda _: heartbeat(ledger)}


def unexport(worker: Any, ledger: Ledger) -> None:
    """Stop publishing ``ledger`` for one plugin: a no-op where another ledger replaced it,
    or where another plugin of the worker still exports it."""
    with _lock:
        ledgers = collector().ledgers
        if ledgers.get(worker.address) is not ledger:
            return
        left = _exports.pop(worker.address, 1) - 1
        if left:
            _exports[worker.address] = left
            return
        del ledgers[worker.address]
        worker.metrics = {k: v for k, v in worker.metrics.items() if k != HEARTBEAT}
