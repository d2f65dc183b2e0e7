"""The client side of a shuffle: place outputs, check memory, start the stages, watch them,
publish the outputs.

One stage task per worker that holds input, pinned to that worker, so the inputs never move
before they are split. It gets its inputs' keys, not the inputs: a task's dependencies stay in
memory until it ends, and a stage takes its inputs a chunk at a time. Inputs that are reads
pinned to their workers need not be computed first: the plan is their placement, the stages
start at once and each waits for its own inputs as its worker computes them (an input that
fails is raised as its own error). The stages meet through
the shuffle plugin's comm handlers, not through the scheduler. The scheduler plugin watches the
participants: a worker that leaves fails the shuffle at once (its stage's future gets the
error). When a stage fails, the client has the others aborted through the scheduler and
raises, so nothing waits for a peer that will never answer and no partial output is returned.
When all succeed, the scheduler plugin gathers what each worker kept and registers it, and the
client hands back futures of those outputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NoReturn

import dask
from dask.typing import Key
from dask.utils import format_bytes
from distributed import Client, Future

from ..cluster import ensure_plugins
from ..connection import wait_a_while
from ..errors import ShuffleError
from ..phases import Phases
from ..progress import ShuffleProgress
from ..targets import TargetName
from . import settings
from .engines import holds
from .plugin import START, service
from .split import Splitter
from .worker import Exchange

logger = logging.getLogger(__name__)

#: Seconds between updates of the progress bar while the stages run.
WATCH_INTERVAL = 0.5
#: Seconds the client gives aborted stages to stop before it cancels them and raises.
ABORT_GRACE = 10

#: The client's own phases of the last shuffle this process ran (plan, start, stages, publish;
#: end where it failed), beside the stages' (``ShuffleService.last_phases``): where the time went.
last_phases: dict[str, float] = {}
#: The engine of the last shuffle this process planned (None until one is): which way its bytes
#: went where the caller did not say (``auto``, Dask's own shuffles on the package's exchange).
last_engine: str | None = None


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """A stage's inputs (input ``i``: its key and bytes), in a box Dask's task parser does not
    open: it walks a dict argument looking for futures, about 40 ms for a thousand inputs."""

    by_index: dict[int, tuple[Key, int]]
    stage: str  # the stage task's own key: its worker ends the run if the task is cancelled


def _stage(exchange: Exchange, inputs: _Inputs) -> int:
    return service().stage(exchange, inputs.by_index, inputs.stage)


def _end(client: Client, plan: Exchange, abort: str | None = None) -> None:
    """Tell the scheduler the shuffle is over; with ``abort``, it first ends every participant's
    run (a message on its stream: a stopped worker cannot make this wait)."""
    client.sync(client.scheduler.gpudirect_shuffle_end, shuffle_id=plan.id, reason=abort)


def exchange(
    client: Client,
    inputs: list[Future],
    splitter: Splitter,
    keys: list[Key],
    target: TargetName,
    progress: bool | None = None,
    engines: tuple[str, ...] = ("distributed",),
    placed: list[tuple[str, int]] | None = None,
    then: Callable[[Any], Any] | None = None,
) -> list[Future]:
    """Run the all-to-all of ``inputs`` (partitions, in order) through ``splitter``, moved by
    the first of ``engines`` that has room for it (see :mod:`.engines`), each output through
    ``then`` where given (on its worker, as it is built). Where ``placed`` says which worker
    computes each input and about how many bytes it makes (reads pinned to their workers), the
    stages start at once and each takes its inputs as they are computed; otherwise the inputs
    are waited for first.
    ``inputs`` is emptied once the stages end, so that this function holds none of them.

    Returns one future per output partition, under ``keys``: what a persisted collection is
    made of. (Not tasks that take the stage futures as arguments: a Future inside a graph that
    reaches a scheduler in this process is unpickled as a new Future, which keeps the stage's
    results alive long after the user dropped the output.) ``progress`` shows a bar on stderr
    (None: as ``gpudirect.shuffle.progress`` says).
    """
    timeout = settings.timeout()
    try:
        try:  # a shuffle reads nothing; a stopped worker would hold the first shuffle up for ever
            ensure_plugins(client, need_readers=[], readers=False, timeout=timeout)
        except TimeoutError:
            raise ShuffleError(
                f"a worker did not answer in {timeout:g} s (gpudirect.shuffle.timeout) while the "
                "shuffle was set up on the workers: stopped or overloaded; run the shuffle again"
            ) from None
        if progress is None:
            progress = settings.progress()
        with ShuffleProgress(client, len(inputs), progress, *splitter.shown_as) as shown:
            return _exchange(client, inputs, splitter, keys, target, shown, engines, placed, then)
    except BaseException:
        # the error's frames hold the inputs (``inputs``: the caller's list) for as long as it
        # is kept (a notebook's last one): the workers would keep them too. The plugins' set-up
        # too: a Ctrl-C while a stopped worker holds it up, or its timeout
        inputs.clear()
        raise


def _exchange(
    client: Client,
    inputs: list[Future],
    splitter: Splitter,
    keys: list[Key],
    target: TargetName,
    shown: ShuffleProgress,
    engines: tuple[str, ...],
    placed: list[tuple[str, int]] | None,
    then: Callable[[Any], Any] | None,
) -> list[Future]:
    global last_engine
    last_engine = None
    clock = Phases()
    prepared: dict[str, Any] = {"unplaced": True}
    if placed is not None:
        with clock("plan"):
            prepared = _prepare(client, inputs, target, placed)
    if prepared.get("unplaced"):  # not placed, or a placed worker left: wait for the inputs
        with clock("inputs"):
            shown.computed(inputs)
            failed = [f for f in inputs if f.status in ("error", "cancelled")]
            if failed:
                _raise_error_of(failed[0])
        with clock("plan"):
            prepared = _prepare(client, inputs, target)
    with clock("plan"):
        plan, on_worker, nbytes = _plan(
            client, inputs, splitter, keys, target, engines, prepared, then
        )
    last_engine = plan.engine
    try:  # an interrupt in the start, the stages already submitted, ends them too
        with clock("start"):
            stages = _start(client, plan, on_worker, nbytes)
        with clock("stages"):
            _watch(client, plan, stages, shown, inputs)
        # Let go of the stages and the inputs now (``inputs`` is emptied: the caller's list):
        # their release is a message on the client's batched stream, and sent as this returns
        # it would hold back the caller's next graph (the group-by of the outputs, persisted
        # right after) by up to 10 ms. Inputs the user holds (a persisted frame) stay.
        stages.clear()
        inputs.clear()
        with clock("publish"):  # kept, the outputs end the shuffle on the scheduler
            return _publish_outputs(client, plan)
    except BaseException as exc:  # every participant's run ended (a no-op where an abort
        # did it): a caller interrupted (Ctrl-C) would leave the stages building outputs that
        # no one publishes, or the published outputs wanted by no future; a closed client's
        # shuffles the scheduler ends itself
        with clock("end"), contextlib.suppress(OSError):  # a lost scheduler must not hide
            if client.status == "running":  # the first error
                _end(client, plan, abort=f"the caller's call ended: {type(exc).__name__}")
        on_worker.clear()  # the inputs, held by the error's frames (see exchange)
        raise
    finally:
        clock.count_collections()
        last_phases.clear()
        last_phases.update(clock.seconds)


def _prepare(
    client: Client,
    inputs: list[Future],
    target: TargetName,
    placed: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Where each input is (or, ``placed``, will be computed) and its bytes, and the room of
    each worker that holds one: one round trip to the scheduler. ``unplaced`` where a placed
    worker is no longer in the cluster (its reads may then run anywhere)."""
    return client.sync(
        client.scheduler.gpudirect_shuffle_prepare,
        keys=[f.key for f in inputs],
        target=target,
        placed=placed,
        timeout=settings.timeout(),
    )


def _plan(
    client: Client,
    inputs: list[Future],
    splitter: Splitter,
    keys: list[Key],
    target: TargetName,
    engines: tuple[str, ...],
    prepared: dict[str, Any],
    then: Callable[[Any], Any] | None,
) -> tuple[Exchange, dict[str, dict[int, Future]], dict[Key, int]]:
    """The shuffle's plan, on the first of ``engines`` whose workers have room for it; the
    inputs each worker holds (by input index) and their bytes."""
    npartitions = len(keys)
    holders, nbytes, limits = prepared["who_has"], prepared["nbytes"], prepared["rooms"]
    on_worker: dict[str, dict[int, Future]] = defaultdict(dict)
    for i, future in enumerate(inputs):
        on_worker[holders[future.key][0]][i] = future
    participants = tuple(sorted(on_worker))
    # Contiguous runs: the rows one worker sends another are then one slice of each input.
    owners = tuple(participants[j * len(participants) // npartitions] for j in range(npartitions))
    total = sum(nbytes.values())
    # Outputs built at once: about a chunk's bytes, so no worker holds more of them in hand.
    chunk = min(limit["chunk"] for limit in limits.values())
    group = max(1, min(npartitions, chunk * npartitions // max(total, 1)))
    shares = {w: total * owners.count(w) // npartitions for w in limits}
    engine = _engine_that_holds(engines, shares, {w: limit["room"] for w, limit in limits.items()})
    plan = Exchange(
        uuid.uuid4().hex[:12],
        participants,
        owners,
        splitter,
        target,
        tuple(keys),
        group,
        engine,
        then,
        computing=frozenset(prepared["computing"]),
    )
    if engine == "rapidsmpf":
        plan = _on_rapidsmpf(client, plan, {w: limit["rapidsmpf"] for w, limit in limits.items()})
    logger.info(
        "shuffle %s: %d partitions -> %d over %d workers, engine %s",
        plan.id,
        len(inputs),
        npartitions,
        len(participants),
        engine,
    )
    return plan, on_worker, nbytes


#: The stages' Dask priority: above the default (0) of the inputs they wait for.
STAGE_PRIORITY = 1
#: What a stage does not take from the caller's ``dask.annotate`` (which its inputs do):
#: ``resources``, which a stage would hold for its whole run, seceded or not, so the inputs
#: it waits for, asking the same, never run on a worker of one such resource; ``retries``, as
#: a stage run again finds its shuffle ended on its worker, and its error hides the cause.
NOT_FOR_STAGES = ("resources", "retries")


def _start(
    client: Client,
    plan: Exchange,
    on_worker: dict[str, dict[int, Future]],
    nbytes: dict[Key, int],
) -> dict[str, Future]:
    """A stage task on each participant, pinned there, and the scheduler plugin told to watch
    them first: its start goes on the client's stream ahead of the stages' graphs (their keys
    are known before they are submitted), so the scheduler knows the shuffle before any stage
    runs, and ends it should the client be lost at any point after
    (:meth:`.ShuffleSchedulerPlugin.shuffle_started`).

    The stages come before any other task waiting on their workers (``priority``): a stage
    secedes at once and takes its inputs as they are computed, so on a worker of one thread
    (dask-cuda's default) it splits and sends a placed read's first chunk while the next reads
    run. By Dask's own order (each graph's generation on the scheduler, the worker's count of
    arrivals) a stage could go behind the reads, and start only once its worker had read them
    all: on one H200, ``bench etl``'s stages waited 0.00 s for their inputs, the reads done.

    The stages are submitted from the client's event loop, one after the other with nothing
    awaited between them: their graphs then leave in one message of the client's batched
    stream. Submitted from this thread, each would be a message of its own, and the stream
    holds a message back until 10 ms after the one before it: the last stage would start 10 ms
    after the first (seen on an H200), and the exchange waits for the last.
    """

    # the caller's dask.annotate, less what a stage must not take
    kept = {k: v for k, v in dask.get_annotations().items() if k not in NOT_FOR_STAGES}

    keys = {w: f"gpudirect-shuffle-{plan.id}-{i}" for i, w in enumerate(sorted(on_worker))}

    def submit_stages() -> dict[str, Future]:
        stages = {}
        with dask.annotate(**kept):
            for w, parts in sorted(on_worker.items()):
                inputs = {n: (f.key, nbytes[f.key]) for n, f in parts.items()}
                stages[w] = client.submit(
                    _stage,
                    plan,
                    _Inputs(inputs, keys[w]),
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                    key=keys[w],
                    priority=STAGE_PRIORITY,
                )
        return stages

    async def submit() -> dict[str, Future]:
        # the start, then the stages' graphs, on the client's stream in that order: each is a
        # callback queued on this loop (``Client._send_to_scheduler``), nothing awaited between
        client._send_to_scheduler(
            {
                "op": START,
                "shuffle_id": plan.id,
                "participants": list(plan.participants),
                "stages": keys,
            }
        )
        # in a context of its own: the caller's annotations (a ContextVar) replaced by ``kept``
        return contextvars.Context().run(submit_stages)

    return client.sync(submit)


def _on_rapidsmpf(client: Client, plan: Exchange, members: dict[str, Any]) -> Exchange:
    """``plan`` with an op id of its own, its workers sharing one RapidsMPF communicator (the
    one ``members`` says they have, or a new one)."""
    from .rapidsmpf_engine import ensure_ranks, op_id_limit

    limit = op_id_limit()
    try:  # a Ctrl-C too (the communicator's start takes seconds), reserved or not yet
        op_id = client.sync(
            client.scheduler.gpudirect_shuffle_op_id,
            shuffle_id=plan.id,
            client=client.id,
            limit=limit,
        )
        ensure_ranks(client, plan.participants, members)
    except BaseException:
        with contextlib.suppress(OSError):
            _end(client, plan)  # gives the op id back
        raise
    return dataclasses.replace(plan, op_id=op_id)


def _publish_outputs(client: Client, plan: Exchange) -> list[Future]:
    """The outputs, kept by the workers that built them under the plan's keys, as futures: the
    scheduler learns where each is from the stages' reports, as after ``client.scatter``, with
    no task per output (one round trip: :meth:`.ShuffleSchedulerPlugin.publish`)."""
    keys = list(plan.keys)
    kept = client.sync(
        client.scheduler.gpudirect_shuffle_publish,
        shuffle_id=plan.id,
        client=client.id,
        workers=list(plan.participants),
        expected=len(keys),
    )
    if kept["lost"]:  # a participant left after its stage finished
        _end(client, plan, abort="lost")
        raise ShuffleError(
            f"worker(s) {kept['lost']} left the cluster before shuffle {plan.id}'s outputs were "
            "kept; no output was returned. The cluster is still usable: run the shuffle again."
        )
    if kept["outputs"] != len(keys):
        raise ShuffleError(
            f"shuffle {plan.id}: its workers kept {kept['outputs']} of {len(keys)} outputs; no "
            "output was returned"
        )
    outputs: list[Future] = [Future(key, client) for key in keys]
    for key in keys:
        client.futures[key].finish()
    return outputs


def _engine_that_holds(
    engines: tuple[str, ...], shares: dict[str, int], rooms: dict[str, dict[str, int]]
) -> str:
    """The first of ``engines`` on which every worker holds its share of the bytes (on the GPU
    alone for all but the last: ``auto`` prefers RapidsMPF only where it need not spill); where
    none does, fail before any byte moves, naming a worker that cannot hold its share."""
    for engine in engines:
        spilling = engine == engines[-1]
        short = [w for w in shares if not holds(engine, shares[w], rooms[w], spilling)]
        if not short:
            return engine
    worker, room = short[0], rooms[short[0]]
    if engine == "rapidsmpf":
        why = (
            f"the 'rapidsmpf' engine spills to host memory, not to disk, and can hold "
            f"{format_bytes(room['device'] + room['host'])} (GPU "
            f"{format_bytes(room['device'])}, host {format_bytes(room['host'])}); use "
            "engine='distributed' (it spills to disk too), raise "
            "gpudirect.shuffle.device-limit/host-limit"
        )
    else:
        why = (
            f"can hold {format_bytes(sum(room.values()))} (GPU {format_bytes(room['device'])}, "
            f"host {format_bytes(room['host'])}, disk {format_bytes(room['disk'])}); raise "
            "gpudirect.shuffle.device-limit/host-limit/disk-limit"
        )
    raise ShuffleError(
        f"shuffle cannot fit: worker {worker} would receive about {format_bytes(shares[worker])} "
        f"but {why} or add workers"
    )


def _watch(
    client: Client,
    plan: Exchange,
    stages: dict[str, Future],
    shown: ShuffleProgress,
    inputs: list[Future],
) -> None:
    """Wait for every stage; when one fails (a lost worker's stage fails when it leaves), abort
    the rest and raise the first cause: an input's own error where one failed (its stage
    waited for it), else the first stage's. An input cancelled meanwhile (``client.cancel``
    of its key) ends the shuffle with its CancelledError, and one that failed with its own
    error, as where the inputs are waited for first: a stage that waits for it to be computed
    on its worker would wait for ever (the scheduler forgot it, or holds its error, and the
    stage is no dependent of it to fail with it). Only the client hears that an input failed
    for good: the worker's stage cannot tell a last failure from one the scheduler retries
    (``dask.annotate(retries=...)``)."""
    pending = set(stages.values())
    while pending:
        wait_a_while(client, pending, WATCH_INTERVAL)
        done = {f for f in pending if f.done()}
        pending -= done
        # an input cancelled, or erred for good (its retries spent): its stage waits for it
        lost = (
            next((f.status for f in inputs if f.status in _LOST_INPUT), None) if pending else None
        )
        if not lost and all(f.status == "finished" for f in done):
            shown.exchange(plan, stages, pending, inputs)
            continue
        why = _LOST_INPUT[lost] if lost else "failed on a peer"
        _end(client, plan, abort=f"shuffle {plan.id} {why}")
        wait_a_while(client, pending, ABORT_GRACE, "ALL_COMPLETED")  # the others stop, clean up
        failed = [f for f in inputs if f.status == "error"]
        failed += [f for f in inputs if f.status == "cancelled"]
        worker, cause = ("", "") if failed else _first_cause(stages)
        client.cancel(list(stages.values()))
        if failed:
            _raise_error_of(failed[0])
        raise ShuffleError(
            f"shuffle {plan.id} failed on {worker}: {cause}; no output was returned. The "
            "cluster is still usable: run the shuffle again (it will use the workers that "
            "remain)."
        )


#: An input's status that ends the shuffle while its stage waits for it, and why.
_LOST_INPUT = {"cancelled": "an input was cancelled", "error": "an input failed"}


def _raise_error_of(future: Future) -> NoReturn:
    """Raise a failed input's own error in the user's process: a copy of the one the client
    keeps for the input's future. ``future.result()`` raises that very object, and each frame
    it passes through joins its traceback: the user's frame among them, with every collection
    it holds (a later shuffle's outputs too), kept on the workers for as long as the client
    keeps the failed key."""
    if future.status != "error":  # cancelled: Dask's CancelledError, made as it is raised
        future.result()
    raise copy.copy(future.exception()).with_traceback(future.traceback())


def _first_cause(stages: dict[str, Future]) -> tuple[str, str]:
    """The worker and the error of a failed stage that is a cause, not an echo of another's
    failure (a peer that refused because its run had already ended there, an abort); by
    worker name."""
    done = [w for w in sorted(stages) if stages[w].status not in ("pending", "finished")]
    errors = [(w, _error_of(stages[w])) for w in done]
    causes = [(w, e) for w, e in errors if not getattr(e, "secondary", False)]
    worker, error = (causes or errors)[0]
    return worker, str(error)


def _error_of(future: Future) -> BaseException:
    try:
        return future.exception(timeout=5)
    except Exception as exc:  # a cancelled or lost future still has a story
        return RuntimeError(f"{type(exc).__name__}: {exc}")
