"""``dg.shuffle`` and ``dg.shuffle_array``: the public calls, from collection to collection."""

from __future__ import annotations

import functools
import math
import operator
import secrets
import uuid
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask.dataframe.dask_expr._collection import new_collection
from dask.dataframe.dask_expr.io.io import FromGraph
from dask.highlevelgraph import HighLevelGraph
from dask.typing import Key
from distributed import Client, Future

from .. import targets
from ..connection import connected
from ..errors import InputError, flag
from ..placement import placed_read
from . import engines, settings
from .coordinator import exchange
from .split import MAX_RECORDS, HashSplit, PermutationSplit


def shuffle(
    df: dd.DataFrame,
    on: Hashable | Sequence[Hashable],
    npartitions: int | None = None,
    client: Client | None = None,
    progress: bool | None = None,
    engine: str | None = None,
    ignore_index: bool = False,
    then: Callable[[Any], Any] | None = None,
    keep_order: bool = True,
    meta: Any = None,
) -> dd.DataFrame:
    """Hash-shuffle ``df``: output partition ``j`` holds every row whose ``on`` hashes to ``j``.

    The all-to-all runs now, worker to worker (cuDF pieces stay on the GPU and travel over UCX
    with ``protocol="ucxx"``), and the result is a Dask DataFrame of the computed partitions,
    ready for joins and group-bys. An unpersisted ``dg.read_parquet`` or ``dg.read_binary``
    frame is shuffled as it is read: each worker takes its partitions as it finishes them.
    Each row goes to the partition Dask's own ``df.shuffle(on, npartitions)`` puts it in (its
    ``partitioning_index`` of the keys, numbers hashed as float64), so every key lands in
    exactly one partition, and frames whose keys differ in numeric type (int32 here, int64
    there) line up partition by partition. The result is marked so, as Dask marks its own
    shuffle's: Dask's merges, group-bys and ``drop_duplicates`` on the ``on`` columns shuffle
    it no more.

    Parameters
    ----------
    df
        A Dask DataFrame of pandas or cuDF partitions.
    on
        Column name(s) to hash, or the index's name among them: as in Dask's shuffle, the index
        is hashed in its place among the columns, and it stays the index.
    npartitions
        Output partitions (default: as many as ``df`` has).
    client
        The Dask client (default: the current one).
    progress
        Show a progress bar on stderr (a live bar in terminals and notebooks, plain lines
        elsewhere): the input partitions computed, then the pieces received. Default: the
        ``gpudirect.shuffle.progress`` config (off).
    engine
        Who moves the pieces: ``"distributed"`` (this package's exchange over Distributed's
        comms, both targets), ``"rapidsmpf"`` (NVIDIA's RapidsMPF shuffler; cuDF partitions on
        GPU workers only, its rows in arrival order within a partition) or ``"auto"``
        (``rapidsmpf`` where it was measured the faster: ``keep_order=False``, at most 32
        partitions, no categorical columns, RapidsMPF installed, each worker's share within
        its GPU room, where it need not spill; else ``distributed``). RapidsMPF spills to host
        memory past ``gpudirect.shuffle.device-limit``, the package's exchange on to disk too;
        default: the ``gpudirect.shuffle.engine`` config.
    ignore_index
        Drop the index, as Dask's ``shuffle(..., ignore_index=True)`` does: every output
        partition is labelled 0, 1, 2..., and no index labels are moved (a fifth fewer bytes
        for four int64 columns). For group-bys and joins on columns.
    then
        A function of one partition, applied to each output partition on the worker that
        builds it, as it is built: ``dg.shuffle(df, on, then=f)`` is
        ``dg.shuffle(df, on).map_partitions(f)`` without a second graph to schedule, and only
        ``f``'s results are kept (a group-by after the shuffle keeps its sums, not the rows).
        What it returns is inferred as ``map_partitions`` infers it, from a made-up partition,
        unless ``meta`` says.
    keep_order
        Keep each output partition's rows in input order, so that the same shuffle of the same
        partitions gives the same partitions (the default). ``False`` lets GPU workers cut
        their rows with one libcudf kernel, in no set order within a partition (it differs from
        run to run): for group-bys, joins and anything else that does not look at the rows'
        order. The host target keeps the order either way; the ``rapidsmpf`` engine
        never does (its rows come in arrival order).
    meta
        What ``then`` returns, as ``map_partitions``' ``meta=`` takes it (an empty frame or
        series, a dict of column types, a ``(name, dtype)`` pair): for a ``then`` that cannot
        run on a made-up partition.

    Raises
    ------
    ShuffleError
        When a worker leaves or a transfer fails mid-shuffle, ``then`` raises on a partition,
        or the shuffle cannot fit in the workers' memory and disk; no partial result is
        returned.
    """
    if not isinstance(df, dd.DataFrame):
        raise InputError(None, f"dg.shuffle needs a Dask DataFrame, not {type(df).__name__}")
    client = connected(client)
    on = _keys(df, on)
    flag("ignore_index", ignore_index)
    flag("keep_order", keep_order)
    flag("progress", progress, none=True)
    if ignore_index and df.index.name in on and df.index.name not in df.columns:
        raise InputError(
            None,
            f"cannot shuffle on the index {df.index.name!r} with ignore_index=True, which drops "
            "its labels: leave ignore_index False, or make it a column (df.reset_index())",
        )
    if npartitions is None:
        npartitions = df.npartitions
    npartitions = _integer(npartitions, "npartitions", 1, "a positive integer")
    given_meta = meta  # what then= returns; ``meta`` is now the shuffled rows'
    meta = df._meta.reset_index(drop=True) if ignore_index else df._meta
    if given_meta is not None and then is None:
        raise InputError(None, "meta= describes what then= returns: pass then= too")
    out_meta = meta if then is None else _meta_of(then, meta, given_meta)
    if then is not None:  # as map_partitions enforces its meta: names checked and set
        then = _Enforced(then, out_meta)
    target = targets.holding(meta)
    partitions = max(df.npartitions, npartitions)
    candidates = engines.choose(engine, target, meta, not ignore_index, partitions, keep_order)
    splitter = HashSplit(on, npartitions, target, meta, not ignore_index, keep_order)
    # what then= makes may hold other keys, or none; the index is no column to merge on
    keyed = then is None and all(c in df.columns for c in on)
    computed = exchanged(
        client, df, splitter, out_meta, candidates, progress, then, on if keyed else None
    )
    return new_collection(computed)


def exchanged(
    client: Client,
    df: dd.DataFrame,
    splitter: HashSplit,
    meta: Any,
    engines: tuple[str, ...],
    progress: bool | None = None,
    then: Callable[[Any], Any] | None = None,
    partitioned_by: list | None = None,
) -> Computed:
    """``df``'s partitions cut by ``splitter`` and moved now: the expression of the computed
    outputs (each like ``meta``), marked as partitioned by those columns where given."""
    settings.check()  # a bad gpudirect.shuffle.* value: said here, before any input is made
    inputs, placed = _partitions(client, df)
    token = uuid.uuid4().hex  # each call is a new result
    name = f"gpudirect-shuffle-{token}"
    keys: list[Key] = [(name, j) for j in range(splitter.npartitions)]
    outputs = exchange(
        client, inputs, splitter, keys, splitter.target, progress, engines, placed, then
    )
    # named by the call's own token: tokenizing a thousand futures for a name that is unique
    # anyway costs about 0.1 s
    return Computed(
        layer=dict(zip(keys, outputs, strict=True)),
        _meta=meta,
        divisions=(None,) * (splitter.npartitions + 1),
        keys=keys,
        name_prefix=name,
        partitioned_by=partitioned_by,
        _determ_token=token,
    )


def _keys(df: dd.DataFrame, on: Any) -> list:
    """``on`` as a list of names, each a column of ``df`` or its index's name (as Dask's
    shuffle takes them)."""
    if isinstance(on, pd.Index | np.ndarray):  # names, as Python values
        on = on.tolist()
    on = list(on) if isinstance(on, list | tuple) else [on]
    if not on:
        raise InputError(None, "cannot shuffle on []: name at least one column")
    for key in on:
        if dask.is_dask_collection(key) or not isinstance(key, Hashable):
            raise InputError(
                None,
                f"cannot shuffle on a {type(key).__name__}: on= takes column names or the "
                "index's name; add the values as a column first (df.assign(key=...))",
            )
    names = [*df.columns, *([df.index.name] if df.index.name is not None else [])]
    missing = [c for c in on if c not in names]
    if missing:
        index = f" or the index {df.index.name!r}" if df.index.name is not None else ""
        raise InputError(
            None, f"cannot shuffle on {on}: columns {missing} are not in {list(df.columns)}{index}"
        )
    return on


def _meta_of(then: Callable[[Any], Any], meta: Any, given: Any = None) -> Any:
    """The empty partition like those ``then`` makes: ``given`` (``meta=``) made one, else
    inferred as Dask's ``map_partitions`` infers it, from ``then`` of a made-up partition like
    ``meta``."""
    from dask.dataframe.utils import make_meta, meta_nonempty
    from dask.utils import funcname, is_dataframe_like, is_series_like

    if not callable(then):
        raise InputError(None, f"then must be a function of one partition, not {then!r}")
    name = funcname(then)
    if given is not None:
        made = make_meta(given, parent_meta=meta)
        if not (is_dataframe_like(made) or is_series_like(made)):
            raise InputError(None, f"meta={given!r} must describe a frame or a series")
        return made
    try:
        made = then(meta_nonempty(meta))
    except Exception as exc:
        raise InputError(
            None, f"then={name} failed on a made-up partition: {type(exc).__name__}: {exc}"
        ) from exc
    if not (is_dataframe_like(made) or is_series_like(made)):
        raise InputError(
            None, f"then={name} must return a frame or a series, not {type(made).__name__}"
        )
    return make_meta(made)


class _Enforced:
    """``then`` whose results are made like ``meta`` as ``map_partitions`` makes them (Dask's
    ``apply_and_enforce``): a frame's columns checked against the meta's and named as they
    are there, a series named as it is, an empty result the meta itself."""

    def __init__(self, then: Callable[[Any], Any], meta: Any):
        from dask.utils import funcname

        self.then, self.meta = then, meta
        self.__name__ = funcname(then)  # what errors call it

    def __call__(self, part: Any) -> Any:
        from dask.dataframe.core import apply_and_enforce

        return apply_and_enforce(part, _func=self.then, _meta=self.meta)


class Computed(FromGraph):
    """Partitions in memory under their own keys. ``FromGraph`` (what ``persist`` makes)
    renames them, one alias task per partition, which every later compute runs: at a thousand
    partitions that is a thousand tasks more (about a second on a CPU scheduler).

    ``partitioned_by``: the columns whose rows sit where Dask's own shuffle on them puts them
    (``dg.shuffle``'s ``on``), as Dask's shuffle marks its result: Dask's merges, group-bys
    and ``drop_duplicates`` on them then run partition by partition, shuffling nothing (or
    only the other side of a merge, into these partitions)."""

    _parameters = [*FromGraph._parameters, "partitioned_by"]
    _defaults = {"partitioned_by": None}

    @functools.cached_property
    def _name(self) -> str:
        return self.operand("name_prefix")

    def _layer(self) -> dict:
        return dict(self.operand("layer"))

    @functools.cached_property
    def unique_partition_mapping_columns_from_shuffle(self) -> set:
        on = self.operand("partitioned_by")
        return {tuple(on)} if on else set()


def shuffle_array(
    arr: da.Array,
    seed: int | None = None,
    client: Client | None = None,
    progress: bool | None = None,
) -> da.Array:
    """A uniformly random permutation of ``arr``'s records (axis 0) across all workers.

    Always on the ``distributed`` engine: RapidsMPF shuffles cuDF tables, not arrays.

    The per-epoch global shuffle of a training input pipeline: every record can land in any
    chunk, the chunk sizes along axis 0 stay as they were (a record is one piece: the other
    axes are one chunk each in the result), each chunk keeps the array's dtype, and the same
    ``seed`` gives the same order on the same chunking. CuPy chunks stay on the GPU. Runs now;
    returns a Dask Array of computed chunks.

    Two arrays (features and labels) stay paired when shuffled with the same ``seed`` only where
    their chunks along axis 0 are the same: ``read_binary`` cuts chunks by bytes, so give one
    the other's (``y.rechunk((x.chunks[0],))``), or shuffle one structured array of both.

    Parameters
    ----------
    arr
        A Dask Array of NumPy or CuPy chunks with known chunk sizes along axis 0 (not masked
        arrays: refused).
    seed
        A non-negative integer; None draws a fresh one.
    client
        The Dask client (default: the current one).
    progress
        Show a progress bar on stderr, as ``dg.shuffle`` does (default: the
        ``gpudirect.shuffle.progress`` config).
    """
    if not isinstance(arr, da.Array):
        raise InputError(None, f"dg.shuffle_array needs a Dask Array, not {type(arr).__name__}")
    client = connected(client)
    if arr.ndim == 0:
        raise InputError(None, "cannot shuffle a 0-d array: records are along axis 0")
    if isinstance(arr._meta, np.ma.MaskedArray):  # its pieces would travel without the mask
        raise InputError(
            None, "cannot shuffle a masked array: fill it (arr.filled()) or shuffle its mask apart"
        )
    if any(math.isnan(c) for c in arr.chunks[0]):
        raise InputError(
            None, "chunk sizes along axis 0 are unknown: call arr.compute_chunk_sizes() first"
        )
    flag("progress", progress, none=True)
    if seed is None:
        seed = secrets.randbits(63)
    seed = _integer(seed, "seed", 0, "a non-negative integer or None")
    arr = arr.rechunk({axis: -1 for axis in range(1, arr.ndim)})
    sizes = list(arr.chunks[0])
    record = arr.shape[1:]
    meta = np.empty_like(arr._meta, shape=(0, *record))
    target = targets.holding(arr._meta)
    if sum(sizes) >= MAX_RECORDS:
        raise InputError(
            None,
            f"cannot shuffle {sum(sizes):,} records: NumPy's hypergeometric draws, which say "
            f"how many go from each chunk to each, take fewer than {MAX_RECORDS:,}; shuffle "
            "groups of records as one (reshape to (n // k, k, ...)) or fewer records at a time",
        )
    splitter = PermutationSplit(seed, np.asarray(sizes, dtype=np.int64), target, meta)
    settings.check()
    inputs = _chunks(client, arr)
    name = f"gpudirect-shuffle-array-{uuid.uuid4().hex}"
    keys: list[Key] = [(name, j, *(0,) * len(record)) for j in range(len(sizes))]
    outputs = exchange(client, inputs, splitter, keys, target, progress)
    graph = HighLevelGraph.from_collections(name, dict(zip(keys, outputs, strict=True)))
    return da.Array(graph, name, (tuple(sizes), *((n,) for n in record)), meta=meta)


def _partitions(
    client: Client, df: dd.DataFrame
) -> tuple[list[Future], list[tuple[str, int]] | None]:
    """``df``'s partitions as futures, in order: a persisted frame's own futures (no task to
    run per partition, which at a thousand partitions costs seconds), else computed now. And
    where each partition is a read placed on a worker (``dg.read_parquet``, ``dg.read_binary``),
    that worker and the bytes it reads: the shuffle then starts while the reads run."""
    frame = df.optimize()
    expr = frame.expr
    if isinstance(expr, FromGraph):
        futures = _held(expr)
        if all(isinstance(f, Future) and f.client is client for f in futures):
            return futures, None
    graph = frame.__dask_graph__()
    found = [placed_read(graph[key]) for key in frame.__dask_keys__()]
    placed = [p for p in found if p is not None]
    # the frame persisted as one collection, not a Delayed a partition computed: each Delayed
    # became an expression of its own (16,384 partitions: 7.7 s against 1.0 on the 2-core CPU)
    futures = _held(client.persist(frame).expr)
    return futures, (placed if len(placed) == len(found) else None)


def _held(expr: FromGraph) -> list:
    """What a persisted collection's expression holds for each of its keys, in order."""
    layer = expr.operand("layer")
    return [layer.get(key) for key in expr.operand("keys")]


def _chunks(client: Client, arr: da.Array) -> list[Future]:
    """``arr``'s chunks along axis 0 (one along each other axis) as futures, in order: a
    persisted array's own (no task to run per chunk: at a thousand chunks computing them costs
    the client about 0.2 s), else computed now."""
    keys = list(dask.core.flatten(arr.__dask_keys__()))
    layers = arr.dask.layers
    if len(layers) == 1:
        (layer,) = layers.values()
        futures = [layer.get(key) for key in keys]
        own = [
            isinstance(f, Future) and f.client is client and f.key == key
            for f, key in zip(futures, keys, strict=True)
        ]
        if all(own):
            return futures
    return client.compute(list(arr.to_delayed().ravel()))


def _integer(value: Any, name: str, minimum: int, what: str) -> int:
    """``value`` as an int of at least ``minimum``, or an InputError that names the option."""
    try:
        number = minimum - 1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = minimum - 1
    if number < minimum:
        raise InputError(None, f"bad {name} {value!r}: use {what}")
    return number
