"""``gpudirect.allowed-roots``: the directories a worker agrees to read from.

A Dask client can ask workers to read any path their process can open. Where workers serve
several users, ``allowed-roots`` keeps them to the datasets they are meant to serve: a path is
allowed when, with symlinks and ``..`` resolved, it lies inside one of the roots. Checked on the
worker, from the worker's own config, both when placement asks what a worker can read and
again right before each read.
"""

from __future__ import annotations

import os

import dask.config

from .errors import InputError


def allowed(path: str) -> bool:
    """Whether this process's ``gpudirect.allowed-roots`` (None: no limit) admit ``path``."""
    roots = dask.config.get("gpudirect.allowed-roots")
    if roots is None:
        return True
    real = os.path.realpath(path)
    return any(
        os.path.commonpath([real, os.path.realpath(root)]) == os.path.realpath(root)
        for root in roots
    )


def check(path: str) -> None:
    """Raise an InputError naming ``path`` when the allowed roots do not admit it."""
    if not allowed(path):
        roots = dask.config.get("gpudirect.allowed-roots")
        raise InputError(
            path,
            f"outside gpudirect.allowed-roots {list(roots)} (it resolves to "
            f"{os.path.realpath(path)}): this worker refuses to read it",
        )
