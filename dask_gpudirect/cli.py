"""The ``dask-gpudirect`` command: ``demo``, ``bench`` and ``probe``."""

from __future__ import annotations

import click

from .bench import bench
from .demo import demo
from .probe import probe


@click.group()
@click.version_option(package_name="dask-gpudirect")
def main() -> None:
    """Dask loading straight into GPU memory, and the path every byte took."""


main.add_command(demo)
main.add_command(bench)
main.add_command(probe)

if __name__ == "__main__":
    main()
