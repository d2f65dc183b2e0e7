"""The worker side of a shuffle: send pieces to their owners, receive, wait for every peer.

A :class:`ShuffleService` lives in each worker's :class:`~.plugin.ShuffleWorkerPlugin`, which
installs its comm handlers; peers call them directly (Distributed's comms: UCXX hands device
buffers to UCX, TCP stages them through host memory). One :class:`ShuffleRun` per shuffle
holds the received pieces in a :class:`~.buffer.SpillBuffer` and knows which peers have
finished sending.

The stage task (:meth:`ShuffleService.stage`) runs in a worker thread: it splits the worker's
inputs a chunk at a time (on the GPU for cuDF/CuPy; ``gpudirect.shuffle.chunk-size`` bytes of
consecutive inputs), sends each destination one message per chunk, and builds its outputs a
group at a time from what arrived, so its work grows with the bytes and the partition count, not
with their product. Sends go to the event loop, the stage blocking while the bytes in flight are
at ``gpudirect.shuffle.max-in-flight``. Every handler and the run's state live on the loop,
but for the received pieces: those are kept (and spilled) in a thread of their own.

Memory stays bounded, as in Distributed's P2P shuffle: an input is let go once it is split (so
the worker may spill it), received pieces spill past ``gpudirect.shuffle.host-limit``, and the
outputs are built ``Exchange.group`` at a time (senders cut their pieces by the receiver's
groups) and handed to the worker's own memory as they are made, which spills them like any
result. Chunks and in-flight bytes are capped by the target's memory as well as by the config.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from dask.sizeof import sizeof
from dask.typing import Key
from dask.utils import funcname
from distributed import Future, Worker, get_client, secede
from distributed.comm.addressing import get_address_host
from distributed.protocol import to_serialize
from distributed.shuffle._limiter import ResourceLimiter
from distributed.utils import sync
from distributed.worker_state_machine import FreeKeysEvent, UpdateDataEvent

from .. import targets
from ..errors import ShuffleError
from ..ledger import STAGED_ACROSS_NODES, Ledger
from ..phases import Phases
from ..targets import TargetName
from . import settings
from .buffer import SpillBuffer
from .rapidsmpf_engine import members as rapidsmpf_members
from .split import Cells, Splitter, assembly_segments, cells_for, output_rows, union_categories

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Ended shuffles a worker remembers, so that a late piece of one is refused, not kept.
MAX_CLOSED = 1000
#: The scheduler's stream op by which a finished stage reports the outputs its worker keeps:
#: ``shuffle_id``, ``keys`` and their ``nbytes``.
BUILT = "gpudirect-shuffle-built"
#: On the device target, a chunk (and a group of outputs) is at most this share of the GPU's
#: memory: a split holds about three copies of it, and the worker its inputs and outputs besides.
CHUNK_SHARE = 16
#: On the host target, of the worker's memory limit: there a stage holds about six chunks at
#: once outside the worker's managed memory (the inputs taken, the split copy, the sends in
#: flight holding it, a peer's pieces, a group built), on top of a process of about 190 MB. At
#: 1/16, two workers of 600 MB passed the nanny's 95 % and were restarted, where P2P peaked at
#: 420 MB; at 1/64, 385-420 MB.
HOST_CHUNK_SHARE = 64

#: Bytes on the wire from one worker are at most this share of the target's memory.
IN_FLIGHT_SHARE = 8

#: Why a run ends whose stage task the scheduler released while it ran: its client left (before
#: the scheduler heard of the shuffle, which would otherwise end it), or cancelled it.
STAGE_CANCELLED = "its stage task was cancelled (its client left the cluster, or cancelled it)"

#: What a message carries per group of the receiver's outputs: ``(group, first, cells, rows)``.
Piece = tuple[int, int, Cells, Any]


@dataclasses.dataclass(frozen=True)
class Exchange:
    """What every worker of one shuffle must agree on; sent with each stage task."""

    id: str
    participants: tuple[str, ...]
    owners: tuple[str, ...]  # owners[j]: the worker that builds output j; contiguous runs of j
    splitter: Splitter
    target: TargetName  # where the pieces live
    keys: tuple  # output ``j`` is kept under ``keys[j]``
    group: int  # outputs a worker builds at once; each piece sent is cut at their edges
    engine: str = "distributed"  # who moves the pieces (see .engines)
    then: Callable[[Any], Any] | None = None  # applied to each output as it is built
    op_id: int = 0  # the rapidsmpf engine's Shuffler op id, unique among shuffles in flight
    # placed inputs (by index) not computed when the shuffle was planned: each stage waits
    # for its own (one in memory then is taken from wherever it is, as the stage reads it)
    computing: frozenset[int] = frozenset()

    def outputs_of(self, worker: str) -> range:
        """The output partitions ``worker`` builds: one contiguous run."""
        mine = [j for j, owner in enumerate(self.owners) if owner == worker]
        return range(mine[0], mine[-1] + 1) if mine else range(0)

    def groups_of(self, worker: str) -> list[range]:
        """``worker``'s outputs in runs of ``group``: what it builds, and receives, at once."""
        mine = self.outputs_of(worker)
        return [range(j, min(j + self.group, mine.stop)) for j in mine[:: self.group]]


def transfer_path(target: TargetName, source: str, dest: str) -> tuple[str, int]:
    """The ledger path of a piece sent from ``source`` to ``dest``, and the copies it costs."""
    if dest.startswith("inproc"):  # LocalCluster(processes=False): no socket, no copy
        return "in-process", 0
    ucx = dest.startswith("ucx")
    if target == "host":
        return ("ucx-host" if ucx else "tcp-host"), 1
    if ucx:
        return "ucx-device", 1
    same_node = get_address_host(source) == get_address_host(dest)
    return "tcp-host-staged", 2 if same_node else STAGED_ACROSS_NODES


class ShuffleRun:
    """One shuffle on one worker: its received pieces, its sends and its peers' progress."""

    def __init__(
        self, service: ShuffleService, shuffle_id: str, buffer: SpillBuffer, in_flight: int
    ):
        self.service = service
        self.id = shuffle_id
        self.buffer = buffer
        # group -> first input of a received chunk -> (its inputs, first output j of the piece,
        # its cells, outputs counted from first)
        self.received: dict[int, dict[int, tuple[tuple[int, ...], int, Cells]]] = (
            collections.defaultdict(dict)
        )
        self.finished: set[str] = set()
        # input -> its categories by column: our inputs' as split, our peers' as they finish
        self.categories: dict[int, dict[Any, Any]] = {}
        self.peer_categories: dict[int, dict[Any, Any]] = {}
        self.changed = asyncio.Event()  # a peer finished, or the run failed
        self.heard = time.monotonic()  # when a peer's pieces last arrived
        self.failed = asyncio.Event()
        self.error: ShuffleError | None = None
        self.sends: set[asyncio.Task] = set()
        self.staged = False  # a stage task runs this run (and closes it when it ends)
        self.limiter = ResourceLimiter(in_flight)
        # How long any one wait on a peer may take: a send, the last word, its pieces (room on
        # the wire follows: every send in flight ends within it).
        self.timeout = settings.timeout()

    async def put(self, inputs: tuple[int, ...], pieces: list[Piece]) -> None:
        """Keep the rows of a chunk of ``inputs``: each piece ``(group, first, cells, rows)``
        holds, for outputs ``first, first + 1, ...`` of one of our groups, the rows its
        :data:`~.split.Cells` count (output ``first + j`` of cell ``(j, k, rows)``, of
        ``inputs[k]``), grouped by output.
        Kept in the service's store thread, not on the loop (spilling copies and writes their
        bytes); the caller (a sender waiting for our answer) hears back once they are kept, so
        a peer that says it has finished has nothing left on its way."""
        self.raise_if_failed()
        self.heard = time.monotonic()
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.service.store_thread, self._keep, inputs, pieces
            )
        except ShuffleError as exc:  # a limit reached here: this run fails, and says so
            self.fail(exc)
            raise

    def _keep(self, inputs: tuple[int, ...], pieces: list[Piece]) -> None:
        self.buffer.update({f"{group}-{inputs[0]}": rows for group, _, _, rows in pieces})
        for group, first, cells, _ in pieces:
            self.received[group][inputs[0]] = (tuple(inputs), first, np.asarray(cells))

    def outputs(
        self, exchange: Exchange, groups: list[range], clock: Phases, empty: Any = None
    ) -> Iterator[dict[int, Any]]:
        """Build our outputs one of ``groups`` at a time, from the pieces that arrived for it:
        the splitter's outputs, each output's rows in input order (so the same shuffle gives
        the same partitions). Its cost follows the bytes, not the partitions; only one group's
        pieces and outputs are in hand at once."""
        splitter = exchange.splitter
        categories = union_categories({**self.peer_categories, **self.categories})
        for group, outputs in enumerate(groups):
            received = self.received.pop(group, {})
            if not received:
                # no rows: like this worker's own split rows (its first chunk's), else the meta
                nothing = splitter.with_categories(
                    splitter.meta if empty is None else empty, categories
                )
                yield dict.fromkeys(outputs, nothing)
                continue
            firsts = sorted(received)
            with clock("take pieces"):  # back from host or disk where spilled
                pieces = [self.buffer.pop(f"{group}-{i}") for i in firsts]
                self.buffer.spill_if_full()  # the later groups' pieces, not beside this one's
            with clock("order"):
                pieces_of = [received[i] for i in firsts]
                segments, sizes = assembly_segments(pieces_of, outputs)
                bounds = np.concatenate([[0], np.cumsum(sizes)])
            with clock("combine"):
                built = splitter.outputs(pieces, segments, bounds, outputs, categories)
            yield dict(zip(outputs, built, strict=True))
            pieces, built = [], []  # let this group's rows go before the next one's

    def fail(self, error: ShuffleError) -> None:
        """Record the first error, stop our sends, and wake whatever the stage waits on."""
        if self.error is None:
            self.error = error
        self.failed.set()
        self.changed.set()
        for task in self.sends:
            task.cancel()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    async def unless_failed(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, or raise the run's error as soon as it fails (an abort from the
        client, a failed send), so no stage keeps waiting on a peer that is gone."""
        task = asyncio.ensure_future(awaitable)
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
        self.raise_if_failed()
        return task.result()

    async def send(self, exchange: Exchange, dest: str, message: tuple) -> None:
        """Start sending ``(inputs, pieces)`` to ``dest`` (see :meth:`put`); wait first while too
        many bytes are in flight."""
        self.raise_if_failed()
        nbytes = _nbytes(message)
        await self.unless_failed(self.limiter.wait_for_available())
        self.limiter.increase(nbytes)
        task = asyncio.create_task(self._send(exchange, dest, message, nbytes))
        self.sends.add(task)
        task.add_done_callback(self.sends.discard)

    async def _send(self, exchange: Exchange, dest: str, message: tuple, nbytes: int) -> None:
        worker = self.service.worker
        inputs, pieces = message
        start = time.perf_counter()
        groups, firsts, cells, rows = zip(*pieces, strict=True)
        call = asyncio.ensure_future(
            worker.rpc(dest).gpudirect_shuffle_receive(
                shuffle_id=self.id,
                target=exchange.target,
                inputs=inputs,
                groups=groups,
                firsts=firsts,
                cells=to_serialize(list(cells)),
                rows=to_serialize(list(rows)),
            )
        )
        try:
            done, _ = await asyncio.wait({call}, timeout=self.timeout)
            if not done:  # a stopped peer is not gone: its socket still takes bytes
                self.fail(self._no_answer([dest]))
                return
            call.result()
        except Exception as exc:  # any comm failure fails the whole shuffle
            # A ShuffleError is the peer refusing a run that already failed there: the peer's
            # own stage reports the cause, this is only its echo.
            self.fail(
                ShuffleError(
                    f"shuffle {self.id}: sending to worker {dest} failed: {exc}",
                    secondary=isinstance(exc, ShuffleError),
                )
            )
            return
        finally:
            if not call.done():  # given up on, or this send cancelled (the run aborted): the
                # comm error the cancel may cause is not the cause, and is not left unread
                call.add_done_callback(lambda c: c.cancelled() or c.exception())
                call.cancel()
            await self.limiter.decrease(nbytes)
        path, copies = transfer_path(exchange.target, worker.address, dest)
        self.service.ledger.add(
            op="shuffle",
            path=path,
            nbytes=nbytes,
            seconds=time.perf_counter() - start,
            shard=self.id,
            peer=dest,
            copies=copies,
        )

    def _no_answer(self, peers: list[str]) -> ShuffleError:
        return ShuffleError(
            f"shuffle {self.id}: worker(s) {peers} did not answer in {self.timeout:g} s "
            "(gpudirect.shuffle.timeout): stopped or overloaded"
        )

    async def finish(self, exchange: Exchange) -> None:
        """Wait for our sends, tell every peer we are done (and our inputs' categories), and
        wait until every peer is."""
        while self.sends:
            await self.unless_failed(asyncio.wait(set(self.sends)))
        self.raise_if_failed()
        me = self.service.worker.address
        ours = to_serialize(dict(self.categories)) if self.categories else None
        tells = {
            p: asyncio.ensure_future(
                self.service.worker.rpc(p).gpudirect_shuffle_finished(
                    shuffle_id=self.id, target=exchange.target, source=me, categories=ours
                )
            )
            for p in exchange.participants
            if p != me
        }
        if tells:
            _, pending = await self.unless_failed(
                asyncio.wait(tells.values(), timeout=self.timeout)
            )
            for task in pending:
                task.cancel()
            if pending:
                raise self._no_answer([p for p, task in tells.items() if task in pending])
            for peer, task in tells.items():
                error = task.exception()
                if isinstance(error, ShuffleError):
                    raise error
                if error is not None:
                    raise ShuffleError(
                        f"shuffle {self.id}: peer {peer} could not be told: {error}"
                    ) from error
        self.finished.add(me)
        done = time.monotonic()
        while not self.finished.issuperset(exchange.participants):
            self.raise_if_failed()
            self.changed.clear()
            # bounded from the last piece that came: a peer still sending is busy, not stopped
            left = max(done, self.heard) + self.timeout - time.monotonic()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=max(left, 0))
            except TimeoutError:
                if max(done, self.heard) + self.timeout > time.monotonic():
                    continue
                missing = sorted(set(exchange.participants) - self.finished)
                raise ShuffleError(
                    f"shuffle {self.id}: waited {self.timeout:g} s (gpudirect.shuffle.timeout) "
                    f"for pieces from {missing}: stopped, paused (memory past "
                    "distributed.worker.memory.pause: Dask starts no stage there) or overloaded"
                ) from None
        self.raise_if_failed()


class ShuffleService:
    """Every shuffle run on one worker, and the comm handlers peers call."""

    def __init__(self, worker: Worker, ledger: Ledger):
        self.worker = worker
        self.ledger = ledger
        self.runs: dict[str, ShuffleRun] = {}
        # shuffle id -> key -> bytes of the outputs its stage built and keeps here, until the
        # client publishes them (or the shuffle fails and they are let go)
        self.built: dict[str, dict[Key, int]] = {}
        # shuffle id -> why it ended, to refuse late pieces; the oldest are forgotten
        self.closed: collections.OrderedDict[str, str] = collections.OrderedDict()
        # the seconds of each phase of the last stage that ran here (split, send, wait, combine)
        self.last_phases: dict[str, float] = {}
        # inputs that stages wait to be computed here (how many stages wait for each), and
        # an event set when one of them changes state (then replaced by a fresh one)
        self.awaited: collections.Counter[Key] = collections.Counter()
        # the key of each stage task running here -> its shuffle
        self.stages: dict[Key, str] = {}
        self.input_changed = asyncio.Event()
        # where received pieces are kept (and spilled), one message after another
        self.store_thread = ThreadPoolExecutor(1, thread_name_prefix="gpudirect-shuffle-store")

    def handlers(self) -> dict[str, Any]:
        """The comm handlers peers call."""
        return {
            "gpudirect_shuffle_receive": self.receive,
            "gpudirect_shuffle_finished": self.peer_finished,
            "gpudirect_shuffle_room": self.room,
        }

    # --- handlers (event loop) ---------------------------------------------------------------
    async def receive(
        self,
        shuffle_id: str,
        target: TargetName,
        inputs: tuple[int, ...],
        groups: list[int],
        firsts: list[int],
        cells: list[Cells],
        rows: list,
    ) -> None:
        pieces = list(zip(groups, firsts, cells, rows, strict=True))
        await self.run(shuffle_id, target).put(inputs, pieces)

    def peer_finished(
        self,
        shuffle_id: str,
        target: TargetName,
        source: str,
        categories: dict[int, dict[Any, Any]] | None = None,
    ) -> None:
        run = self.run(shuffle_id, target)
        run.peer_categories.update(categories or {})
        run.finished.add(source)
        run.changed.set()

    def abort(self, shuffle_id: str, reason: str, secondary: bool = True) -> None:
        """Fail the run (waking its stage task), drop what it built, and refuse any piece that
        still arrives. ``secondary``: the reason is an echo of a failure seen elsewhere (the
        client's abort); a worker lost mid-shuffle is a cause of its own."""
        self._drop_built(shuffle_id)
        self._remember_closed(shuffle_id, reason)
        run = self.runs.get(shuffle_id)
        if run is not None:
            message = reason if not secondary else f"shuffle {shuffle_id} was aborted: {reason}"
            run.fail(ShuffleError(message, secondary=secondary))
            if not run.staged:  # made by a peer's piece; no stage will come to close it
                self.close(shuffle_id, reason)

    def keep(self, shuffle_id: str, outputs: dict[Key, Any]) -> dict[Key, int]:
        """Put outputs this worker built into its memory under their keys, as
        ``client.scatter`` does (no task per output partition), where the worker spills them
        like any result; the scheduler learns of them from :meth:`report_built`. (``update_data``'s
        own stimulus: ``Worker.update_data`` sizes each value again for its reply, and Dask's
        sizeof of a pandas frame costs about 0.15 ms; the task states hold the sizes.)"""
        self.raise_if_ended(shuffle_id)  # aborted while its outputs were built: keep none
        stimulus_id = f"gpudirect-shuffle-{shuffle_id}-keep-{time.time()}"
        self.worker.handle_stimulus(UpdateDataEvent(data=outputs, stimulus_id=stimulus_id))
        tasks = self.worker.state.tasks
        sizes = {
            key: nbytes
            for key in outputs
            if tasks[key].state == "memory" and (nbytes := tasks[key].nbytes) is not None
        }
        lost = [key for key in outputs if key not in sizes]
        if lost:  # the worker's memory refused it (a spill that failed, say)
            raise ShuffleError(f"worker {self.worker.address} could not keep output {lost[0]}")
        self.built.setdefault(shuffle_id, {}).update(sizes)
        return sizes

    def report_built(self, shuffle_id: str) -> None:
        """Tell the scheduler which outputs this worker keeps for ``shuffle_id`` and their
        bytes, on the worker's stream, before the stage's own end goes the same way: the
        scheduler knows them by the time the client sees the stage finish, and publishing
        asks no worker (a round trip that took 17-21 ms of the 30-43 ms publish of 1024
        outputs on the 2-core CPU, while the workers were letting go of the inputs)."""
        sizes = self.built.get(shuffle_id, {})
        self.worker.batched_stream.send(
            {
                "op": BUILT,
                "shuffle_id": shuffle_id,
                "keys": list(sizes),
                "nbytes": list(sizes.values()),
            }
        )

    def published(self, shuffle_id: str, kept: bool) -> None:
        """The scheduler kept the outputs reported for ``shuffle_id`` (they are the cluster's
        now) or refused them (a participant left, or outputs were missing: let go of them)."""
        if kept:
            self.built.pop(shuffle_id, None)
        else:
            self._drop_built(shuffle_id)

    def _drop_built(self, shuffle_id: str) -> None:
        """Let go of the outputs kept for a shuffle that failed: the scheduler never knew them."""
        keys = list(self.built.pop(shuffle_id, {}))
        if keys:
            stimulus_id = f"gpudirect-shuffle-{shuffle_id}-failed-{time.time()}"
            self.worker.handle_stimulus(FreeKeysEvent(keys=keys, stimulus_id=stimulus_id))

    def teardown(self) -> None:
        """End every run (removing its spill files) and drop unpublished outputs."""
        for shuffle_id in list(self.runs):
            self.abort(shuffle_id, "the plugin was removed")
            self.close(shuffle_id, "the plugin was removed")
        for shuffle_id in list(self.built):
            self._drop_built(shuffle_id)
        self.store_thread.shutdown(wait=False, cancel_futures=True)

    def task_changed(self, key: Key, start: str, finish: str) -> None:
        """A task of this worker changed state (the plugin's hook): wake the stages waiting for
        it where it is one of their inputs; end the run of a stage the scheduler released
        while it runs (Distributed cannot stop the task: it would go on to the end)."""
        running = self.stages.get(key)
        if running is not None and finish == "released" and start in ("executing", "long-running"):
            self.abort(running, STAGE_CANCELLED)
        if key in self.awaited:
            self.input_changed.set()
            self.input_changed = asyncio.Event()

    async def computed_here(self, run: ShuffleRun, keys: list[Key]) -> None:
        """Wait until each of ``keys`` (inputs placed on this worker) is in its memory. An
        input that fails here is waited for too: only the scheduler knows whether it runs
        again (``dask.annotate(retries=...)``), and where it does not, the client, told of its
        error, aborts the shuffle and raises that error (:func:`.coordinator._watch`)."""
        self.awaited.update(keys)
        try:
            while True:
                tasks = [self.worker.state.tasks.get(key) for key in keys]
                if all(ts is not None and ts.state == "memory" for ts in tasks):
                    return
                await run.unless_failed(self.input_changed.wait())
        finally:
            self.awaited.subtract(keys)
            self.awaited += collections.Counter()  # drop the keys no stage waits for

    # --- run lifecycle (event loop) ----------------------------------------------------------
    def run(self, shuffle_id: str, target: TargetName) -> ShuffleRun:
        """The run of ``shuffle_id``, made when its first message or its stage task arrives."""
        self.raise_if_ended(shuffle_id)
        if shuffle_id not in self.runs:
            buffer = self._buffer(shuffle_id, target)
            in_flight = self.batches(target)["in-flight"]
            self.runs[shuffle_id] = ShuffleRun(self, shuffle_id, buffer, in_flight)
        return self.runs[shuffle_id]

    def raise_if_ended(self, shuffle_id: str) -> None:
        """Refuse work for a shuffle that ended here (aborted, or done): a late piece, an
        output built after the abort."""
        if shuffle_id in self.closed:
            raise ShuffleError(
                f"shuffle {shuffle_id} has ended here: {self.closed[shuffle_id]}", secondary=True
            )

    def stage_run(self, shuffle_id: str, target: TargetName, key: Key) -> ShuffleRun:
        """The run of the stage task ``key``, which ends if the task is cancelled (now, or
        later: :meth:`task_changed`)."""
        run = self.run(shuffle_id, target)
        run.staged = True
        self.stages[key] = shuffle_id
        task = self.worker.state.tasks.get(key)
        if task is not None and task.state == "cancelled":  # released before it got here
            self.abort(shuffle_id, STAGE_CANCELLED)
        return run

    def close(self, shuffle_id: str, reason: str) -> None:
        self._remember_closed(shuffle_id, reason)
        run = self.runs.pop(shuffle_id, None)
        if run is not None:
            run.buffer.close()

    def _remember_closed(self, shuffle_id: str, reason: str) -> None:
        self.closed.setdefault(shuffle_id, reason)
        while len(self.closed) > MAX_CLOSED:
            self.closed.popitem(last=False)

    def batches(self, target: TargetName) -> dict[str, int]:
        """Bytes this worker splits, and builds, at once (``chunk``) and has on the wire at
        once (``in-flight``): the config's, capped by a share of the target's memory."""
        module = targets.module(target)
        memory = module.memory_bytes(self.worker)
        share = HOST_CHUNK_SHARE if target == "host" else CHUNK_SHARE
        return {
            "chunk": settings.size("chunk-size", memory // share, module.SHUFFLE_CHUNK),
            "in-flight": settings.size("max-in-flight", memory // IN_FLIGHT_SHARE),
        }

    def room(self, target: TargetName) -> dict[str, Any]:
        """What the client plans a shuffle by (asked through the scheduler): this worker's
        :meth:`limits`, the bytes it builds at once, and the workers of its RapidsMPF
        communicator, if any: a RapidsMPF shuffle on the same workers then asks them nothing
        more (on one H200 its plan took 5-9 ms where the extra round trip made it 11-22)."""
        return {
            "room": self.limits(target),
            "chunk": self.batches(target)["chunk"],
            "rapidsmpf": rapidsmpf_members(self.worker),
        }

    def limits(self, target: TargetName) -> dict[str, int]:
        """Bytes of received pieces this worker keeps on the GPU, in host memory and on disk."""
        os.makedirs(self.worker.local_directory, exist_ok=True)
        disk = settings.disk_limit()
        device = targets.module("device").memory_bytes(self.worker) if target == "device" else 0
        return {
            "device": settings.limit("device-limit", device) if device else 0,
            "host": settings.limit("host-limit", targets.module("host").memory_bytes(self.worker)),
            "disk": disk
            if disk is not None
            else shutil.disk_usage(self.worker.local_directory).free,
        }

    def _buffer(self, shuffle_id: str, target: TargetName) -> SpillBuffer:
        limits = self.limits(target)
        return SpillBuffer(
            directory=os.path.join(self.worker.local_directory, f"gpudirect-shuffle-{shuffle_id}"),
            ledger=self.ledger,
            shuffle=shuffle_id,
            device=target == "device",
            fast_limit=limits["device"],
            host_limit=limits["host"],
            disk_limit=limits["disk"],
            host_full=self._past_spill_threshold,
        )

    def _past_spill_threshold(self) -> bool:
        """Whether this worker's process memory is past Distributed's spill threshold
        (``distributed.worker.memory.spill`` of its limit), where it spills its own data too."""
        memory = self.worker.memory_manager
        if not memory.memory_limit or not memory.memory_spill_fraction:
            return False
        used = self.worker.monitor.get_process_memory()
        return used > memory.memory_spill_fraction * memory.memory_limit

    # --- the stage task (worker thread) -------------------------------------------------------
    def stage(self, exchange: Exchange, inputs: dict[int, tuple[Key, int]], key: Key) -> int:
        """Split and send this worker's inputs (input ``i``: its key and bytes), then build the
        output partitions it owns and keep them (:meth:`report_built`); the number of outputs
        built. The inputs are not the task's dependencies, which the worker would hold in
        memory until the task ends: each chunk's are taken from the worker's memory (or its
        spill) when it is split, and let go after. ``exchange.engine`` says who moves the
        pieces: this module, or RapidsMPF (:mod:`.rapidsmpf_engine`). ``key``: the stage's own
        task, whose cancel ends the run."""
        # Out of the worker's thread count while it waits on peers: two shuffles at once on
        # one-thread workers would otherwise each hold a worker the other needs.
        secede()
        clock = Phases()
        run = self.on_loop(self.stage_run, exchange.id, exchange.target, key)
        try:
            if exchange.engine == "rapidsmpf":
                from .rapidsmpf_engine import exchange_on_rapidsmpf

                built = exchange_on_rapidsmpf(self, exchange, inputs, run, clock)
            else:
                built = self._exchange(exchange, inputs, run, clock)
            self.on_loop(self.report_built, exchange.id)
            return built
        finally:
            self.on_loop(self.close, exchange.id, "finished")
            self.on_loop(self.stages.pop, key, None)  # on the loop, where the hook reads it
            clock.count_collections()
            self.last_phases = dict(clock.seconds)
            logger.info("shuffle %s on %s: %s", exchange.id, self.worker.address, clock)

    def _exchange(
        self,
        exchange: Exchange,
        inputs: dict[int, tuple[Key, int]],
        run: ShuffleRun,
        clock: Phases,
    ) -> int:
        """The ``distributed`` engine: pieces to their owners over Distributed's comms."""
        me = self.worker.address
        groups = {w: exchange.groups_of(w) for w in exchange.participants}
        splitter = exchange.splitter
        # what an output of no rows holds: like this worker's first chunk (its categories, as
        # the task shuffle's empty outputs hold the data's), not holding the chunk
        empty = None
        for indices, ordered, cells, offsets in self.split_chunks(exchange, inputs, run, clock):
            if empty is None:
                empty = splitter.owned(splitter.rows(ordered, 0, 0))
            with clock("send"):  # waits while max-in-flight bytes are on the wire
                for dest, runs in groups.items():
                    pieces = [
                        (g, js.start, cells_for(cells, js), rows)
                        for g, js in enumerate(runs)
                        if (rows := _rows(splitter, ordered, offsets, js)) is not None
                    ]
                    if not pieces:
                        continue
                    if dest != me:
                        self.on_loop(run.send, exchange, dest, (indices, pieces))
                        continue
                    # kept until the outputs are built: a slice of a chunk that holds peers'
                    # rows held them all, while the buffer counted (and spilled) its own size
                    if sum(len(rows) for *_, rows in pieces) < len(ordered):
                        pieces = [(*p[:3], splitter.owned(p[3])) for p in pieces]
                    self._keep_own(exchange, run, (indices, pieces))
            ordered, pieces = None, []  # let the joined copy go before the next split
            del cells
        with clock("wait for peers"):
            self.on_loop(run.finish, exchange)
        built = 0
        for outputs in run.outputs(exchange, groups[me], clock, empty):  # a group at a time
            built += self.hand_over(exchange, outputs, clock)
        return built

    def hand_over(self, exchange: Exchange, outputs: dict[int, Any], clock: Phases) -> int:
        """Outputs ``j`` this stage built into the worker's memory under their keys (see
        :meth:`keep`), from the stage's thread, each through ``exchange.then`` first where the
        caller gave one; how many. ``then``'s results go to the worker's memory, where it may
        spill them, about a chunk's bytes at a time (by the size of those kept before): a
        group's results held at once outgrew the worker where ``then`` makes more than it
        takes, and ``map_partitions(then)`` after the shuffle did not."""
        if (then := exchange.then) is None:
            with clock("keep"):
                self.on_loop(
                    self.keep, exchange.id, {exchange.keys[j]: p for j, p in outputs.items()}
                )
            return len(outputs)
        limit = self.batches(exchange.target)["chunk"]
        kept, batch, each = 0, {}, None
        for j in list(outputs):
            with clock("then"):
                batch[exchange.keys[j]] = self._then(then, exchange.id, j, outputs.pop(j))
            if outputs and each is not None and len(batch) * each < limit:
                continue
            with clock("keep"):
                sizes = self.on_loop(self.keep, exchange.id, batch)
            each = max(sum(sizes.values()) // len(sizes), 1)
            kept, batch = kept + len(batch), {}
        return kept

    def _then(self, then: Callable[[Any], Any], shuffle_id: str, j: int, part: Any) -> Any:
        """``then(part)`` of output ``j``; its error, named, fails the shuffle."""
        self.raise_if_ended(shuffle_id)  # aborted meanwhile: build no more
        try:
            return then(part)
        except Exception as exc:
            raise ShuffleError(
                f"shuffle {shuffle_id}: then={funcname(then)} raised on output partition {j} on "
                f"{self.worker.address}: {type(exc).__name__}: {exc}"
            ) from exc

    def split_chunks(
        self,
        exchange: Exchange,
        inputs: dict[int, tuple[Key, int]],
        run: ShuffleRun,
        clock: Phases,
    ) -> Iterator[tuple[tuple[int, ...], Any, Cells, np.ndarray]]:
        """This worker's inputs a chunk at a time, split: ``(indices, ordered, cells,
        offsets)``, the rows of output ``j`` being ``ordered[offsets[j]:offsets[j + 1]]``.
        Each chunk's inputs are let go once split, so the worker may spill them; placed inputs
        not computed when the shuffle planned (``exchange.computing``) are waited for, a chunk
        at a time, as this worker computes them; the others are taken from wherever they are."""
        sizes = {i: nbytes for i, (_, nbytes) in inputs.items()}
        for indices in _chunks(sizes, self.batches(exchange.target)["chunk"]):
            keys = [inputs[i][0] for i in indices]
            if waited := [inputs[i][0] for i in indices if i in exchange.computing]:
                with clock("wait for inputs"):
                    self.on_loop(self.computed_here, run, waited)
            with clock("split"):
                parts = self.take_inputs(keys)
                for i, part in zip(indices, parts, strict=True):
                    if categories := exchange.splitter.categories_of(part):
                        run.categories[i] = categories
                ordered, cells = exchange.splitter.split(list(indices), parts)
                offsets = np.concatenate([[0], np.cumsum(output_rows(cells, len(exchange.keys)))])
                parts = []
            yield indices, ordered, cells, offsets

    def take_inputs(self, keys: list[Key]) -> list:
        """Inputs from this worker's data, read on the loop as Distributed reads them (in one
        visit: a visit per input costs a thread handoff each); from the cluster where one is no
        longer here (Distributed may drop one of two copies)."""
        here = self.on_loop(self._held, keys)
        missing = [key for key in keys if key not in here]
        if missing:
            client = get_client()
            # "memory": the input was computed; a Future made without a state stays pending
            # in this client (the scheduler is never asked about it) and gather waits forever
            # (distributed types `state` as a FutureState but looks it up as a state's name)
            futures: list[Future] = [
                Future(k, client, state="memory")  # type: ignore[arg-type]
                for k in missing
            ]
            here.update(zip(missing, client.gather(futures), strict=True))
        return [here[key] for key in keys]

    def _held(self, keys: list[Key]) -> dict[Key, Any]:
        """Those of ``keys`` this worker holds (unspilled where spilled), by key."""
        data = self.worker.data
        return {key: data[key] for key in keys if key in data}

    def _keep_own(self, exchange: Exchange, run: ShuffleRun, message: tuple) -> None:
        """Rows whose outputs this worker owns: into its own buffer, recorded as not moved."""
        self.on_loop(run.put, *message)
        self.ledger.add(
            op="shuffle",
            path="local",
            nbytes=_nbytes(message),
            seconds=0.0,
            shard=exchange.id,
            peer=self.worker.address,
        )

    def on_loop(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func`` (a coroutine function or a plain one) on the worker's event loop."""

        async def call() -> Any:
            result = func(*args)
            return await result if asyncio.iscoroutine(result) else result

        return sync(self.worker.loop, call)


def _rows(splitter: Splitter, ordered: Any, offsets: np.ndarray, outputs: range) -> Any:
    """The rows of a split chunk bound for ``outputs`` (one slice), or None where there are none."""
    start, stop = offsets[outputs.start], offsets[outputs.stop]
    return splitter.rows(ordered, start, stop) if stop > start else None


def _nbytes(message: tuple) -> int:
    """Bytes of the rows in a message ``(inputs, pieces)``."""
    return sum(sizeof(rows) for *_, rows in message[1])


def _chunks(sizes: dict[int, int], chunk_bytes: int) -> Iterator[tuple[int, ...]]:
    """The inputs (index: bytes) in order, as runs of consecutive inputs of about
    ``chunk_bytes`` each (an input larger than that is a run of its own)."""
    chunk: list[int] = []
    nbytes = 0
    for i, size in sorted(sizes.items()):
        if chunk and nbytes + size > chunk_bytes:
            yield tuple(chunk)
            chunk, nbytes = [], 0
        chunk.append(i)
        nbytes += size
    if chunk:
        yield tuple(chunk)
