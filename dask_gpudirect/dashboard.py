"""The ``/gpudirect`` page on the scheduler's Dask dashboard: bytes/s per path per worker.

Distributed builds its own pages into one Bokeh server when the scheduler starts, from a
module-level dict, and has no hook to add a page later. The scheduler's HTTP server routes to
every tornado application added to it (Distributed adds its Bokeh server and Jupyter that way),
so this scheduler plugin adds a second Bokeh server as Distributed's ``connect`` builds the first:
``BokehApplication`` with the same prefix and page template. Bokeh is imported only here, on the
scheduler, and only where Distributed serves its dashboard.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from distributed import Scheduler, SchedulerPlugin
from tornado.ioloop import IOLoop

if TYPE_CHECKING:
    from bokeh.server.tornado import BokehTornado

logger = logging.getLogger(__name__)

ROUTE = "/gpudirect"


class DashboardPlugin(SchedulerPlugin):
    """Adds the ``/gpudirect`` page where the scheduler serves the Dask dashboard."""

    name = "gpudirect-dashboard"
    idempotent = True

    async def start(self, scheduler: Scheduler) -> None:
        dashboard = _dask_dashboard(scheduler)
        if dashboard is None:
            logger.info("the scheduler serves no Dask dashboard, so no %s page", ROUTE)
            return
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables

        from .bandwidth import bandwidth_doc

        app = BokehApplication(
            {ROUTE: bandwidth_doc},
            scheduler,
            prefix=dashboard.prefix,
            template_variables=template_variables(scheduler),
        )
        scheduler.http_application.add_application(app)  # stopped with the scheduler's
        app.initialize(IOLoop.current())
        app.start()


def _dask_dashboard(scheduler: Scheduler) -> BokehTornado | None:
    """The Bokeh server of Distributed's dashboard on ``scheduler``, or None if it has none."""
    try:
        from bokeh.server.tornado import BokehTornado
    except ImportError:
        return None
    apps = scheduler.http_application.applications
    return next((app for app in apps if isinstance(app, BokehTornado)), None)
