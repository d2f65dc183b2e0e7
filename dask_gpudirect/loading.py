"""The task bodies that load shards on a worker: a binary chunk, a Parquet partition.

Each reads through the worker's :class:`~dask_gpudirect.plugin.GPUDirectPlugin` (its targets,
roots and ledger) and raises an :class:`~dask_gpudirect.errors.InputError` that names the file,
saying also where a shard was read when that was not the worker placement chose.
"""

from __future__ import annotations

from typing import Any

from dask.dataframe.dispatch import concat

from .errors import InputError
from .formats import binary, parquet
from .plugin import current_plugin
from .shards import Shard, decoding
from .targets import module


def load_chunk(shards: tuple[Shard, ...]) -> Any:
    """Task body of one chunk of a binary read: its shards' records end to end (small files
    joined: ``binary.joins``), read into one buffer on this worker's target, as one array."""
    plugin = current_plugin()
    with plugin.reading(shards[0].target) as target:
        try:  # the read checks the worker's own roots and the stamps: the planning is not trusted
            buffer = target.read_run(shards)
        except InputError as exc:
            shard = next((s for s in shards if s.path == exc.path), shards[0])
            raise elsewhere(shard, plugin.address, exc) from None
        with decoding(*shards):
            return binary.joined([shard.part for shard in shards]).decode(target, buffer)


def load_partition(shards: tuple[Shard, ...], columns: list[str]) -> Any:
    """Task body of one partition of one or more shards (small files joined): decoded on the
    worker's target in runs (``parquet.runs``; the device target decodes a run in one libcudf
    call), each run finished, then put end to end with a fresh index as one shard's frame has
    (or the files' own index, where the reader restores one). ``columns``: the frame's columns,
    or a selection Dask's optimizer pushed into the read, whose column chunks alone are read.
    Required, so that ``from_map`` passes it always: an optional one it leaves out for an empty
    selection (``df[[]]``), and every column would come back."""
    shards = tuple(parquet.projected(shard, columns, reading=True) for shard in shards)
    plugin = current_plugin()
    grouped = parquet.runs(shards)
    with plugin.reading(shards[0].target) as target:
        try:
            decoded = target.read_parquet(grouped)
        except InputError as exc:
            shard = next((s for s in shards if s.path == exc.path), shards[0])
            raise elsewhere(shard, plugin.address, exc) from None
    helpers = module(target.name)
    frames = []
    # footer-only runs (files filters rule out whole, checked by the read) give no rows: only
    # where no run has any is one of them made the partition's empty frame
    found = [(run, frame) for run, frame in zip(grouped, decoded, strict=True) if frame is not None]
    for run, frame in found or [(grouped[0], None)]:
        try:
            frames.append(parquet.finish([s.part for s in run], helpers, frame))
        except InputError as exc:  # a filter the decoded values refuse: this run's files
            raise exc if exc.path else InputError(run[0].path, exc.problem) from None
    if len(frames) == 1:
        return frames[0]
    return concat(frames, ignore_index=not shards[0].part.indexed)


def unreadable_together(path: str, problem: str) -> None:
    """Task body that :class:`~dask_gpudirect.placement.PlacementPlugin` gives a task whose
    files no one worker can read (reads of several datasets that Dask fused into one task):
    the InputError that says so, before anything is read."""
    raise InputError(path, problem)


def elsewhere(shard: Shard, here: str, exc: InputError) -> InputError:
    """``exc``, saying that the shard was read on another worker than placement chose, and the
    two ways that happens: the chosen one left, or the caller's restrictions on the read (a
    ``workers=`` or ``resources=`` of ``persist``, ``compute`` or ``dask.annotate``) sent it
    away. A worker cannot tell which: it was said to have left where it had not."""
    if shard.worker in (None, here):
        return exc
    return InputError(
        shard.path,
        f"{exc.problem} (read on {here}, not on {shard.worker} where placement put it: that "
        "worker left the cluster, or the restrictions the read was computed with "
        "(workers=, resources=) sent it away; read_* again places it on the workers there "
        "now, and restrictions must allow a worker that can read the file)",
    )
