"""The client side of a shuffle: place outputs, check memory, start the stages, watch them.

One stage task per worker that holds input, pinned to that worker, so the inputs never move
before they are split; the stages meet through the plugin's comm handlers, not through the
scheduler. The client watches them: when a stage fails or a participant leaves the cluster, it
aborts the others at once and raises, so nothing waits for a peer that will never answer and no
partial output is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from typing import Any

from dask.typing import Key
from dask.utils import format_bytes
from distributed import Client, Future, wait

from ..cluster import ensure_plugins
from ..errors import ShuffleError
from ..progress import ShuffleProgress
from .worker import Exchange

logger = logging.getLogger(__name__)

#: Seconds between the client's checks that every participant is still in the cluster.
WATCH_INTERVAL = 0.5
#: Seconds the client gives aborted stages to stop before it cancels them and raises.
ABORT_GRACE = 10


def _stage(exchange: Exchange, inputs: dict[int, Any]) -> dict[int, Any]:
    from ..plugin import current_plugin

    return current_plugin().shuffle.stage(exchange, inputs)


def _limits(dask_worker, target: str) -> dict[str, int]:
    return dask_worker.plugins["gpudirect"].shuffle.limits(target)


def _abort(dask_worker, shuffle_id: str, reason: str) -> None:
    dask_worker.plugins["gpudirect"].shuffle.abort(shuffle_id, reason)


def _abort_on(client: Client, plan: Exchange, reason: str, workers: list[str]) -> None:
    """Abort the shuffle on ``workers``, waiting at most ABORT_GRACE seconds: a worker stopped
    by SIGSTOP is still in the cluster but never answers. Best effort: the stages end anyway
    when they are cancelled, and a cut call may end in a comm error (UCX), not a timeout."""

    async def abort():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                client._run(
                    _abort, shuffle_id=plan.id, reason=reason, workers=workers, on_error="ignore"
                ),
                ABORT_GRACE,
            )

    client.sync(abort)


def _publish(dask_worker, shuffle_id: str, keys: list) -> dict:
    return dask_worker.plugins["gpudirect"].shuffle.publish(shuffle_id, keys)


def exchange(
    client: Client,
    inputs: list[Future],
    splitter: Any,
    keys: list[Key],
    target: str,
    progress: bool = False,
) -> list[Future]:
    """Run the all-to-all of ``inputs`` (computed partitions, in order) through ``splitter``.

    Returns one future per output partition, under ``keys``: what a persisted collection is
    made of. (Not tasks that take the stage futures as arguments: a Future inside a graph that
    reaches a scheduler in this process is unpickled as a new Future, which keeps the stage's
    results alive long after the user dropped the output.) ``progress`` shows a bar on stderr.
    """
    ensure_plugins(client)
    with ShuffleProgress(client, len(inputs), progress) as shown:
        shown.computed(inputs)
        return _exchange(client, inputs, splitter, keys, target, shown)


def _exchange(client, inputs, splitter, keys, target, shown: ShuffleProgress) -> list[Future]:
    npartitions = len(keys)
    failed = [f for f in inputs if f.status != "finished"]
    if failed:
        failed[0].result()  # the input's own error, in the user's process
    holders = client.who_has(inputs)
    on_worker: dict[str, dict[int, Future]] = defaultdict(dict)
    for i, future in enumerate(inputs):
        on_worker[sorted(holders[future.key])[0]][i] = future
    participants = tuple(sorted(on_worker))
    # Contiguous runs: the rows one worker sends another are then one slice of each input.
    owners = tuple(participants[j * len(participants) // npartitions] for j in range(npartitions))
    plan = Exchange(uuid.uuid4().hex[:12], participants, owners, splitter, target)
    _check_memory(client, plan, client.nbytes([f.key for f in inputs], summary=False))
    logger.info(
        "shuffle %s: %d partitions -> %d over %d workers",
        plan.id,
        len(inputs),
        npartitions,
        len(participants),
    )
    stages = {
        w: client.submit(
            _stage,
            plan,
            parts,
            workers=[w],
            allow_other_workers=False,
            pure=False,
            key=f"gpudirect-shuffle-{plan.id}-{i}",
        )
        for i, (w, parts) in enumerate(sorted(on_worker.items()))
    }
    _watch(client, plan, stages, shown)
    return _publish_outputs(client, plan, list(keys))


def _publish_outputs(client: Client, plan: Exchange, keys: list[Key]) -> list[Future]:
    """The outputs, kept by the workers that built them under ``keys``, as futures: the
    scheduler learns where each is, as after ``client.scatter``, with no task per output."""
    try:
        nbytes = client.run(
            _publish, shuffle_id=plan.id, keys=keys, workers=list(plan.participants)
        )
    except Exception as exc:  # a participant left after its stage finished
        gone = sorted(set(plan.participants) - set(client.nthreads()))
        _abort_on(client, plan, "lost", list(plan.participants))
        raise ShuffleError(
            f"worker(s) {gone or plan.participants} left the cluster before shuffle {plan.id}'s "
            f"outputs were kept ({type(exc).__name__}: {exc}); no output was returned. The "
            "cluster is still usable: run the shuffle again."
        ) from None
    who_has = {keys[j]: [owner] for j, owner in enumerate(plan.owners)}
    sizes = {key: n for by_key in nbytes.values() for key, n in by_key.items()}
    client.run_on_scheduler(
        _keep_outputs, shuffle_id=plan.id, who_has=who_has, nbytes=sizes, client_id=client.id
    )
    outputs = [Future(key, client) for key in keys]
    for key in keys:
        client.futures[key].finish()
    return outputs


def _keep_outputs(
    dask_scheduler, shuffle_id: str, who_has: dict, nbytes: dict, client_id: str
) -> None:
    """On the scheduler: learn where the outputs are, as after ``client.scatter``, and give each
    a task that raises a ShuffleError naming its worker. Data without a task is forgotten when
    its worker dies, and what needs it is cancelled with no word of why; with one, the scheduler
    "recomputes" it, and whatever needed the output fails with that error, at once."""
    from dask._task_spec import Task

    dask_scheduler.update_data(who_has=who_has, nbytes=nbytes, client=client_id)
    for order, (key, (worker,)) in enumerate(who_has.items()):
        ts = dask_scheduler.tasks[key]
        ts.run_spec = Task(key, _lost_output, shuffle_id, worker)
        ts.priority = (0, dask_scheduler.generation, order)  # as update_graph gives a task


def _lost_output(shuffle_id: str, worker: str):
    raise ShuffleError(
        f"an output of shuffle {shuffle_id} was lost with worker {worker}, which held it: "
        "run the shuffle again (the cluster is still usable)"
    )


def _check_memory(client: Client, plan: Exchange, nbytes: dict[str, int]) -> None:
    """Fail before any byte moves when a worker cannot hold its share even on disk."""
    total = sum(nbytes.values())
    limits = client.run(_limits, target=plan.target, workers=list(plan.participants))
    for worker, limit in limits.items():
        share = total * plan.owners.count(worker) // len(plan.owners)
        room = sum(limit.values())
        if share > room:
            raise ShuffleError(
                f"shuffle cannot fit: worker {worker} would receive about {format_bytes(share)} "
                f"but can hold {format_bytes(room)} (GPU {format_bytes(limit['device'])}, host "
                f"{format_bytes(limit['host'])}, disk {format_bytes(limit['disk'])}); raise "
                "gpudirect.shuffle.device-limit/host-limit/disk-limit or add workers"
            )


def _watch(
    client: Client, plan: Exchange, stages: dict[str, Future], shown: ShuffleProgress
) -> None:
    """Wait for every stage; on a failure or a lost participant, abort the rest and raise."""
    pending = set(stages.values())
    while pending:
        try:
            with client.as_current():
                wait(pending, timeout=WATCH_INTERVAL, return_when="FIRST_COMPLETED")
        except TimeoutError:  # nothing finished in this interval: check on the participants
            pass
        done = {f for f in pending if f.done()}
        pending -= done
        errors = [f for f in done if f.status != "finished"]
        alive = set(client.nthreads())
        gone = sorted(set(plan.participants) - alive)
        if not errors and not gone:
            shown.exchange(plan, stages, pending)
            continue
        if gone:
            reason = f"worker(s) {gone} left the cluster during shuffle {plan.id}"
        else:
            reason = f"shuffle {plan.id} failed on a peer"
        survivors = sorted(set(plan.participants) & alive)
        _abort_on(client, plan, reason, survivors)
        try:  # let the survivors stop and clean up before the caller retries
            with client.as_current():
                wait([stages[w] for w in survivors], timeout=ABORT_GRACE)
        except TimeoutError:
            pass
        if not gone:  # every stage has had its say: name the first cause, not its echoes
            reason = f"shuffle {plan.id} failed: {_first_cause(stages)}"
        client.cancel(list(stages.values()))
        raise ShuffleError(
            f"{reason}; no output was returned. The cluster is still usable: run the shuffle "
            "again (it will use the workers that remain)."
        )


def _first_cause(stages: dict[str, Future]) -> str:
    """The error of a failed stage that is a cause, not an echo of another's failure (a peer
    that refused because its run had already ended there, an abort); by worker name."""
    done = [stages[w] for w in sorted(stages) if stages[w].status not in ("pending", "finished")]
    errors = [_error_of(future) for future in done]
    causes = [e for e in errors if not getattr(e, "secondary", False)]
    return str((causes or errors)[0])


def _error_of(future: Future) -> BaseException:
    try:
        return future.exception(timeout=5)
    except Exception as exc:  # a cancelled or lost future still has a story
        return RuntimeError(f"{type(exc).__name__}: {exc}")
