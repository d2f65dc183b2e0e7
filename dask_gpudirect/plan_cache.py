"""Plans of single files, kept by the worker that made them.

An ETL job run again, or a training loop reading the same shards every epoch, plans the same
unchanged files each time: a footer read and parsed per Parquet file, about 1 ms a file, so a
quarter of a second for 256 files before any data moves. A worker keeps each file's plan under
the file's identity (device, inode, size, modification and change times in ns) and the planning
arguments, and plans again only where one of them changed. Nothing is trusted blindly: every
read still checks the allowed roots on the file it opens and the shard's stamp against it
(:mod:`.stamps`), and errors are never kept. :class:`Kept`, the store itself, also keeps the
client's plans of whole reads (:mod:`.read_plans`).
"""

from __future__ import annotations

import collections
import os
import pickle
import threading
from collections.abc import Callable, Hashable
from typing import Any

import dask.config

from .errors import ConfigError

KEY = "gpudirect.planning.cache-files"


class Kept:
    """Values made once and given again by key: at most ``dask.config[setting]`` of them, the
    least recently used dropped first, none where it is 0; thread-safe (a worker plans in
    threads, a client may be shared by threads)."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self._values: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # values given again, for tests and logs

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def _entries(self) -> int:
        """How many values may be kept: the setting, a whole number of at least 0."""
        value = dask.config.get(self.setting)
        try:
            entries = int(value) if isinstance(value, int | str) else -1  # "16" from a yaml
        except ValueError:
            entries = -1
        if entries < 0 or isinstance(value, bool):
            raise ConfigError(f"{self.setting}={value!r}: use a whole number of at least 0")
        return entries

    def get(self, key_of: Callable[[], Hashable | None], make: Callable[[], Any]) -> Any:
        """What ``make()`` gave before under the key ``key_of()`` gives, or ``make()`` now
        (kept, unless the key is None). Where nothing may be kept, the key (a stat, a pickle)
        is not worked out at all. An error of ``make`` is raised, not kept."""
        entries = self._entries()
        key = key_of() if entries > 0 else None
        if key is None:
            return make()
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                self.hits += 1
                return self._values[key]
        value = make()
        with self._lock:
            self._values[key] = value
            while len(self._values) > entries:
                self._values.popitem(last=False)
        return value


class PlanCache(Kept):
    """Plans of single files, at most ``gpudirect.planning.cache-files`` of them."""

    def __init__(self) -> None:
        super().__init__(KEY)
        self._last: tuple[tuple, bytes | None] | None = None  # the last planning's arguments

    def plan(self, path: str, planner: Callable[..., Any], args: tuple) -> Any:
        """``planner([path], *args)``, or the plan it gave before for this very file."""
        return self.get(
            lambda: _key(path, planner, self._arguments(args)), lambda: planner([path], *args)
        )

    def _arguments(self, args: tuple) -> bytes | None:
        """``args`` as bytes (None where they cannot be pickled: nothing is then kept), the
        part of its key every file of a read shares: pickled once for all of them, as a
        hive dataset's arguments hold every file's folder values, so a pickle per file cost
        time that grew with the square of the file count (2.2 s of 5,000 files)."""
        last = self._last
        if last is not None and last[0] is args:
            return last[1]
        try:
            pickled = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            pickled = None
        self._last = (args, pickled)
        return pickled


def _key(path: str, planner: Callable[..., Any], arguments: bytes | None) -> tuple | None:
    """The file's identity and the planning's, or None where either cannot be taken (the
    planner then says what is wrong with the file)."""
    if arguments is None:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return (path, identity, planner, arguments)


#: This process's cache: a worker's plans, shared by its reads.
plans = PlanCache()
