"""``dask worker --preload dask_gpudirect.preload``: every worker starts with the plugin.

Options as flags after the preload, e.g. ``dask worker ADDR --preload dask_gpudirect.preload
--gpudirect-threads=8``: the worker CLI hands options it does not know to the preload (there is
no ``--preload-argv`` flag). Give the scheduler address as ``ADDR``: with ``--scheduler-file``
and no address, click takes the first such flag for the address, so ``--gpudirect-threads=8``
is dropped silently and ``--gpudirect-threads 8`` stops the worker ("unexpected extra
argument"). A bad value, a flag's or the worker's config's, stops the worker with its error.
Anything not given comes from Dask config (``DASK_GPUDIRECT__READER__THREADS=8`` ...).

``dask cuda worker`` hands every preload the same flags, its own ``--create-cuda-context``
among them, so this preload accepts (and ignores) that one. dask-cuda's own preload rejects ours:
under ``dask cuda worker`` set options with ``DASK_GPUDIRECT__*`` variables, not flags.
"""

from __future__ import annotations

import click
from distributed import Worker, WorkerPlugin

from .errors import GPUDirectError
from .plugin import GPUDirectPlugin


@click.command()
@click.option("--gpudirect-target", type=click.Choice(["device", "host"]), default=None)
@click.option("--gpudirect-threads", type=int, default=None, help="parallel reads per worker")
@click.option("--gpudirect-task-size", default=None, help="bytes per read task, e.g. 4MiB")
@click.option("--gpudirect-compat-mode", type=click.Choice(["AUTO", "ON", "OFF"]), default=None)
@click.option("--create-cuda-context/--no-create-cuda-context", hidden=True, default=False)
def dask_setup(
    worker: Worker,
    gpudirect_target: str | None,
    gpudirect_threads: int | None,
    gpudirect_task_size: str | None,
    gpudirect_compat_mode: str | None,
    create_cuda_context: bool,  # dask cuda worker's flag for its own preload: not ours to act on
) -> None:
    """Queue a GPUDirectPlugin with the ``--gpudirect-*`` flags for the worker's start."""
    options = {
        "target": gpudirect_target,
        "threads": gpudirect_threads,
        "task_size": gpudirect_task_size,
        "compat_mode": gpudirect_compat_mode,
    }
    # Set up with the plugins given at start (preloads run just before them), not here:
    # distributed logs and ignores an error of a preload, but a plugin that fails at start
    # (a bad gpudirect.* value, a flag's or the worker's config's) stops the worker, with that
    # error.
    plugin: WorkerPlugin
    try:
        plugin = GPUDirectPlugin(**{k: v for k, v in options.items() if v is not None})
    except GPUDirectError as exc:
        plugin = _Refused(exc)
    worker._pending_plugins = (*worker._pending_plugins, plugin)


class _Refused(WorkerPlugin):
    """Stands for a GPUDirectPlugin whose options are bad: its setup raises their error."""

    name = GPUDirectPlugin.name

    def __init__(self, error: GPUDirectError):
        self.error = error

    def setup(self, worker: Worker) -> None:
        raise self.error
