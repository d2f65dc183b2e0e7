"""Where a benchmark writes its results: checked when the command starts."""

from __future__ import annotations

import contextlib
import os

import click


def writable(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """An output file's path, checked at the start, not after the run it would hold, by
    making it: a folder on the way that is a file, or a place this process may not write, is
    a usage error. What was made to try (the file, its missing folders) is removed again: a
    later option's usage error must leave nothing behind; the folders are made again when
    the file is written."""
    if path is None:
        return None
    full = os.path.abspath(path)
    missing = []  # the folders to make, deepest first
    folder = os.path.dirname(full)
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    existed = os.path.exists(full)
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "a"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{path!r}: cannot write there ({exc.strerror})") from None
    finally:
        if not existed and os.path.isfile(full):
            os.remove(full)
        for made in missing:
            with contextlib.suppress(OSError):
                os.rmdir(made)
    return path
