"""The shuffle as an extension of its own, as Distributed's ``distributed/shuffle/`` is.

:class:`ShuffleWorkerPlugin` gives each worker a :class:`~.worker.ShuffleService` and its comm
handlers, and ends every run (removing its spill files) when it is removed. It is apart from
GPUDirectPlugin, so re-registering the readers (the documented way to change their options)
leaves a running shuffle alone.

:class:`ShuffleSchedulerPlugin` knows the shuffles in flight: the client tells it of one on its
stream, before the stages' graphs, so a client that leaves takes its shuffles with it. When a
participant leaves the cluster (``remove_worker``) it fails the shuffle at once: the survivors'
runs end with an error naming the lost worker, and the client's future of the lost worker's
stage, which would otherwise wait in ``no-worker`` for a worker that never comes back, gets that
error too. The
client also asks it to abort a shuffle (messages on the scheduler's streams, which never wait
on a worker that stopped answering), to gather what a shuffle is planned by (where the inputs
are, the holders' room), and to publish a finished shuffle's outputs: each stage reports what
its worker kept on the worker's stream as it ends, and the scheduler registers them. Each is
one round trip of the client's.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from time import time
from typing import Any, NoReturn

from dask._task_spec import Task
from dask.typing import Key
from distributed import Scheduler, SchedulerPlugin, Worker, WorkerPlugin
from distributed.protocol.pickle import dumps
from distributed.scheduler import ClientState, TaskState, WorkerState
from distributed.worker import get_worker

from .. import ledger, metrics
from ..errors import ShuffleError
from ..placement import staying
from .worker import BUILT, MAX_CLOSED, ShuffleService

logger = logging.getLogger(__name__)

#: The worker's stream op that ends a run: ``shuffle_id``, ``reason``, ``secondary``.
FAIL = "gpudirect-shuffle-fail"
#: The client's stream op that starts a shuffle: ``shuffle_id``, ``participants``, ``stages``
#: (worker -> its stage's key). Sent before the stages, on the same stream as their graphs.
START = "gpudirect-shuffle-start"
#: The worker's stream op that says whether the scheduler kept the outputs it reported:
#: ``shuffle_id``, ``kept``.
PUBLISHED = "gpudirect-shuffle-published"
#: How many published shuffles the scheduler remembers the outputs of: a caller interrupted
#: as the publish's reply came ends its shuffle right after.
MAX_PUBLISHED = 16
#: The longest the scheduler waits for the graph of a shuffle's placed inputs as it plans.
ARRIVAL_WAIT = 10.0


class ShuffleWorkerPlugin(WorkerPlugin):
    """Each worker's shuffle runs and the handlers its peers and the scheduler call."""

    name = "gpudirect-shuffle"
    idempotent = True  # registered before every shuffle: never replace a service mid-run

    def setup(self, worker: Worker) -> None:
        self.service = ShuffleService(worker, ledger.of(worker))
        # its counts published where no GPUDirectPlugin does it (a cluster that only shuffles)
        metrics.export(worker, self.service.ledger)
        worker.handlers.update(self.service.handlers())
        worker.stream_handlers[FAIL] = self.service.abort
        worker.stream_handlers[PUBLISHED] = self.service.published

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        self.service.task_changed(key, start, finish)

    def teardown(self, worker: Worker) -> None:
        metrics.unexport(worker, self.service.ledger)
        self.service.teardown()
        for name in self.service.handlers():
            worker.handlers.pop(name, None)
        # the scheduler may still end or publish a shuffle this worker ran (the client's abort
        # of the runs just ended here): an op with no handler breaks the worker's stream to
        # the scheduler, and the worker closes
        worker.stream_handlers[FAIL] = _no_longer_here
        worker.stream_handlers[PUBLISHED] = _no_longer_here


def _no_longer_here(**msg: Any) -> None:
    """A stream message for a shuffle on a worker whose plugin was removed: its runs ended
    and its outputs were let go then (:meth:`.ShuffleService.teardown`)."""


def _keep(scheduler: Scheduler, built: dict[str, dict], client: str) -> list[tuple[TaskState, str]]:
    """The outputs each worker of ``built`` keeps (key -> bytes), in memory there, wanted by
    ``client``, each with its worker: what ``Scheduler.update_data`` does, less two things these
    need not. The workers' addresses are the scheduler's own, not to be made canonical again;
    and the client finishes the futures itself (:func:`.coordinator._publish_outputs`), so no
    ``key-in-memory`` message goes to it for each. 1024 outputs on the 2-core CPU: the
    scheduler's publish 36-54 ms, against 43-80 with ``update_data``."""
    wants = scheduler.clients.get(client)
    if wants is None:
        scheduler.clients[client] = wants = ClientState(client)
    kept = []
    for worker, by_key in built.items():
        holder = scheduler.workers[worker]
        for key, nbytes in by_key.items():
            ts = scheduler.tasks.get(key) or scheduler.new_task(key, None, "memory")
            ts.state = "memory"
            ts.set_nbytes(nbytes)
            scheduler.add_replica(ts, holder)
            if ts.who_wants is None:
                ts.who_wants = set()
            ts.who_wants.add(wants)
            wants.wants_what.add(ts)
            kept.append((ts, worker))
    return kept


def _lost_output(shuffle_id: str, worker: str) -> NoReturn:
    raise ShuffleError(
        f"an output of shuffle {shuffle_id} was lost with worker {worker}, which held it: "
        "run the shuffle again (the cluster is still usable)"
    )


async def _arrived(scheduler: Scheduler, keys: list[Key]) -> bool:
    """Whether the scheduler knows every one of ``keys``, waiting up to :data:`ARRIVAL_WAIT`
    seconds. The caller's persist of the reads goes on its batched stream, the planning's
    request on a comm of its own, and may come first: placement pins a read only once its
    graph is here, and not always to the worker it was placed on (the caller's ``workers=``,
    ``resources`` that worker lacks), so a stage planned there waited for ever for a read
    that ran on another."""
    deadline = time() + ARRIVAL_WAIT
    while any(key not in scheduler.tasks for key in keys):
        if time() > deadline:  # the caller waits for the inputs, which fail with the cause
            return False
        await asyncio.sleep(0.005)
    return True


def service(worker: Worker | None = None) -> ShuffleService:
    """The shuffle service of ``worker`` (default: the one running this task)."""
    worker = worker or get_worker()
    plugin = worker.plugins.get(ShuffleWorkerPlugin.name)
    if not isinstance(plugin, ShuffleWorkerPlugin):
        raise ShuffleError(f"worker {worker.address} has no ShuffleWorkerPlugin")
    return plugin.service


@dataclasses.dataclass
class _Active:
    client: str
    participants: set[str]
    stages: dict[str, str]  # worker -> the key of its stage task


class ShuffleSchedulerPlugin(SchedulerPlugin):
    """The shuffles in flight, failed at once when a participant or their client leaves the
    cluster."""

    name = "gpudirect-shuffle"
    idempotent = True

    def __init__(self) -> None:
        self.active: dict[str, _Active] = {}
        self.op_ids: dict[str, int] = {}  # shuffle id -> its RapidsMPF op id, while it runs
        # shuffle id -> the client that reserved its op id: one lost before its start gives
        # it back (``remove_client``)
        self.op_clients: dict[str, str] = {}
        # shuffle id -> worker -> the outputs its finished stage reported (key -> bytes), until
        # they are published; and the shuffles that ended, whose late reports are not kept
        self.reports: dict[str, dict[str, dict[Key, int]]] = {}
        self.ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        # the last shuffles published: their client and output keys, let go of where the
        # client's call ends without them (interrupted as the reply came)
        self.published: collections.OrderedDict[str, tuple[str, list[Key]]] = (
            collections.OrderedDict()
        )

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        scheduler.stream_handlers[START] = self.shuffle_started
        scheduler.handlers["gpudirect_shuffle_end"] = self.shuffle_ended
        scheduler.handlers["gpudirect_shuffle_op_id"] = self.reserve_op_id
        scheduler.handlers["gpudirect_shuffle_publish"] = self.publish
        scheduler.handlers["gpudirect_shuffle_prepare"] = self.prepare
        scheduler.stream_handlers[BUILT] = self.built

    async def prepare(
        self,
        keys: list,
        target: str,
        placed: list[tuple[str, int]] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """What the client plans a shuffle of the inputs ``keys`` by, in one round trip of
        its own: where each input is and its bytes (the scheduler's) and the room of each
        worker that holds one (the workers', asked at once, each given ``timeout`` seconds,
        the client's ``gpudirect.shuffle.timeout``: a stopped worker answers never). With
        ``placed`` (the worker that computes each input, and its bytes read) the inputs need
        not be computed yet: ``computing`` lists those that are not (by index), which each
        stage waits for on its worker (one in memory is taken from wherever it is then: Dask's
        memory manager may drop the copy planned on), or ``unplaced`` where one of those
        workers has left, so its input may run elsewhere.

        A worker that is retiring (``closing_gracefully``: ``retire_workers``, a cluster that
        scales down) is given no task, so no stage may be pinned to it: a placed input there
        counts as ``unplaced`` (placement runs it on another), an input it holds goes to a
        holder that stays, else to the staying worker with the fewest inputs so far, whose
        stage fetches it (:meth:`.ShuffleService.take_inputs`)."""
        scheduler = self.scheduler
        if placed is not None and not await _arrived(scheduler, keys):
            return {"unplaced": True}
        stay = sorted(w for w in scheduler.workers if staying(scheduler, w))
        if placed is not None and not all(staying(scheduler, w) for w, _ in placed):
            # a read placed on a worker that left (or retires) runs wherever the scheduler puts
            # it, and one in memory now may be released and run again elsewhere before its
            # stage takes it (its futures let go as the caller's persist makes new ones): a
            # stage would wait for it here for ever. The caller waits for the inputs instead.
            return {"unplaced": True}
        who_has, nbytes, computing = {}, {}, []
        taken = collections.Counter[str]()
        for i, key in enumerate(keys):
            ts = scheduler.tasks.get(key)
            if ts is not None and ts.who_has:
                holders = sorted(ws.address for ws in ts.who_has)
                here = [w for w in holders if staying(scheduler, w)]
                if not here and not stay:
                    raise ShuffleError(
                        f"shuffle input {key!r} is held by worker(s) {holders}, which are "
                        "retiring, and no other worker stays to run the shuffle"
                    )
                who_has[key] = here or [min(stay, key=lambda w: (taken[w], w))]
                taken[who_has[key][0]] += 1
                nbytes[key] = ts.nbytes
            elif placed is not None:
                worker, nbytes[key] = placed[i]
                if ts is not None and ts.worker_restrictions != {worker}:
                    # not pinned to the worker planned: placement chose another (the caller's
                    # workers= or resources), or the worker left (placement let the read go
                    # anywhere) and one joined at its address (a fixed --worker-port). The
                    # read may run elsewhere, and a stage there would wait for ever
                    return {"unplaced": True}
                who_has[key] = [worker]
                computing.append(i)
            else:
                raise ShuffleError(f"shuffle input {key!r} is no longer in memory: run it again")
        holders = sorted({workers[0] for workers in who_has.values()})
        rooms = await asyncio.gather(
            *(
                asyncio.wait_for(
                    self.scheduler.rpc(w).gpudirect_shuffle_room(target=target), timeout
                )
                for w in holders
            ),
            return_exceptions=True,
        )
        lost = [(w, e) for w, e in zip(holders, rooms, strict=True) if isinstance(e, Exception)]
        if lost and placed is not None:  # its reads will run elsewhere
            return {"unplaced": True}
        if lost:
            (worker, error), *_ = lost
            if not isinstance(error, OSError):  # it answered with an error (its own settings)
                raise ShuffleError(f"worker {worker}, which holds shuffle inputs: {error}")
            why = (
                f"in gpudirect.shuffle.timeout, {timeout} s"
                if isinstance(error, TimeoutError)
                else repr(error)
            )
            raise ShuffleError(
                f"worker {worker}, which holds shuffle inputs, did not answer ({why}): "
                "run the shuffle again"
            )
        return {
            "who_has": who_has,
            "nbytes": nbytes,
            "rooms": dict(zip(holders, rooms, strict=True)),
            "computing": computing,
        }

    def shuffle_started(
        self, shuffle_id: str, client: str, participants: list[str], stages: dict[str, str]
    ) -> None:
        """Watch a shuffle whose stages ``client`` is about to submit: its message on the
        client's stream comes before their graphs, so a client lost at any point after (its
        process killed, its network gone) has the shuffle ended by ``remove_client``; told
        after the stages, on a comm of its own, the scheduler never heard of a shuffle whose
        client was lost in between, and the workers kept its outputs for ever. There is no
        reply: a participant already gone fails the shuffle at once, as if it had left during
        it (the client hears it as its stage's error). One that ended before it started (its
        caller interrupted while the stages were submitted: the end is a comm of its own) ends
        on every participant."""
        shuffle = _Active(client, set(participants), stages)
        if shuffle_id in self.ended:
            self._tell(shuffle, shuffle_id, "the caller's call ended before it started", True)
            return
        if client not in self.scheduler.clients:
            # its client closed (another thread's ``client.close()``: its close-client came
            # first on the stream): ``remove_client`` found nothing to end
            self._forget(shuffle_id)
            reason = f"client {client} left the cluster before shuffle {shuffle_id} started"
            self._tell(shuffle, shuffle_id, reason, True)
            return
        self.active[shuffle_id] = shuffle
        gone = sorted(set(participants) - set(self.scheduler.workers))
        if gone:  # one is enough: the shuffle fails, and the client cancels every stage
            self._lost(shuffle_id, gone[0])

    def reserve_op_id(self, shuffle_id: str, client: str, limit: int) -> int:
        """The lowest RapidsMPF op id (``< limit``) no shuffle in flight holds; it is the
        shuffle's until it ends, or until ``client`` leaves the cluster. RapidsMPF tells
        concurrent shuffles apart by op id alone, and has a fixed number of them: one reserved
        by a client lost before its start (killed as the communicator started, seconds) was
        kept for ever, as no start, end or ``remove_client`` named it. This is a comm of the
        client's own, which may be handled after its removal: nothing would then give the id
        back, so none is reserved."""
        if client not in self.scheduler.clients:
            self._forget(shuffle_id)
            raise ShuffleError(f"client {client} left the cluster before shuffle {shuffle_id}")
        taken = set(self.op_ids.values())
        free = next((i for i in range(limit) if i not in taken), None)
        if free is None:
            raise ShuffleError(f"{limit} RapidsMPF shuffles are in flight, its most at once")
        self.op_ids[shuffle_id] = free
        self.op_clients[shuffle_id] = client
        return free

    def built(self, worker: str, shuffle_id: str, keys: list[Key], nbytes: list[int]) -> None:
        """A stage's report of the outputs its worker keeps (:meth:`.ShuffleService.report_built`);
        one of a shuffle that ended (aborted, its client lost) is not kept."""
        if shuffle_id not in self.ended:
            self.reports.setdefault(shuffle_id, {})[worker] = dict(zip(keys, nbytes, strict=True))

    def publish(
        self, shuffle_id: str, client: str, workers: list[str], expected: int
    ) -> dict[str, Any]:
        """Learn where each output of ``shuffle_id`` is, from what the stages of ``workers``
        reported, as after ``client.scatter``, for ``client``; each gets a task that raises
        a ShuffleError naming its worker. Data without a task is forgotten when its worker
        dies, and what needs it is cancelled with no word of why; with one, the scheduler
        "recomputes" it, and whatever needed the output fails with that error, at once. Where a
        worker is gone or fewer than ``expected`` outputs were reported, none is kept (the
        workers let go of theirs) and the reply says why."""
        reports = self.reports.pop(shuffle_id, {})
        scheduler = self.scheduler
        gone = sorted(set(workers) - set(scheduler.workers))
        count = sum(len(by_key) for by_key in reports.values())
        if gone or count != expected:
            self._tell_kept(reports, shuffle_id, kept=False)
            return {"lost": gone, "outputs": count}
        kept = _keep(scheduler, reports, client)
        for order, (ts, worker) in enumerate(kept):
            ts.run_spec = Task(ts.key, _lost_output, shuffle_id, worker)
            ts.priority = (0, scheduler.generation, order)  # as update_graph gives a task
        tasks = [ts for ts, _ in kept]
        # ... and a span, as update_graph gives: a worker that runs a task of no span sends
        # metrics the scheduler rejects in the worker's heartbeat, and the worker then closes.
        scheduler.extensions["spans"].observe_tasks(tasks, code=(), span_metadata={})
        self._tell_kept(reports, shuffle_id, kept=True)
        self.shuffle_ended(shuffle_id)  # its outputs are kept: the client need not end it
        self.published[shuffle_id] = (client, [ts.key for ts in tasks])
        if len(self.published) > MAX_PUBLISHED:
            self.published.popitem(last=False)
        return {"lost": [], "outputs": count}

    def _tell_kept(self, reports: dict[str, dict], shuffle_id: str, kept: bool) -> None:
        """Tell the workers that reported outputs whether they were kept (else they let go)."""
        message = {"op": PUBLISHED, "shuffle_id": shuffle_id, "kept": kept}
        alive = set(reports) & set(self.scheduler.workers)
        self.scheduler.send_all({}, {worker: [message] for worker in alive})

    def shuffle_ended(self, shuffle_id: str, reason: str | None = None) -> None:
        """Forget a shuffle; with a ``reason``, first end its run on every participant, or,
        where its outputs were published already, let the client's hold on them go."""
        published = self.published.pop(shuffle_id, None)
        if published is not None and reason is not None:
            client, keys = published
            if client in self.scheduler.clients:
                self.scheduler.client_releases_keys(
                    keys, client, stimulus_id=f"gpudirect-shuffle-end-{time()}"
                )
        self._forget(shuffle_id)
        shuffle = self.active.pop(shuffle_id, None)
        if shuffle is not None and reason is not None:
            self._tell(shuffle, shuffle_id, reason, secondary=True)

    def valid_workers_downscaling(
        self, scheduler: Scheduler, workers: list[WorkerState]
    ) -> list[WorkerState]:
        """``workers`` less the participants of the shuffles in flight: a cluster that scales
        down (``adapt``) must not retire one. A participant whose stage has ended looks idle to
        the scheduler (its outputs are registered only once every stage has ended), and was
        retired mid-shuffle: the shuffle failed as if it had died. Distributed's P2P shuffle
        keeps its participants the same way."""
        busy = {w for shuffle in self.active.values() for w in shuffle.participants}
        return [ws for ws in workers if ws.address not in busy]

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        """A client that leaves mid-shuffle (closed, or its process gone) takes its shuffles
        with it: every participant ends its run and lets go of what it built, where its stage
        would wait on its peers up to ``gpudirect.shuffle.timeout`` and keep outputs that no
        one will publish."""
        for shuffle_id, shuffle in list(self.active.items()):
            if shuffle.client == client:
                reason = f"client {client} left the cluster during shuffle {shuffle_id}"
                self.shuffle_ended(shuffle_id, reason)
        # an op id reserved for a shuffle not started yet (the start would come on the
        # stream that just closed): given back, and its shuffle, should a start come, ended
        for shuffle_id, owner in list(self.op_clients.items()):
            if owner == client:
                self._forget(shuffle_id)

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        for shuffle_id, shuffle in list(self.active.items()):
            if worker in shuffle.participants:
                self._lost(shuffle_id, worker)

    def _lost(self, shuffle_id: str, worker: str) -> None:
        shuffle = self.active.pop(shuffle_id)
        self._forget(shuffle_id)
        error = ShuffleError(f"worker {worker} left the cluster during shuffle {shuffle_id}")
        logger.warning("%s", error)
        self._tell(shuffle, shuffle_id, str(error), secondary=False)
        message = {"op": "task-erred", "key": shuffle.stages[worker], "exception": dumps(error)}
        self.scheduler.send_all({shuffle.client: [message]}, {})

    def _forget(self, shuffle_id: str) -> None:
        """Let go of what the scheduler holds for a shuffle that ended, and remember it ended."""
        self.op_ids.pop(shuffle_id, None)
        self.op_clients.pop(shuffle_id, None)
        self.reports.pop(shuffle_id, None)
        self.ended[shuffle_id] = None
        if len(self.ended) > MAX_CLOSED:
            self.ended.popitem(last=False)

    def _tell(self, shuffle: _Active, shuffle_id: str, reason: str, secondary: bool) -> None:
        message = {"op": FAIL, "shuffle_id": shuffle_id, "reason": reason, "secondary": secondary}
        alive = shuffle.participants & set(self.scheduler.workers)
        self.scheduler.send_all({}, {worker: [message] for worker in alive})
