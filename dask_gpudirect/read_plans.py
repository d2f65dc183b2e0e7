"""Whole reads' plans, kept by the client that made them.

A notebook cell or a job run again reads the same unchanged files with the same options. Each
worker already answers from its own cache of single files' plans (:mod:`.plan_cache`), but
asking it is a round trip, and the answers for 256 files are half of a read's planning time.
The client keeps the merged plan of each read under what the survey found just before (every
file's path, size, modification and status-change times, and which worker sees which) and the
read's options, and plans again only where any of it changed, as dask-expr keeps its Parquet
dataset info and cudf-polars its footer samples: a file rewritten with its size and
modification time kept (``cp -p``, ``rsync -t``) has a new status-change time. Under the same
key and how the plan was cut into partitions, it also keeps the collection's expression:
placing and naming the partitions again (Dask tokenizes every shard) cost a kept plan's read
more than the plan. Local files only: a remote object's listing may carry no modification
time. Nothing is trusted blindly: every read still checks the file it opens against the
shard's stamp (:mod:`.stamps`), and errors are never kept.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Hashable
from typing import Any

from . import remote
from .discovery import Found
from .plan_cache import Kept

KEY = "gpudirect.planning.cache-reads"


class ReadPlans(Kept):
    """Plans of whole reads, at most ``gpudirect.planning.cache-reads`` of them, and as many
    collections' expressions made of them (:attr:`collections`)."""

    def __init__(self) -> None:
        super().__init__(KEY)
        self.collections = Kept(KEY)

    def plan(
        self, found: Found, planner: Callable[..., Any], args: tuple, make: Callable[[], Any]
    ) -> Any:
        """``make()``, or what it gave before for the same files, as found, and options."""
        return self.get(lambda: _key(found, planner, args), make)

    def collection(
        self,
        found: Found,
        planner: Callable[..., Any],
        args: tuple,
        cut: Hashable,
        build: Callable[[], Any],
    ) -> Any:
        """``build()`` (a collection's expression: a collection can be changed in place, an
        expression cannot), or what it gave before for the same read cut the same way."""

        def key() -> Hashable | None:
            read = _key(found, planner, args)
            return None if read is None else (read, cut)

        return self.collections.get(key, build)


def _key(found: Found, planner: Callable[..., Any], args: tuple) -> Hashable | None:
    """The files as the workers saw them and the planning's identity, or None where a file is
    remote or the options cannot be pickled (the read is then planned every time)."""
    if any(map(remote.is_remote, found.files)):
        return None
    try:
        arguments = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None
    files = tuple(
        (
            p,
            found.sizes.get(p),
            frozenset(found.mtimes.get(p, ())),
            frozenset(found.ctimes.get(p, ())),
        )
        for p in found.files
    )
    readable = frozenset((w, frozenset(paths)) for w, paths in found.readable.items())
    return (files, readable, planner, arguments)


#: This process's cache: the client's plans of whole reads.
reads = ReadPlans()
