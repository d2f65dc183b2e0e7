"""The ``gpudirect.shuffle.*`` settings a shuffle's workers read, each checked as it is read.

A value that cannot be used is a ConfigError naming the key, the value and what it takes, not
an error of Dask's parsers deep in a worker's stage (which the client could only report as a
worker that did not answer). The client checks its own settings before a shuffle makes its inputs
(:func:`check`): where workers share its config, as a ``LocalCluster``'s do, a bad one stops
the shuffle before any worker runs it.
"""

from __future__ import annotations

from typing import Any

import dask.config

from ..config import boolean, duration_seconds, positive_size, size_in_bytes
from ..errors import ConfigError


def size(key: str, cap: int, auto: str | None = None) -> int:
    """``gpudirect.shuffle.<key>`` in bytes (``auto``: the size given here), at most
    ``cap``: a positive size."""
    value = _value(key)
    nbytes = positive_size(auto if value == "auto" and auto else value)
    if nbytes is None:
        raise _bad(key, value, "a positive size, like '512MiB'")
    return max(min(nbytes, cap), 1)


def limit(key: str, whole: int) -> int:
    """``gpudirect.shuffle.<key>`` in bytes: a fraction (0 to 1) of ``whole``, or a size."""
    value = _value(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        return int(value * whole)
    return _bytes(key, value, "a fraction from 0 to 1, or a size like '8GiB'")


def disk_limit() -> int | None:
    """``gpudirect.shuffle.disk-limit`` in bytes; None: no limit but the disk's free space."""
    value = _value("disk-limit")
    return None if value is None else _bytes("disk-limit", value, "a size like '100GiB', or null")


def timeout() -> float:
    """``gpudirect.shuffle.timeout`` in seconds: the longest wait on a peer."""
    return duration_seconds("gpudirect.shuffle.timeout")


def progress() -> bool:
    """``gpudirect.shuffle.progress``: a bool (a string such as "false" set in Python would
    read as true)."""
    return boolean("gpudirect.shuffle.progress")


def check() -> None:
    """This process's settings, each read as a worker reads it: a ConfigError if one cannot
    be used."""
    for key in ("chunk-size", "max-in-flight"):
        size(key, 1, auto="1B")
    for key in ("device-limit", "host-limit"):
        limit(key, 1)
    disk_limit()
    timeout()
    progress()


def _value(key: str) -> Any:
    return dask.config.get(f"gpudirect.shuffle.{key}")


def _bytes(key: str, value: Any, wanted: str) -> int:
    """``value`` in bytes, at least 0."""
    nbytes = size_in_bytes(value)
    if nbytes is None or nbytes < 0:
        raise _bad(key, value, wanted)
    return nbytes


def _bad(key: str, value: Any, wanted: str) -> ConfigError:
    return ConfigError(f"gpudirect.shuffle.{key}={value!r}: use {wanted}")
