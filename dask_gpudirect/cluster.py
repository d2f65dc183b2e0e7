"""Getting the plugins onto a cluster: our LocalCUDACluster, and the check that read_* makes."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from dask.base import tokenize
from distributed import Client, Scheduler, Worker, WorkerPlugin

from . import access, discovery, known_workers, targets
from .config import duration_seconds
from .cuda import gpu_count
from .dashboard import DashboardPlugin
from .errors import ClusterError
from .placement import PlacementPlugin, staying
from .plugin import DefaultReaders, GPUDirectPlugin, current_plugin
from .shuffle.plugin import ShuffleSchedulerPlugin, ShuffleWorkerPlugin

logger = logging.getLogger(__name__)

#: What to use instead of a LocalCUDACluster on a machine without a GPU.
WITHOUT_GPU = (
    "Without a GPU use distributed.LocalCluster(plugins={dg.GPUDirectPlugin()}) instead: "
    "everything then runs on the host target (NumPy and pandas partitions)"
)
NO_GPU = (
    "dg.LocalCUDACluster needs an NVIDIA GPU and its driver, and this machine has none. "
    + WITHOUT_GPU
)

#: How UCXX makes progress in the processes this package starts (workers, and the
#: ``dask-gpudirect`` command's own): in a thread of its own, which sleeps on UCX's events and
#: completes requests through Python futures. distributed-ucxx's default, ``blocking``, keeps a
#: process's event loop spinning on UCX's event descriptor: a whole core per process even when
#: idle, and the GIL taken from the process's other threads (a worker's tasks, a client's
#: planning). Not in the user's own process: there the futures fail where two event loops use
#: UCXX at once (a second synchronous ``Client``), see docs/troubleshooting.md.
UCX_PROGRESS_ENV = {"UCXPY_PROGRESS_MODE": "thread", "UCXPY_ENABLE_PYTHON_FUTURE": "1"}


def ucx_progress_env() -> dict[str, str]:
    """:data:`UCX_PROGRESS_ENV` for a process to start, unless this process's environment, which
    that process inherits, already picks a progress mode (the user's choice wins)."""
    return {} if "UCXPY_PROGRESS_MODE" in os.environ else dict(UCX_PROGRESS_ENV)


def progress_ucx_in_a_thread() -> None:
    """:func:`ucx_progress_env` for this process and those it starts: for a process that runs
    one cluster at a time, from one event loop, as the ``dask-gpudirect`` command does (the
    futures that mode completes requests by belong to one loop)."""
    os.environ.update(ucx_progress_env())


try:
    import dask_cuda
except ImportError:  # the CPU install: dg.LocalCUDACluster needs the cuda13 extra
    dask_cuda = None


if dask_cuda is not None:

    class LocalCUDACluster(dask_cuda.LocalCUDACluster):
        """``dask_cuda.LocalCUDACluster`` that keeps the user's ``plugins``.

        dask-cuda's class replaces each worker's plugins with its own (CPU affinity, RMM, cuDF
        spilling), silently dropping ``plugins=``; this one gives every worker both. Its workers
        make UCXX progress in a thread (:data:`UCX_PROGRESS_ENV`).
        """

        def __init__(self, *args: Any, plugins: set[WorkerPlugin] | None = None, **kwargs: Any):
            if not gpu_count():
                raise ClusterError(NO_GPU)
            self._user_plugins = set(plugins or ())
            super().__init__(*args, **kwargs)

        def new_worker_spec(self) -> dict:
            spec = super().new_worker_spec()
            for worker in spec.values():
                options = worker["options"]
                options["plugins"] = set(options["plugins"]) | self._user_plugins
                options["env"] = {**ucx_progress_env(), **options.get("env", {})}
            return spec


#: The longest wait for each worker's answer while a read is set up.
SETUP_TIMEOUT = "gpudirect.planning.timeout"


def silent(workers: list[str] | None, timeout: float, doing: str) -> ClusterError:
    """The error of a read whose ``workers`` (None: one that none names) gave no answer in
    ``timeout`` seconds."""
    who = f"worker(s) {', '.join(workers)}" if workers else "a worker"
    return ClusterError(
        f"{who} did not answer in {timeout:g} s ({SETUP_TIMEOUT}) while {doing}: stopped or "
        "overloaded; read again once it answers, or raise the key"
    )


async def run_each_within(
    client: Client, function: Any, workers: list[str], timeout: float, **kwargs: Any
) -> tuple[dict[str, Any], list[str]]:
    """``client.run(function, on_error="return", **kwargs)`` on each of ``workers`` apart, all
    at once, for at most ``timeout`` seconds: the answers (an error as ``client.run`` returns
    it), and the workers that gave none in time, their calls given up. (One ``client.run`` of
    all the workers answers all or nothing: a stopped worker held it up for as long as it stayed
    stopped, and nothing said which.)"""
    calls = {
        w: asyncio.ensure_future(
            client.run(function, workers=[w], on_error="return", asynchronous=True, **kwargs)
        )
        for w in workers
    }
    if not calls:
        return {}, []
    done, pending = await asyncio.wait(calls.values(), timeout=timeout)
    for call in pending:
        call.cancel()
    answers: dict[str, Any] = {}
    for call in done:
        answers.update(call.result())
    return answers, [w for w, call in calls.items() if call in pending]


def run_each(
    client: Client, function: Any, workers: list[str], doing: str, **kwargs: Any
) -> dict[str, Any]:
    """:func:`run_each_within`, limited by ``gpudirect.planning.timeout``: a ClusterError names the
    workers that did not answer (``doing``: what the read was doing)."""
    timeout = duration_seconds(SETUP_TIMEOUT)
    answers, late = client.sync(run_each_within, client, function, workers, timeout, **kwargs)
    if late:
        raise silent(late, timeout, doing)
    return answers


def has_plugin(dask_worker: Worker) -> bool:
    return GPUDirectPlugin.name in dask_worker.plugins


async def _describe(
    dask_worker: Worker, entries: list[str], listing: discovery.Listing
) -> dict[str, Any] | None:
    """What the survey asks each worker; None where the reader plugin is missing."""
    if not has_plugin(dask_worker):
        return None
    plugin = current_plugin(dask_worker)
    # listing a large directory off the event loop: the worker keeps answering meanwhile
    views = await asyncio.to_thread(discovery.views, entries, listing)
    names = ("host", "device") if plugin.gpus else ("host",)
    memory = {name: targets.module(name).memory_bytes(dask_worker) for name in names}
    # whether the client may list the paths for this worker (see known_workers): not where
    # allowed roots keep it to some
    namespace = discovery.namespace() if access.roots() is None else None
    return {**plugin.describe(), "views": views, "memory": memory, "namespace": namespace}


def _registered(dask_scheduler: Scheduler) -> dict[str, Any]:
    """The worker and scheduler plugins the scheduler holds, by name; the server ids of its
    workers that stay (a restarted worker has a new one; a retiring one, leaving, is given no
    read to plan or run, and is not asked: one that closes as it is asked holds the read up for
    Distributed's connect timeout, 30 s) and its reader plugin (or the defaults'), hashed
    (None: none)."""
    workers, scheduler = dask_scheduler.worker_plugins, dask_scheduler.plugins
    readers = workers.get(GPUDirectPlugin.name) or workers.get(DefaultReaders.name)
    return {
        "worker": list(workers),
        "scheduler": list(scheduler),
        "servers": {
            w: ws.server_id
            for w, ws in dask_scheduler.workers.items()
            if staying(dask_scheduler, w)
        },
        "readers": None if readers is None else tokenize(readers),
    }


def ensure_plugins(
    client: Client,
    need_readers: list[str] | None = None,
    readers: bool = True,
    timeout: float | None = None,
) -> None:
    """Register the reader, shuffle, placement and dashboard plugins where they are missing, and
    say so. The readers come through :class:`.DefaultReaders`, which sets up a
    GPUDirectPlugin of defaults only on a worker without one of its own (``plugins=``, a
    user's ``register_plugin``), now and on every worker that joins later. Where all are there
    (every call after the first): one round trip to the scheduler. Before, one more to the
    workers, unless the caller says which lack the reader plugin (``need_readers``: the survey
    learns which); a shuffle, which reads nothing, registers no readers (``readers=False``).
    ``timeout``: the longest wait, in seconds, for the workers to set up a worker plugin (a
    stopped worker answers never), else a TimeoutError; None: no limit."""
    held = client.run_on_scheduler(_registered)
    _register_missing(client, held, need_readers, readers, timeout)


def _register_missing(
    client: Client,
    held: dict[str, list[str]],
    need_readers: list[str] | None,
    readers: bool = True,
    timeout: float | None = None,
) -> None:
    """:func:`ensure_plugins`, the scheduler's plugins (``held``) known."""
    missing = need_readers
    if missing is None:
        missing = []
        if not {GPUDirectPlugin.name, DefaultReaders.name} & set(held["worker"]):
            missing = [w for w, ok in client.run(has_plugin).items() if not ok]
    if missing:
        cluster = client.cluster
        if dask_cuda is not None and type(cluster) is dask_cuda.LocalCUDACluster:
            logger.warning(
                "workers of this dask_cuda.LocalCUDACluster lack GPUDirectPlugin: dask-cuda's "
                "class drops plugins= (it installs only its own); use "
                "dask_gpudirect.LocalCUDACluster to keep them"
            )
        logger.info(
            "registering GPUDirectPlugin with defaults on %d worker(s): %s", len(missing), missing
        )
    if missing or (readers and DefaultReaders.name not in held["worker"]):
        _register(client, DefaultReaders(), timeout)
    for plugin, kind in (
        (ShuffleWorkerPlugin, "worker"),
        (ShuffleSchedulerPlugin, "scheduler"),
        (PlacementPlugin, "scheduler"),
        (DashboardPlugin, "scheduler"),
    ):
        if plugin.name not in held[kind]:
            _register(client, plugin(), timeout)


def _register(client: Client, plugin: Any, timeout: float | None) -> None:
    """``client.register_plugin(plugin)``, a worker plugin waited for at most ``timeout``
    seconds (None: as long as the workers take): the scheduler keeps the plugin either way and
    hands it to a worker that answers late, or joins later. (Distributed's public call takes
    no timeout: this is its worker branch, with one.)"""
    name: str = plugin.name  # each of the package's plugins has one
    if timeout is None or not isinstance(plugin, WorkerPlugin):
        client.register_plugin(plugin)
        return
    client.sync(
        client._register_worker_plugin,
        plugin=plugin,
        name=name,
        idempotent=bool(getattr(plugin, "idempotent", False)),
        callback_timeout=timeout,
    )


def survey(
    client: Client, entries: list[str], listing: discovery.Listing = discovery.FLAT
) -> dict[str, dict]:
    """Per worker: its GPU count, its plugin options, and how it sees each path of ``entries``
    (directories listed as ``listing`` says). The scheduler is asked which workers and plugins
    it has, then each of those workers at once, and the workers asked again only where one
    lacked the reader plugin. Where the last survey found only workers that see the client's
    files, and the scheduler has the same ones, only the scheduler is asked
    (:mod:`.known_workers`). Each worker's answer, and the plugins' set-up on the workers, is
    waited for at most ``gpudirect.planning.timeout``: a worker that gives none (stopped,
    hung) is a ClusterError that names it."""
    timeout = duration_seconds(SETUP_TIMEOUT)
    held = client.run_on_scheduler(_registered)
    known = known_workers.recall(client)
    if known is not None and known.still(held):
        _register_for_read(client, held, [], timeout)
        return known.survey(entries, listing)

    def described(workers: list[str]) -> tuple[dict[str, Any], list[str]]:
        asked = run_each(client, _describe, workers, SURVEYED, entries=entries, listing=listing)
        return answered(asked)

    workers, gone = described(list(held["servers"]))
    missing = [w for w, info in workers.items() if info is None]
    _register_for_read(client, held, missing, timeout)
    if missing:
        workers, more_gone = described(list(workers))
        gone += more_gone
    if not workers:
        raise ClusterError("the cluster has no workers")
    lacking = [w for w, info in workers.items() if info is None]
    if lacking:  # a worker restarted as the plugin was registered
        raise ClusterError(f"GPUDirectPlugin is not set up on worker(s) {lacking}: try again")
    if not missing and not gone:  # else the plugins or the workers have changed meanwhile
        known_workers.remember(client, workers, held)
    return workers


#: What a read does while it asks each worker how it sees the paths (:func:`silent`).
SURVEYED = "the read asked it how it sees the paths (the survey)"


def _register_for_read(
    client: Client, held: dict[str, Any], missing: list[str], timeout: float
) -> None:
    """:func:`_register_missing` for a read, within ``timeout``: a ClusterError past it. (Every
    worker has just answered the survey: one that stops answering now is named by none.)"""
    try:
        _register_missing(client, held, missing, timeout=timeout)
    except TimeoutError:
        doing = "the package's plugins were set up on the workers for a read"
        raise silent(None, timeout, doing) from None


def answered(results: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``client.run``'s results (``on_error="return"``) as the workers' answers, and the
    workers that left while they were asked (killed, or gone before the call reached them):
    their calls failed with a closed comm, an ``OSError``, and the work goes on without them.
    Any other error is raised, as ``client.run`` raises it."""
    gone = [w for w, result in results.items() if isinstance(result, OSError)]
    for result in results.values():
        if isinstance(result, BaseException) and not isinstance(result, OSError):
            raise result
    if gone:
        logger.warning("worker(s) %s left the cluster while asked; going on without them", gone)
    return {w: result for w, result in results.items() if w not in gone}, gone
