"""The ``dask-gpudirect`` command: ``demo``, ``bench`` and ``probe``."""

from __future__ import annotations

import os
from typing import Any

import click

from .bench import bench
from .cluster import ucx_progress_env
from .demo import demo
from .errors import GPUDirectError
from .probe import probe


class _Commands(click.Group):
    """The library's errors as one-line messages (exit status 1), not tracebacks: the library
    raises its own error family, never command-line types."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GPUDirectError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Commands)
@click.version_option(package_name="dask-gpudirect")
def main() -> None:
    """Dask loading straight into GPU memory, and the path every byte took."""


main.add_command(demo)
main.add_command(bench)
main.add_command(probe)


def run(command: click.Group = main) -> None:
    """The ``dask-gpudirect`` command (or ``command``) in this process, its UCXX progressed in a
    thread (:data:`.cluster.UCX_PROGRESS_ENV`): a command runs one cluster at a time, from one
    event loop, so the futures that mode completes requests by are safe here."""
    os.environ.update(ucx_progress_env())
    command()


if __name__ == "__main__":
    run()
