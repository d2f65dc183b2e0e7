"""Progress of work that runs now: a live bar in terminals and notebooks, plain lines elsewhere.

Loads are lazy Dask collections, so Dask's own ``distributed.progress(df.persist())`` shows them.
``dg.shuffle`` runs its all-to-all inside the call, where no Dask bar can reach it, so it takes
``progress=True`` (or the ``gpudirect.shuffle.progress`` config, which Dask's own shuffles on
``shuffle_method="gpudirect"`` follow) and shows it here: the input partitions computed, then
the pieces that reached the workers owning them. The CLI turns these bars on by default.

Where the output is not a terminal (CI logs, captured output), a bar is a plain line every
``LINE_INTERVAL`` seconds and one at the end: no carriage returns, no escape codes.
"""

from __future__ import annotations

import importlib.util
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from .connection import wait_a_while

if TYPE_CHECKING:
    from distributed import Client, Future, Worker

#: Seconds between polls of the work a bar follows.
POLL_INTERVAL = 0.5
#: Seconds between plain progress lines where the output is not a terminal.
LINE_INTERVAL = 10.0


class Bar:
    """One bar on stderr: ``update`` it with what is done, and ``close`` it (or leave ``with``).

    Live (rich) where stderr is an interactive terminal or a notebook with ipywidgets; else plain
    lines at most every ``LINE_INTERVAL`` seconds while the count moves, and one when it closes.
    """

    def __init__(self, label: str, total: int, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.label, self.total, self.done, self.detail = label, total, 0, ""
        self.started = self.last_line = time.monotonic()
        self._printed: tuple = ()  # what the last plain line said, so as not to say it twice
        self._live: Progress | None = None
        if self.console.is_interactive or _notebook(self.console):
            self._live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._live.add_task(label, total=total, detail="")
            self._live.start()

    def update(
        self, done: int, total: int | None = None, label: str | None = None, detail: str = ""
    ) -> None:
        """Show ``done`` of ``total`` (unchanged if None) under ``label`` with a ``detail``.

        A new ``label`` starts a new phase: without a live bar, the last one ends with a line.
        """
        if self._live is None and label not in (None, self.label):
            self._line()
        moved = done != self.done or (total is not None and total != self.total)
        self.done, self.detail = done, detail
        self.total = self.total if total is None else total
        self.label = label or self.label
        if self._live is not None:
            self._live.update(
                self._task,
                completed=done,
                total=self.total,
                description=self.label,
                detail=detail,
            )
        elif moved and time.monotonic() - self.last_line >= LINE_INTERVAL:
            self._line()

    def print(self, message: str) -> None:
        """``message`` on a line of its own, above a live bar."""
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def close(self, stopped: bool = False) -> None:
        """Stop a live bar; where there is none, the last line. ``stopped``: the work failed."""
        if self._live is not None:
            self._live.stop()
        else:
            self._line(" (stopped)" if stopped else "")

    def _line(self, end: str = "") -> None:
        state = (self.label, self.done, self.total, self.detail)
        if state == self._printed and not end:
            return
        self._printed, self.last_line = state, time.monotonic()
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        detail = f", {self.detail}" if self.detail else ""
        seconds = self.last_line - self.started
        self.print(f"{self.label}: {self.done}/{self.total}{share}{detail}, {seconds:.1f} s{end}")

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any
    ) -> None:
        self.close(stopped=kind is not None)


def _notebook(console: Console) -> bool:
    """A Jupyter kernel that can show a live bar (rich draws it in an ipywidgets output)."""
    return console.is_jupyter and importlib.util.find_spec("ipywidgets") is not None


def wait(client: Client, futures: list[Future], bar: Bar | None = None) -> None:
    """``distributed.wait(futures)`` on ``client``, counting on ``bar`` those that finished
    (not those that failed or were cancelled). Those done already are not waited for:
    ``distributed.wait`` of a thousand finished futures costs 12-20 ms (a persisted frame's
    partitions, shuffled). One lost once done (its worker left: Dask computes it again) is
    waited for again."""
    from distributed import wait as wait_all

    pending = {f for f in futures if not f.done()}
    with client.as_current():  # distributed.wait uses the current client; ours may not be it
        while pending:
            if bar is None:
                wait_all(pending)
            else:
                bar.update(_finished(futures))
                wait_a_while(client, pending, POLL_INTERVAL)
            pending = {f for f in futures if not f.done()}
    if bar is not None:
        bar.update(_finished(futures))


def _finished(futures: list[Future]) -> int:
    """How many of ``futures`` have their result: a failed or cancelled one is done, not
    computed."""
    return sum(f.status == "finished" for f in futures)


def _received(dask_worker: Worker, shuffle_id: str) -> int:
    """Input partitions whose rows for this worker's outputs have arrived here (on a worker)."""
    from .shuffle.plugin import service

    run = service(dask_worker).runs.get(shuffle_id)
    if run is None:
        return 0
    chunks = (chunk for group in run.received.values() for chunk in group.values())
    return len({i for inputs, _, _ in chunks for i in inputs})


class ShuffleProgress:
    """What ``progress=True`` shows of one shuffle (``call``, of ``unit``): the inputs
    computed, then pieces received.

    Every input's rows reach every worker that owns outputs (in chunks of several inputs), so
    such a worker counts the inputs whose rows have arrived, up to as many as there are inputs
    (fewer where an input has no rows for it: its finished stage then completes its count).
    Without ``enabled`` it only waits.
    """

    def __init__(self, client: Client, inputs: int, enabled: bool, call: str, unit: str):
        self.client, self.inputs, self.call = client, inputs, call
        self.bar = Bar(f"{call}: {unit}", inputs) if enabled else None
        self.seen: dict[str, int] = {}
        self.computing = True  # the bar still counts the inputs computed

    def computed(self, futures: list[Future]) -> None:
        """Wait for the input partitions, counting them."""
        wait(self.client, futures, self.bar)

    def exchange(
        self, plan: Any, stages: dict[str, Future], pending: set[Future], inputs: list[Future]
    ) -> None:
        """One poll of the pieces each owner of ``plan`` has received; ``pending``: the stages
        still running. The shuffle of a read starts while the files are read: until every input
        is computed, the bar counts those computed."""
        if self.bar is None:
            return
        if self.computing:
            self.bar.update(_finished(inputs))
            if self.bar.done < self.inputs:
                return
            self.computing = False
        got = self.client.run(
            _received, shuffle_id=plan.id, workers=list(plan.participants), on_error="ignore"
        )
        owners = [w for w in plan.participants if plan.outputs_of(w)]
        for w in owners:
            have = self.inputs if stages[w] not in pending else min(self.inputs, got.get(w, 0))
            self.seen[w] = max(have, self.seen.get(w, 0))  # combining empties the received set
        self.bar.update(
            sum(self.seen.values()),
            total=self.inputs * len(owners),
            label=f"{self.call} {plan.id}: pieces received",
            detail=f"stages done {len(stages) - len(pending)}/{len(stages)}",
        )

    def __enter__(self) -> ShuffleProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any
    ) -> None:
        if self.bar is not None:
            self.bar.close(stopped=kind is not None)
