"""The ``rapidsmpf`` engine: the exchange by NVIDIA's RapidsMPF shuffler, on GPU workers.

RapidsMPF (``rapidsmpf-cu13``) is a C++ multi-GPU shuffler: packed cuDF pieces travel over its
own UCXX communicator, moved by its own progress thread. The shuffle's workers get one
communicator for as long as they stay the same set, started the way cudf-polars' ``DaskEngine``
starts it (the root rank's UCXX address first, then every rank at once, meeting at a barrier).

Each worker's stage cuts its inputs with the same splitter as the ``distributed`` engine (Dask's
hash, so a key lands in the same output partition whichever engine ran), packs each chunk's
outputs (``split_and_pack``) and hands them to a ``Shuffler``; then it unpacks the partitions
RapidsMPF assigned to its rank and keeps them, to be published as the other engine's are.
Everything around the exchange stays the package's own: placement, the memory check, the
scheduler plugin that fails a shuffle whose worker left, the client's abort, the timeout.

What differs: rows within an output partition come in the order their pieces arrived, not in
input order; which worker builds which output is RapidsMPF's choice (contiguous runs by rank);
past ``gpudirect.shuffle.device-limit`` RapidsMPF spills pieces to host memory, not on to disk
(its spills are ledger records, from its statistics); and a failed or timed-out stage drops its
communicator, so the next shuffle starts a new one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.typing import Key
from distributed import Client, Worker

from .. import targets
from ..errors import ShuffleError

#: Where a worker keeps its communicator: ``setattr(worker, RANKS, Ranks(...))``.
RANKS = "_gpudirect_rapidsmpf_ranks"
#: The root's communicator between the two bootstrap steps.
ROOT = "_gpudirect_rapidsmpf_root"
#: Seconds between looks at an aborted run or the timeout while RapidsMPF finishes.
POLL_S = 0.05


@dataclasses.dataclass
class Ranks:
    """One worker's rank in the communicator of ``members`` (sorted worker addresses)."""

    members: tuple[str, ...]
    comm: Any  # rapidsmpf.communicator.Communicator
    buffers: Any  # rapidsmpf.memory.buffer_resource.BufferResource over the worker's RMM pool


# --- on the client ------------------------------------------------------------------------------


def op_id_limit() -> int:
    """How many RapidsMPF shuffles one communicator runs at once."""
    from rapidsmpf.shuffler import Shuffler

    return int(Shuffler.max_concurrent_shuffles)


def ensure_ranks(client: Client, participants: tuple[str, ...], known: dict[str, Any]) -> None:
    """Start a communicator over ``participants`` unless every one already has it, as
    ``known`` says (each one's :func:`members`, from the room it told the plan): two calls to
    start (the root, then every rank at once: they meet at a barrier), none where they have."""
    if all(tuple(known.get(w) or ()) == participants for w in participants):
        return
    root = participants[0]
    address = client.run(_start_root, len(participants), workers=[root])[root]
    client.run(_join, address, participants, workers=list(participants))


# --- on the workers: the communicator -----------------------------------------------------------


def members(dask_worker: Worker) -> tuple[str, ...] | None:
    """The workers of this worker's communicator; None where it has none."""
    ranks = getattr(dask_worker, RANKS, None)
    return None if ranks is None else ranks.members


def _new_communicator(nranks: int, root_address: Any) -> Any:
    from rapidsmpf.communicator.ucxx import new_communicator
    from rapidsmpf.config import Options, get_environment_variables
    from rapidsmpf.progress_thread import ProgressThread
    from rapidsmpf.statistics import Statistics

    options = Options(get_environment_variables())
    thread = ProgressThread(Statistics(enable=False))
    return new_communicator(nranks, None, root_address, options, thread)


def _start_root(nranks: int, dask_worker: Worker) -> bytes:
    """Rank 0's communicator, kept on the worker until :func:`_join`; its UCXX address."""
    from rapidsmpf.communicator.ucxx import get_root_ucxx_address

    comm = _new_communicator(nranks, None)
    setattr(dask_worker, ROOT, comm)
    return get_root_ucxx_address(comm)


def _join(root_address: bytes, members: tuple[str, ...], dask_worker: Worker) -> int:
    """Every rank (the root included) completes the communicator and waits for the others; the
    worker keeps it, with a buffer resource over its current RMM memory resource."""
    import rmm.mr
    import ucxx._lib.libucxx as ucx_api
    from rapidsmpf.communicator.ucxx import barrier
    from rapidsmpf.memory.buffer_resource import BufferResource
    from rapidsmpf.statistics import Statistics

    comm = getattr(dask_worker, ROOT, None)
    if comm is None:
        address = ucx_api.UCXAddress.create_from_buffer(root_address)
        comm = _new_communicator(len(members), address)
    else:
        delattr(dask_worker, ROOT)
    barrier(comm)
    # The resource tracks RapidsMPF's own allocations only (it is not made the worker's): its
    # device limit, set by each stage, bounds the pieces RapidsMPF keeps on the GPU.
    buffers = BufferResource(
        rmm.mr.get_current_device_resource(), statistics=Statistics(enable=True)
    )
    setattr(dask_worker, RANKS, Ranks(members, comm, buffers))
    return comm.rank


# --- on the workers: the stage ------------------------------------------------------------------


# The worker's types (ShuffleService, Exchange, ShuffleRun, Phases) are Any here: .worker
# imports this module, and the package's imports form no cycle (tests/test_layering.py).
def exchange_on_rapidsmpf(
    service: Any, exchange: Any, inputs: dict[int, tuple[Key, int]], run: Any, clock: Any
) -> int:
    """This worker's part of the shuffle through RapidsMPF; the number of outputs built.

    ``service`` is the worker's ShuffleService and ``run`` its run of this shuffle, which an
    abort (the client's, or the scheduler's when a worker leaves) fails.
    """
    from cudf_streaming.partition_utils import (
        split_and_pack,
        split_and_pack_cost,
        unpack_and_concat,
    )
    from rapidsmpf.memory.buffer import MemoryType
    from rapidsmpf.memory.spill import unspill_partitions
    from rapidsmpf.shuffler import PartitionAssignment, Shuffler
    from rmm.pylibrmm.stream import DEFAULT_STREAM

    device = targets.module("device")
    worker = service.worker
    ranks: Ranks | None = getattr(worker, RANKS, None)
    if ranks is None or ranks.members != exchange.participants:
        raise ShuffleError(
            f"worker {worker.address} has no RapidsMPF communicator for shuffle {exchange.id}'s "
            "workers (one restarted since it began?)"
        )
    npartitions = len(exchange.keys)
    ranks.buffers.set_memory_limit(MemoryType.DEVICE, service.limits("device")["device"])
    spilled = _spilled_bytes(ranks.buffers)
    shuffler = Shuffler(
        ranks.comm, exchange.op_id, npartitions, ranks.buffers, PartitionAssignment.CONTIGUOUS
    )
    ok = False
    try:
        mine = np.zeros(npartitions, dtype=bool)
        mine[list(shuffler.local_partitions())] = True
        for _, ordered, _, offsets in service.split_chunks(exchange, inputs, run, clock):
            with clock("pack and insert"):
                rows = np.diff(offsets)
                table = device.to_table(ordered, exchange.splitter.index)
                splits = offsets[1:-1].tolist()
                room = ranks.buffers.reserve_device_memory_and_spill(  # spills to make room
                    split_and_pack_cost(table, DEFAULT_STREAM, ranks.buffers),
                    allow_overbooking=True,
                )
                shuffler.insert_chunks(
                    split_and_pack(table, splits, DEFAULT_STREAM, ranks.buffers, room)
                )
                _record(service, exchange, sizeof(ordered), rows, mine)
            table = ordered = None
            run.raise_if_failed()
        shuffler.insert_finished()
        with clock("wait for peers"):
            _wait(shuffler, run, exchange.id)
        _record_spills(service, exchange, _spilled_bytes(ranks.buffers) - spilled)
        built = 0
        local = list(shuffler.local_partitions())
        for first in range(0, len(local), exchange.group):  # as the distributed engine groups
            group = local[first : first + exchange.group]
            with clock("combine"):
                tables = [
                    unpack_and_concat(
                        unspill_partitions(
                            shuffler.extract(pid), br=ranks.buffers, allow_overbooking=True
                        ),
                        DEFAULT_STREAM,
                        ranks.buffers,
                    )
                    for pid in group
                ]
                parts = device.frames_of(tables, exchange.splitter.meta, exchange.splitter.index)
            built += service.hand_over(exchange, dict(zip(group, parts, strict=True)), clock)
            tables = parts = []
        ok = True
        return built
    finally:
        if ok:
            shuffler.shutdown()
        else:  # a peer may be gone: RapidsMPF cannot end this op, so the next shuffle starts anew
            delattr(worker, RANKS)


def _wait(shuffler: Any, run: Any, shuffle_id: str) -> None:
    """``shuffler.wait()`` (it blocks in C++ and has no timeout) in a thread of its own, while
    this one looks every POLL_S at the run's abort and at ``gpudirect.shuffle.timeout``."""
    waiter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rapidsmpf-wait")
    done = waiter.submit(shuffler.wait)
    deadline = time.monotonic() + run.timeout
    try:
        while True:
            try:
                return done.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                pass
            run.raise_if_failed()
            if time.monotonic() > deadline:
                raise ShuffleError(
                    f"shuffle {shuffle_id}: RapidsMPF's exchange did not finish in "
                    f"{run.timeout:g} s (gpudirect.shuffle.timeout): a peer stopped or is "
                    "overloaded"
                )
    finally:
        waiter.shutdown(wait=False)


def _spilled_bytes(buffers: Any) -> int:
    """Bytes RapidsMPF has copied off the GPU through ``buffers`` (its spills), by its
    statistics (``copy-device-to-host-bytes``, and ``-pinned_host-`` where it has a pool)."""
    return int(
        sum(
            stat["value"]
            for name, stat in buffers.statistics.to_dict().items()
            if name.startswith("copy-device-to-") and name.endswith("-bytes")
        )
    )


def _record_spills(service: Any, exchange: Any, spilled: int) -> None:
    """The ledger's record of the bytes RapidsMPF spilled to host memory during the stage (a
    concurrent shuffle's spills on the same workers count here too)."""
    if spilled > 0:
        service.ledger.add(
            op="spill", path="device-to-host", nbytes=spilled, seconds=0.0, shard=exchange.id
        )


def _record(service: Any, exchange: Any, nbytes: int, rows: np.ndarray, mine: np.ndarray) -> None:
    """The ledger's record of one chunk: the bytes whose outputs are this worker's stay
    (``local``), the rest go to RapidsMPF (``rapidsmpf-ucx``); split by their share of rows."""
    total = int(rows.sum())
    if total == 0:
        return
    local = nbytes * int(rows[mine].sum()) // total
    me = service.worker.address
    for path, share in (("local", local), ("rapidsmpf-ucx", nbytes - local)):
        if share:
            service.ledger.add(
                op="shuffle", path=path, nbytes=share, seconds=0.0, shard=exchange.id, peer=me
            )
