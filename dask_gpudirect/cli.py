"""The ``dask-gpudirect`` command: ``demo``, ``bench`` and ``probe``."""

from __future__ import annotations

from typing import Any

import click

from .bench import bench
from .cluster import progress_ucx_in_a_thread
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


def run() -> None:
    """The ``dask-gpudirect`` command, its UCXX progressed in a thread."""
    progress_ucx_in_a_thread()
    main()


if __name__ == "__main__":
    run()
