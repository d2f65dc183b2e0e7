"""What a client remembers of its workers between reads, so that a read on workers that see the
client's own files asks none of them.

Every read starts with a survey (:func:`.cluster.survey`): each worker says what it is (its
GPUs, reader options and memory) and how it sees the user's paths, a round trip through the
scheduler to every worker: 8.6 ms for 256 files on one H200 shared by two workers, where
``client.run`` of nothing took 3.7 ms and the warm read itself, once built, 90 ms. What a
worker is does not change while its process lives and its reader plugin stays. How it sees the
paths is how the client sees them wherever the two share one boot, mount namespace, root, user
and groups (:func:`.discovery.namespace`) and the worker keeps no allowed roots (a worker that
does answers for itself). So after a survey that found only such workers, a read asks the
scheduler alone whether the same worker processes (Distributed's server ids) hold the same
reader plugin, and lists the paths itself; any change (a worker joins, leaves or restarts, the
plugin is registered anew) surveys the workers again.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from distributed import Client

from . import access, discovery


@dataclasses.dataclass(frozen=True)
class Known:
    """The workers of a survey that all see the client's files: each one's server id, and what
    it said of itself (all but its views); ``readers``: the scheduler's reader plugin then."""

    servers: dict[str, str]
    readers: str | None
    described: dict[str, dict[str, Any]]

    def still(self, held: dict[str, Any]) -> bool:
        """Whether the scheduler (``held``: :func:`.cluster._registered`) has these workers'
        processes and this reader plugin still."""
        return held["servers"] == self.servers and held["readers"] == self.readers

    def survey(self, entries: list[str], listing: discovery.Listing) -> dict[str, dict]:
        """The survey these workers would answer, from this process's own views of ``entries``
        (without roots: the workers have none, whatever the client's config or environment
        says)."""
        with access.unlimited():
            views = discovery.views(entries, listing)
        return {worker: {**info, "views": views} for worker, info in self.described.items()}


_known: weakref.WeakKeyDictionary[Client, Known] = weakref.WeakKeyDictionary()


def recall(client: Client) -> Known | None:
    """What ``client`` remembers of its workers, if anything."""
    return _known.get(client)


def remember(client: Client, workers: dict[str, dict], held: dict[str, Any]) -> None:
    """Keep what ``workers`` said in a survey (with ``held``, the scheduler's answer beside it)
    where every one of them sees the client's files, and the scheduler knew the same workers;
    else forget what ``client`` knew."""
    here = discovery.namespace()
    shared = here is not None and all(info["namespace"] == here for info in workers.values())
    if shared and set(held["servers"]) == set(workers):
        described = {
            w: {k: v for k, v in info.items() if k != "views"} for w, info in workers.items()
        }
        _known[client] = Known(held["servers"], held["readers"], described)
    else:
        _known.pop(client, None)
