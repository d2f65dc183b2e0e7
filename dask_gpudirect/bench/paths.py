"""Where a benchmark writes its results: checked when the command starts."""

from __future__ import annotations

import os

import click


def writable(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """An output file's path, checked at the start, not after the run it would hold: its
    folders are made where missing, and one that is a file, or a place this process may not
    write, is a usage error (a file made to try is removed again)."""
    if path is None:
        return None
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{path!r}: cannot write there ({exc.strerror})") from None
    if not existed:
        os.remove(path)
    return path
