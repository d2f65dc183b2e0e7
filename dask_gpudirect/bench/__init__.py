"""Benchmarks that print ratios against baselines measured in the same run.

Run them as ``dask-gpudirect bench read`` (or ``shuffle``, ``etl``), or ``python -m
dask_gpudirect.bench read``; ``bench scale`` runs read and shuffle on 1, 2, ... GPUs into one
table; ``bench plot results.json out.png`` draws a result again.
"""

from __future__ import annotations

import click


@click.group(name="bench")
def bench() -> None:
    """Measure dask-gpudirect against its peers and the hardware ceilings."""


def _register() -> None:
    from .etl import etl
    from .plot import plot
    from .read import read
    from .scale import scale
    from .shuffle import shuffle

    bench.add_command(read)
    bench.add_command(shuffle)
    bench.add_command(scale)
    bench.add_command(etl)
    bench.add_command(plot)


_register()
