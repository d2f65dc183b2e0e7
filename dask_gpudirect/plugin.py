"""GPUDirectPlugin: each worker's readers, its ledger's export and its GPU capabilities."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

from distributed import Worker, WorkerPlugin, get_worker

from . import access, ledger, metrics, targets
from .config import boolean, resolve_options
from .cuda import gpu_count
from .errors import ClusterError

logger = logging.getLogger(__name__)


class GPUDirectPlugin(WorkerPlugin):
    """Loads shards straight into GPU memory (or host memory where there is no GPU).

    Options come from Dask config (``gpudirect.*``) on the worker; keywords given here override
    them: ``target``, ``threads``, ``task_size``, ``compat_mode``, ``max_records``.

    Register it with ``dg.LocalCUDACluster(plugins={GPUDirectPlugin()})``,
    ``client.register_plugin(GPUDirectPlugin())``, or
    ``dask worker --preload dask_gpudirect.preload``.
    """

    name = "gpudirect"
    # Not idempotent: a user's register_plugin(GPUDirectPlugin(threads=8)) must replace the
    # defaults that read_* registered earlier (read_* only registers where it is missing).
    idempotent = False

    def __init__(self, **options: Any):
        resolve_options(options)  # reject unknown keywords in the caller's process
        self.overrides = options

    def setup(self, worker: Worker) -> None:
        if getattr(self, "address", worker.address) != worker.address:
            # LocalCluster(processes=False, plugins={...}) hands this one object to every worker
            # of the process: each gets a copy of its own (readers, ledger, address), or the
            # first to close would close the readers of all
            _set_up_own(worker, self.overrides)
            return
        # a bad gpudirect.allowed-roots or reader option fails the worker's start, not a read
        access.roots()
        self.options = resolve_options(self.overrides)
        freeze = boolean("gpudirect.worker.freeze-gc")
        self.address = worker.address
        self.gpus = gpu_count()
        self.ledger = ledger.of(worker)  # the worker's, so registering again keeps its counts
        self.ledger.keep(self.options["max_records"])
        self._targets: dict[str, targets.Target] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._exported = False  # a setup that fails below publishes nothing to take back
        if self.gpus:
            self.target("device")  # configures kvikio now, so a bad option fails at setup
            _register_cudf_with_dask()
        metrics.export(worker, self.ledger)  # /metrics counters, totals in heartbeats
        self._exported = True
        if freeze:
            _freeze_imports(worker)
        # set up: the readers a read task finds while this plugin is registered again (the
        # worker drops it, tears it down, then holds the new one before setting it up)
        worker._gpudirect_readers = self  # type: ignore[attr-defined]
        logger.info(
            "gpudirect on %s: %d GPU(s), options %s", worker.address, self.gpus, self.options
        )

    def teardown(self, worker: Worker) -> None:
        if not hasattr(self, "_targets"):  # setup failed (a bad option) before making them
            return
        if self._exported:  # else another plugin's export (the shuffle's) would be taken
            metrics.unexport(worker, self.ledger)
        with self._lock:  # a read that takes a target from now on gets one of its own
            closing, self._targets, self._closed = list(self._targets.values()), {}, True
        for target in closing:
            target.close()

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[targets.Target]:
        """This worker's reader for target ``name``, held for one read task: taken and counted
        as in use at once, so a teardown (the plugin registered again) meanwhile waits for the
        task to end. A plugin torn down already reads on a reader of its own options that
        closes when the task ends (a read that found it while the new one was set up)."""
        with contextlib.ExitStack() as stack:
            with self._lock:  # counted in use before a teardown can close it
                target = stack.enter_context(self._target(name).used())
                if self._closed:
                    del self._targets[name]
                    target.close()  # released when this task ends
            yield target

    def target(self, name: str) -> targets.Target:
        """This worker's reader for target ``name``, made on first use."""
        with self._lock:
            return self._target(name)

    def _target(self, name: str) -> targets.Target:
        """:meth:`target`, the plugin's lock held."""
        if name not in self._targets:
            if name == "device" and not self.gpus:
                raise ClusterError(
                    f"worker {self.address} has no usable GPU, so it cannot load to "
                    "target='device'; use target='host'"
                )
            module = targets.module(name)
            self._targets[name] = module.TARGET(self.options, self.ledger)
        return self._targets[name]

    def describe(self) -> dict[str, Any]:
        """What placement and reports need to know about this worker."""
        return {"gpus": self.gpus, "options": self.options}


class DefaultReaders(WorkerPlugin):
    """Sets up a GPUDirectPlugin of defaults on a worker that has none, and leaves a worker's
    own alone. Registered through the scheduler, it reaches every worker that joins later
    too: one started without ``plugins=`` that a read placed on a lost worker may move to.
    (Registering GPUDirectPlugin itself where one worker lacked it replaced every worker's,
    the user's options and the readers of running reads with it.)"""

    name = "gpudirect-defaults"
    idempotent = False  # registered again, it reaches the workers that lack readers now

    def setup(self, worker: Worker) -> None:
        if GPUDirectPlugin.name not in worker.plugins:
            _set_up_own(worker, {})


def _set_up_own(worker: Worker, options: dict[str, Any]) -> None:
    """A GPUDirectPlugin of ``worker``'s own, set up, then held by it (a bad option raises
    before the worker holds it)."""
    plugin = GPUDirectPlugin(**options)
    plugin.setup(worker)
    worker.plugins[GPUDirectPlugin.name] = plugin


def _freeze_imports(worker: Worker) -> None:
    """Take what the worker holds at its first setup out of the garbage collector's walks.

    That is cuDF's, pandas' and pyarrow's modules, classes and functions: millions of objects
    that live as long as the worker and that every full collection walked again, 110-170 ms
    each on an H200 worker, several a benchmark run, landing inside shuffle stages. Once only,
    after a collection, and not where the worker already holds data: frozen objects are never
    collected, so a partition frozen in a reference cycle would outlive its last user. Only in
    a process a nanny started for the worker: one that runs workers beside the user's own code
    (``LocalCluster(processes=False)``) is the user's to tune.
    """
    if worker.nanny is None or gc.get_freeze_count() or worker.state.tasks:
        return
    gc.collect()
    gc.freeze()


def _register_cudf_with_dask() -> None:
    """Teach this worker's Dask the size and the dispatch of cuDF objects.

    dask_cudf registers them on import; without it Dask measures a cuDF frame as a small Python
    object, so the scheduler's byte counts (memory, shuffle planning) are wrong.
    """
    try:
        import dask_cudf  # noqa: F401
    except ImportError:
        logger.warning("dask_cudf is missing: Dask will not know the size of cuDF partitions")


def current_plugin(worker: Worker | None = None) -> GPUDirectPlugin:
    """The plugin of ``worker`` (default: the worker running this task), or a clear error if it
    was never registered: the one way the package reaches a worker's plugin."""
    if worker is None:
        try:
            worker = get_worker()
        except ValueError:  # Dask's "No worker found"
            raise ClusterError(
                "dask-gpudirect reads run on the workers of a distributed cluster (each on a "
                "worker that sees its file, through its GPUDirectPlugin), and this task ran "
                "outside one: compute with a distributed Client, not scheduler='sync', "
                "'threads' or 'processes'"
            ) from None
    plugin = worker.plugins.get(GPUDirectPlugin.name)
    if not isinstance(plugin, GPUDirectPlugin) or not hasattr(plugin, "_closed"):
        # registered again: the old one removed, or the new one not set up yet; the last one
        # set up serves the reads that start meanwhile, as it serves those already running
        plugin = getattr(worker, "_gpudirect_readers", plugin)
    if not isinstance(plugin, GPUDirectPlugin) or not hasattr(plugin, "_closed"):
        raise ClusterError(
            f"worker {worker.address} has no GPUDirectPlugin: register it with "
            "client.register_plugin(dask_gpudirect.GPUDirectPlugin())"
        )
    return plugin
