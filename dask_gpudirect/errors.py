"""The errors dask-gpudirect raises, one family, so users can catch them and tests assert on them.

Each is also the built-in a Dask user would expect: bad input and bad config are ``ValueError``s,
an unknown keyword a ``TypeError``, a failed shuffle or an unfit cluster a ``RuntimeError``. The
command line turns them into messages (``cli.py``); the library raises no command-line types.
"""

from __future__ import annotations

import os


class GPUDirectError(Exception):
    """The base of every error dask-gpudirect raises on purpose."""


class InputError(GPUDirectError, ValueError):
    """A file or an option that cannot be loaded; the message names the file and the fault."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = None if path is None else os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self) -> tuple[type, tuple[str | None, str]]:
        return type(self), (self.path, self.problem)


def flag(name: str, value: object, none: bool = False) -> None:
    """An InputError unless ``value`` is True or False (or None, where ``none``): a string
    "no" would be taken as true."""
    if not (isinstance(value, bool) or (none and value is None)):
        also = ", or None" if none else ""
        raise InputError(None, f"{name} must be True or False{also}, not {value!r}")


class ConfigError(GPUDirectError, ValueError):
    """A ``gpudirect.allowed-roots`` setting or a reader option (a ``GPUDirectPlugin``
    keyword, or the ``gpudirect.*`` key it overrides) that cannot be used; raised where it is
    read. (A bad value of a key that one call reads, a blocksize or the shuffle engine, is that
    call's :class:`InputError`.)"""


class OptionError(GPUDirectError, TypeError):
    """A keyword argument a function or the plugin does not take: a ``TypeError``, as Python
    raises for an unknown keyword."""


class ClusterError(GPUDirectError, RuntimeError):
    """A cluster that cannot do what was asked: ``dg.LocalCUDACluster`` without a GPU, a worker
    without the plugin or without a GPU for ``target="device"``, a cluster with no workers."""


class ShuffleError(GPUDirectError, RuntimeError):
    """A shuffle that could not finish; no partial output was returned and the cluster is usable.

    ``secondary`` marks a failure that only follows another one (a peer that had already ended
    the run, an abort from the client), so the error shown names the first cause.
    """

    def __init__(self, message: str, secondary: bool = False):
        self.secondary = secondary
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, bool]]:
        return type(self), (str(self), self.secondary)
