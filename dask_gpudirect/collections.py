"""``read_parquet`` and ``read_binary``: find and plan on the workers, place, build the collection.

Workers, not the client, list the paths and read footers and headers: each sees its own disks, so
a dataset spread over the local NVMe of several nodes is planned where it lies, and the client
needs to see none of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import pickle
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import dask.dataframe as dd
import pyarrow as pa
from dask.base import tokenize
from dask.dataframe.dask_expr._collection import new_collection
from dask.dataframe.dask_expr._expr import ArrowStringConversion
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task
from dask.typing import Key
from distributed import Client, Worker

from . import compat, discovery, plan_cache, read_plans, remote, remote_listing, targets
from .cluster import answered, run_each, survey
from .config import size_in_bytes
from .connection import connected
from .errors import ClusterError, InputError, flag
from .formats import binary, hive, parquet
from .loading import load_chunk, load_partition
from .phases import Phases
from .placement import assign, fold_rowless, join_small, planners
from .read_expr import CountedRead
from .shards import P, Partition, combine, shared

if TYPE_CHECKING:
    from collections.abc import Callable


#: ``blocksize="auto"``: the device target's is this share of the smallest worker's GPU memory,
#: dask_cudf's default (1/32, which dask_cudf counts in uncompressed bytes, this package in the
#: bytes stored: partitions of data that compresses well hold more rows than its). Larger
#: partitions than 1/128's made the ETL faster on every query (one H100 shared by two workers,
#: 256 files: 2^10 keys 0.58 -> 0.32 s, 2^24 keys 0.42 -> 0.34 s, nearly unique 0.50 -> 0.43 s)
#: and the read too (21.2 against 12.6-14.3 GB/s): each libcudf call costs about 12 ms beyond
#: its bytes.
AUTO_SHARE = 32
#: ``blocksize="auto"`` on the host target: Dask's own ``read_parquet`` default.
AUTO_HOST = 256 * 2**20
#: ``blocksize="auto"`` joins small files into no fewer partitions than this per worker, so
#: every worker reads (and a shuffle after it starts from every worker). A GPU reads a
#: partition's files in one libcudf call: one partition a worker read and shuffled 2 GiB of 256
#: files faster than two (one H200 shared by two workers, medians in one session: 0.135
#: against 0.186 s for the scan, 0.25 and 0.30 against 0.33 and 0.36 s end to end). The host
#: target keeps two, whose pyarrow reads were not measured against one.
AUTO_PER_WORKER = {"device": 1, "host": 2}

#: The phases of the last ``read_parquet`` this process planned (survey, footers, meta,
#: partitions), in seconds: where a benchmark's planning time went.
last_phases: dict[str, float] = {}


def _blocksize(value: Any, key: str, target: str, workers: dict[str, dict]) -> int:
    """Bytes per shard and partition: given, or the config's; ``"auto"`` is a share of the
    smallest worker's memory for the target (:data:`AUTO_SHARE`, dask_cudf's share, about 4.7
    GB on an H200; 256 MiB on the host target, Dask's default; both counted in the bytes
    stored, where Dask and dask_cudf count uncompressed ones)."""
    named = "blocksize" if value is not None else key  # a bad config value names its key
    value = dask.config.get(key) if value is None else value
    if value == "auto":
        if target == "host":
            return AUTO_HOST
        return min(info["memory"][target] for info in workers.values()) // AUTO_SHARE
    nbytes = size_in_bytes(value)
    if nbytes is None:
        raise InputError(None, f"bad {named} {value!r}: use bytes or a size like '256MiB'")
    if nbytes <= 0:
        raise InputError(None, f"bad {named} {value!r}: must be positive")
    return nbytes


def _resolve_target(target: str | None, workers: dict[str, dict]) -> str:
    """The call's choice, else the workers' reader plugins' (their ``target=`` keyword or
    ``gpudirect.target``), else the client's ``gpudirect.target``, else ``device`` when every
    worker has a GPU and ``host`` otherwise; a choice is checked against the workers."""
    named = sorted({t for info in workers.values() if (t := info["options"]["target"])})
    if target is None and len(named) > 1:
        raise InputError(
            None, f"the workers' GPUDirectPlugin targets differ ({named}): pass target= to choose"
        )
    target = target or (named[0] if named else dask.config.get("gpudirect.target"))
    without_gpu = sorted(w for w, info in workers.items() if not info["gpus"])
    if target is None:
        return "host" if without_gpu else "device"
    if target not in targets.MODULES:
        raise InputError(None, f"unknown target {target!r}; use 'device', 'host' or None")
    if target == "device" and without_gpu:
        raise InputError(None, f"target='device' but these workers have no GPU: {without_gpu}")
    return target


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What a read learns before planning: the files, who can read them, the target."""

    client: Client
    found: discovery.Found
    target: str
    workers: dict[str, dict]  # what each worker told the survey
    store: remote.Store  # how to reach remote objects (storage_options)

    def blocksize(self, value: Any, key: str) -> int:
        return _blocksize(value, key, self.target, self.workers)

    def spread(self, value: Any, key: str) -> int:
        """What the partition count comes in multiples of: with an ``"auto"`` blocksize the
        workers, so that each reads as many bytes (and waits for no other in a shuffle after);
        with bytes given, 1."""
        return len(self.workers) if _is_auto(value, key) else 1


def _is_auto(value: Any, key: str) -> bool:
    """Whether the blocksize asked for, or else the config's at ``key``, is ``"auto"``."""
    return (dask.config.get(key) if value is None else value) == "auto"


def _prepare(
    client: Client | None,
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    target: str | None,
    listing: discovery.Listing = discovery.FLAT,
    storage_options: dict[str, Any] | None = None,
) -> _Setting:
    """The client, the files and who can read them, and the chosen target. Local paths are
    listed by every worker, remote URLs once, here (:mod:`.remote_listing`)."""
    client = connected(client)
    entries = discovery.absolute(paths)
    store = remote.Store.from_options(storage_options)
    workers = survey(client, [e for e in entries if not remote.is_remote(e)], listing)
    target = _resolve_target(target, workers)
    local = {w: info["views"] for w, info in workers.items()}
    seen = remote_listing.views(entries, local, listing, store)
    found = discovery.merge(entries, seen, listing)
    return _Setting(client, found, target, workers, store)


def _plan_each(files: list[str], planner: Callable[..., P], args: tuple) -> list[P | InputError]:
    """Each file planned on its own (or as it was before, if unchanged: :mod:`.plan_cache`),
    a bad file's InputError kept in its place. Remote files are planned side by side
    (``gpudirect.remote.connections`` at once): each footer or header costs two or three
    requests, whose latency, not their bytes, is the cost."""

    def one(path: str) -> P | InputError:
        try:
            return plan_cache.plans.plan(path, planner, args)
        except InputError as exc:
            return exc

    if not any(map(remote.is_remote, files)):
        return [one(path) for path in files]
    with ThreadPoolExecutor(remote.Settings.current().connections) as pool:
        return list(pool.map(one, files))


async def _plan_here(
    dask_worker: Worker, groups: dict[str, list[str]], planner: Callable[..., P], args: tuple
) -> bytes:
    """This worker's share of the planning, its footer and header reads off the event loop,
    pickled in one piece: what the files' plans share (a hive key's categories, every file's
    value) is then sent once, where Distributed's pickle of each plan apart sent it once a
    file (bytes that grew with the square of the files: 6 MB for 1,000 of 2,000)."""
    plans = await asyncio.to_thread(_plan_each, groups[dask_worker.address], planner, args)
    answer = io.BytesIO()
    _OneSchema(answer).dump(plans)
    return answer.getvalue()


class _OneSchema(pickle.Pickler):
    """A pickler that writes each distinct Arrow schema once: every file's plan holds its own
    copies of the schema the files share (two a Parquet file's), which pickle wrote and the
    client rebuilt field by field once a file: four fifths of the bytes of an answer for 2,500
    small files (4.4 of 5.4 MB), and most of the time to pickle and unpickle it. An equal one
    (as its IPC bytes, metadata included) is written as a reference to the first."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._schemas: dict[bytes, pa.Schema] = {}

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, pa.Schema):
            return NotImplemented
        first = self._schemas.setdefault(obj.serialize().to_pybytes(), obj)
        return NotImplemented if first is obj else (_same, (first,))


def _same(value: Any) -> Any:
    """What unpickles a schema written once as the one it refers to."""
    return value


def _plan(client: Client, found: discovery.Found, planner: Callable[..., P], *args: Any) -> P:
    """``planner`` run on each file by a worker that can read it, merged into one plan; the
    plan of an earlier read where the survey found the same files (:mod:`.read_plans`)."""
    return read_plans.reads.plan(
        found, planner, args, lambda: _plan_on_workers(client, found, planner, args)
    )


#: What a read does while each worker plans its files (:func:`.cluster.silent`).
PLANNED = "the read asked it to plan its files (their footers or headers)"


def _plan_on_workers(
    client: Client, found: discovery.Found, planner: Callable[..., P], args: tuple
) -> P:
    readable = dict(found.readable)
    left = list(dict.fromkeys(found.files))  # each file once
    by_file: dict[str, P | InputError] = {}
    while left:  # until every file is planned: a worker that leaves meanwhile, by the others
        groups = planners(left, readable)
        planned, gone = answered(  # a stopped worker: a ClusterError that names it
            run_each(
                client, _plan_here, list(groups), PLANNED, groups=groups, planner=planner, args=args
            )
        )
        for worker, answer in planned.items():
            by_file.update(zip(groups[worker], pickle.loads(answer), strict=True))
        left = [path for worker in gone for path in groups[worker]]
        for worker in gone:
            del readable[worker]
        orphan = next((p for p in left if not any(p in fs for fs in readable.values())), None)
        if orphan is not None:
            could = [w for w, files in found.readable.items() if orphan in files]
            raise ClusterError(
                f"{orphan}: every worker that could read it ({', '.join(could)}) left the "
                "cluster while the read was planned"
            )
    plan = combine([by_file[path] for path in found.files])
    # a copy of a file on another node was modified at another time: its reads accept that too
    shards = [
        s
        if s.stamp is None or found.mtimes.get(s.path, set()) <= s.stamp.mtimes
        else dataclasses.replace(s, stamp=s.stamp.seen_as(found.mtimes[s.path]))
        for s in plan.shards
    ]
    return dataclasses.replace(plan, shards=shared(shards))


def read_parquet(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    columns: str | list[str] | None = None,
    filters: list | None = None,
    blocksize: int | str | None = None,
    target: str | None = None,
    client: Client | None = None,
    *,
    index: str | list[str] | bool | None = None,
    calculate_divisions: bool = False,
    parquet_file_extension: str | tuple[str, ...] | None = compat.PARQUET_EXTENSIONS,
    split_row_groups: bool | int | str = "infer",
    dtype_backend: str | None = None,
    filesystem: Any = None,
    storage_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dd.DataFrame | dd.Series:
    """Parquet files as a Dask DataFrame of cuDF (device) or pandas (host) partitions.

    Parameters
    ----------
    paths
        A file, a directory, a glob, or a list of them (``~`` expanded, ``file://`` URLs
        taken as paths), or ``s3://`` objects, prefixes and globs and ``http(s)://`` files
        (either target; see the Remote data page); other URLs are refused. All files must have
        the same columns, in any order; a column stored in other types by other files (int32
        and int64, int64 and double...) reads as the type pyarrow's permissive unify gives
        them. A directory's subfolders are read too, and hive folders
        (``year=2024/month=1/``) give their keys as columns after the files' own, as Dask gives
        them: from every such folder in a file's path, however the file was named (a glob, a
        list, one file), typed as categories of every value found, int32 where all are integers.
    columns
        Columns to load (default: all); one name gives a Series, as in Dask.
    filters
        pyarrow DNF filters, e.g. ``[("x", ">", 3)]``: row groups whose statistics rule them
        out are never read, and the remaining rows are filtered exactly; ``("x", "is", None)``
        and ``"is not"`` test for nulls, and ``!=`` and ``not in`` keep them, as in Dask. An
        integer column compares with a float value as pandas compares them.
        Terms on hive keys are decided per folder at planning. A file ruled out whole makes
        no partition of its own (Dask drops it): it joins the next partition with rows (or
        the one before), whose task checks that the file is still the one planned (its
        footer, size and modification time).
    blocksize
        Target bytes per partition: a large file is cut into runs of row groups of about this
        many projected bytes, and consecutive small files and runs are joined to about it (as
        Dask and dask_cudf join them), in file order. Default ``gpudirect.parquet.blocksize``
        (``"auto"``: 1/32 of the smallest worker's GPU memory on the device target, 256 MiB
        on the host target, and small files joined into no fewer partitions than one per
        worker on the device target, two on the host target, in a count the workers divide
        evenly).
    target
        ``"device"``, ``"host"``, or None: the workers' plugins' ``target``, else the
        client's ``gpudirect.target``, else device when every worker has a GPU.
    client
        The Dask client (default: the current one).
    index
        As in Dask: ``None`` restores the index pandas stored in the files (one column; not
        where ``columns`` names it), ``False`` gives a fresh RangeIndex per partition (stored
        index columns become columns), a column name indexes by that column.
    calculate_divisions
        As in Dask: the divisions of the index from the files' statistics (each partition's
        smallest index value, then the last one's largest), known where every partition's
        values start at or after the largest of the one before; unknown otherwise, or where a
        statistic is missing. Lets Dask select by index and join on it without a shuffle.
    parquet_file_extension
        The files a directory read takes, as in Dask: those ending in one of these (``None``:
        every file). Files starting with ``.`` or ``_`` are skipped either way.
    split_row_groups
        As in Dask: ``"infer"`` and ``"adaptive"`` cut partitions by ``blocksize``; ``True``
        makes one partition per row group, a number that many row groups per partition, and
        ``False`` one per file (small files are then not joined).
    dtype_backend
        As in Dask, for pandas partitions (the host target): ``"numpy_nullable"`` gives
        pandas' nullable types (``Int64``, ``boolean``, ``string``...), ``"pyarrow"``
        pyarrow-backed columns; None the types ``dd.read_parquet`` gives by default (with
        Dask's ``dataframe.convert-string`` on, as it is unless set off: strings as
        ``string[pyarrow]``, dates and decimals pyarrow-backed).
    filesystem
        ``None``, ``"arrow"``, ``"fsspec"`` (Dask's default) or a local file system
        (pyarrow's or fsspec's).
    storage_options
        For ``s3://`` URLs, as Dask takes them: ``key``, ``secret``, ``token``, ``anon``,
        ``endpoint_url`` (or ``client_kwargs={"endpoint_url": ...}``), ``region``,
        ``profile``; unset ones come from the environment, as AWS tools take them.

    Other arguments of ``dd.read_parquet`` are refused by name, with the reason, unless given
    Dask's default (``engine=None``, ``categories=None``...: code that spells them out runs).
    """
    compat.check_kwargs(kwargs)
    compat.check_filesystem(filesystem)
    if blocksize == "default":  # Dask's spelling of its default
        blocksize = None
    flag("calculate_divisions", calculate_divisions)
    if columns is not None and not isinstance(columns, str):
        if not isinstance(columns, Iterable):
            raise InputError(None, f"columns must be a name or a list of names, not {columns!r}")
        columns = list(columns)
    per_shard = compat.row_groups_per_partition(split_row_groups)
    listing = discovery.Listing(compat.extensions_of(parquet_file_extension), recursive=True)
    clock = Phases()
    with clock("survey"):  # the plugins, the workers and what each sees
        setting = _prepare(client, paths, target, listing, storage_options)
    client, found, target = setting.client, setting.found, setting.target
    auto = _is_auto(blocksize, "gpudirect.parquet.blocksize")
    spread = setting.spread(blocksize, "gpudirect.parquet.blocksize")
    blocksize = setting.blocksize(blocksize, "gpudirect.parquet.blocksize")
    conversion = compat.conversion(dtype_backend, target)
    folders = hive.partitioning(found.files)
    store = setting.store
    args = (columns, filters, blocksize, target, index, folders, per_shard, conversion, store)
    with clock("footers"):  # each file's plan, on the workers
        planned = _plan(client, found, parquet.plan, *args)
    with clock("meta"):
        plan = planned.unified()
        meta = plan.meta(targets.module(target))
    # "auto" never makes so few partitions that a worker has none to read, and makes a count
    # the workers divide evenly (each then reads as many bytes)
    at_least = AUTO_PER_WORKER[target] * spread if auto else 1

    def build() -> Any:
        if per_shard is None:
            joined = join_small(plan.shards, blocksize, found.readable, at_least, spread=spread)
        else:  # the row groups asked for, each run its own partition
            joined = [(shard,) for shard in plan.shards]
        folded = fold_rowless(joined, found.readable, lambda shard: shard.part.empty is not None)
        partitions = [Partition(p) for p in assign(folded, found.readable)]
        read = dd.from_map(
            load_partition,
            partitions,
            meta=meta,
            divisions=parquet.divisions(partitions, plan) if calculate_divisions else None,
            label="gpudirect-read-parquet",
            enforce_metadata=False,
        ).expr
        if isinstance(read, ArrowStringConversion):
            # Partitions keep the types they are decoded to (the setting was read into
            # ``conversion`` above): Dask's "convert-string" would cast every object column,
            # lists and bytes too, to strings. (Not by setting it off around from_map: Dask's
            # config is the process's, and two reads in two threads could leave it off.)
            read = read.frame
        return CountedRead.of(read, [parquet.rows(p) for p in partitions])

    with clock("partitions"):
        cut = (at_least, spread, calculate_divisions)
        expr = read_plans.reads.collection(found, parquet.plan, args, cut, build)
        frame = new_collection(expr)
    last_phases.clear()
    last_phases.update(clock.seconds)
    return frame[columns] if isinstance(columns, str) else frame


def read_binary(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    dtype: Any = None,
    shape: tuple[int, ...] | int | None = None,
    target: str | None = None,
    client: Client | None = None,
    blocksize: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    join_files: bool = True,
) -> da.Array:
    """Binary files as a Dask Array of CuPy (device) or NumPy (host) chunks, records on axis 0.

    Parameters
    ----------
    paths
        A file, a directory, a glob, or a list of them; ``s3://`` and ``http(s)://`` URLs as
        in :func:`read_parquet`.
    dtype, shape
        For raw files: the record dtype and per-record shape (default ``()``). ``.npy`` files
        need neither: their header says (C or Fortran order, any fixed-size dtype). A file
        named otherwise is a ``.npy`` by its content only where ``dtype`` is not given.
    target
        ``"device"``, ``"host"``, or None: the workers' plugins' ``target``, else the
        client's ``gpudirect.target``, else device when every worker has a GPU.
    client
        The Dask client (default: the current one).
    blocksize
        Target bytes per chunk; default (or ``"default"``) ``gpudirect.binary.blocksize``.
        Large files are cut
        into chunks of whole records; small C-order local files are joined, in order, into
        chunks of about this size (at least one per worker where there are files enough; with
        ``"auto"``, a count the workers divide evenly), each read with all of its files in
        flight at once.
    storage_options
        For ``s3://`` URLs, as in :func:`read_parquet`.
    join_files
        False: no chunk holds records of two files (files smaller than ``blocksize`` are a
        chunk each), for work that must not cross a file's end within a chunk.
    """
    # a bad dtype= or shape= is named here, before any worker is asked
    shape = binary.checked_shape(shape)
    if dtype is not None:
        binary.fixed_dtype(dtype, None)
    flag("join_files", join_files)
    if blocksize == "default":  # as read_parquet takes it
        blocksize = None
    setting = _prepare(client, paths, target, storage_options=storage_options)
    client, found, target = setting.client, setting.found, setting.target
    spread = setting.spread(blocksize, "gpudirect.binary.blocksize")
    blocksize = setting.blocksize(blocksize, "gpudirect.binary.blocksize")
    plan = _plan(client, found, binary.plan, dtype, shape, blocksize, target, setting.store)
    module = targets.module(target)
    problem = module.unsupported(plan.dtype)
    if problem:
        raise InputError(plan.first, f"cannot load to target={target!r}: {problem}")
    # small files joined, at least one chunk a worker where there are files enough, and with
    # "auto" a count the workers divide evenly
    joins = binary.joins if join_files else lambda shard: False
    joined = join_small(
        plan.shards, blocksize, found.readable, len(setting.workers), joins, spread=spread
    )
    chunks = assign(joined, found.readable)
    name = "gpudirect-read-binary-" + tokenize(chunks)
    trailing = (0,) * len(plan.record_shape)
    graph: dict[Key, Task] = {
        (name, i, *trailing): Task((name, i, *trailing), load_chunk, chunk)
        for i, chunk in enumerate(chunks)
    }
    meta = module.empty_array(plan.dtype, 1 + len(plan.record_shape))
    records = tuple(sum(s.part.shape[0] for s in chunk) for chunk in chunks)
    sizes: tuple[tuple[int, ...], ...] = (records, *((n,) for n in plan.record_shape))
    return da.Array(HighLevelGraph.from_collections(name, graph), name, sizes, meta=meta)
