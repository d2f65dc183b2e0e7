"""The dashboard page's plot: bytes/s per path per worker, built like Distributed's own pages.

Workers send their ledger's bytes per path with every heartbeat (see :mod:`.metrics`); a rate is
how much a worker's totals grew between its last two heartbeats, so it lags by one heartbeat
(about a second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bokeh.core.properties import without_property_validation
from bokeh.models import (
    ColumnDataSource,
    DataRange1d,
    FactorRange,
    HoverTool,
    NumeralTickFormatter,
)
from bokeh.models.annotations.labels import Title
from bokeh.palettes import Category20
from bokeh.plotting import figure
from dask.utils import format_bytes
from distributed.dashboard.components import DashboardComponent, add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env
from distributed.dashboard.utils import update
from distributed.utils import log_errors

from .ledger import COPIES
from .metrics import HEARTBEAT

if TYPE_CHECKING:
    from bokeh.document import Document
    from distributed import Scheduler

#: One color per path, the same on every page load.
COLORS: dict[str, str] = dict(zip(COPIES, Category20[len(COPIES)], strict=True))


def rates(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, float]:
    """Bytes/s per path between two heartbeat samples of one worker; 0 with no earlier sample.

    A total that shrank (the worker restarted, its ledger started over) counts as 0.
    """
    if before is None:
        return dict.fromkeys(after["bytes"], 0.0)
    elapsed = after["time"] - before["time"]
    return {
        path: max(0, n - before["bytes"].get(path, 0)) / elapsed
        for path, n in after["bytes"].items()
    }


class PathBandwidth(DashboardComponent):
    """One bar per worker and path: the bytes/s that path carried over the last heartbeat."""

    @log_errors
    def __init__(self, scheduler: Scheduler, **kwargs: Any) -> None:
        DashboardComponent.__init__(self)
        self.scheduler = scheduler
        self.samples: dict[str, dict[str, Any]] = {}  # worker -> its latest heartbeat sample
        self.rates: dict[str, dict[str, float]] = {}  # worker -> bytes/s per path
        self.source = ColumnDataSource(
            {"y": [], "rate": [], "bytes": [], "worker": [], "path": [], "color": []}
        )
        self.root = figure(
            # A Title, not a str: bokeh turns a str into one only while property validation is
            # on, and the scheduler's dashboard callbacks turn it off process-wide meanwhile.
            title=Title(text="GPUDirect bytes/s per path"),
            y_range=FactorRange(),
            x_range=DataRange1d(start=0),
            tools="",
            name="gpudirect_bandwidth",
            **kwargs,
        )
        self.root.hbar(
            y="y",
            right="rate",
            height=0.8,
            fill_color="color",
            line_color=None,
            source=self.source,
        )
        self.root.xaxis[0].formatter = NumeralTickFormatter(format="0.0 b")
        self.root.xaxis.axis_label = "bytes/s"
        self.root.toolbar_location = None
        self.root.add_tools(
            HoverTool(
                tooltips=[
                    ("worker", "@worker"),
                    ("path", "@path"),
                    ("bytes/s", "@rate{0.00 b}"),
                    ("bytes in all", "@bytes{0.00 b}"),
                ]
            )
        )

    @without_property_validation
    @log_errors
    def update(self) -> None:
        data: dict[str, list] = {name: [] for name in self.source.data}
        workers = self.scheduler.workers
        for gone in self.samples.keys() - workers.keys():
            del self.samples[gone], self.rates[gone]
        for address, ws in workers.items():
            sample = ws.metrics.get(HEARTBEAT)
            if sample is None:
                continue
            before = self.samples.get(address)
            if before is None or sample["time"] > before["time"]:
                self.rates[address] = rates(before, sample)
                self.samples[address] = sample
            for path, nbytes in sorted(sample["bytes"].items()):
                data["y"].append((address, path))
                data["rate"].append(self.rates[address].get(path, 0.0))
                data["bytes"].append(nbytes)
                data["worker"].append(address)
                data["path"].append(path)
                data["color"].append(COLORS.get(path, "grey"))
        self.root.y_range.factors = data["y"]
        self.root.title.text = (
            f"GPUDirect bytes/s per path: {format_bytes(sum(data['rate']))}/s on all workers"
        )
        update(self.source, data)


@log_errors
def bandwidth_doc(scheduler: Scheduler, extra: dict[str, Any], doc: Document) -> None:
    bandwidth = PathBandwidth(scheduler, sizing_mode="stretch_both")
    bandwidth.update()
    add_periodic_callback(doc, bandwidth, 500)
    doc.title = "Dask: GPUDirect bandwidth"
    doc.add_root(bandwidth.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME
