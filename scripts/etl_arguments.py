"""The options the scripts that time ``bench etl``'s pipeline share: its cluster and its data."""

from __future__ import annotations

import argparse


def add_cluster_and_data(parser: argparse.ArgumentParser) -> None:
    """``--target --workers --protocol`` (the bench's cluster) and ``--dir --gib --files`` (its
    etl dataset, written where missing)."""
    parser.add_argument("--target", default="device")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--protocol", default="ucxx")
    parser.add_argument("--dir", default="/var/tmp/dask-gpudirect-bench/etl")
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--files", type=int, default=256)
