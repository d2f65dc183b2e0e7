"""The client every public function works through: the one given, or Dask's current one.

Checked before use, so a closed or wrong ``client=`` is a clear error in the user's process, not
an ``AttributeError`` from deep inside distributed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Literal

from distributed import Client, Future, default_client
from distributed.client import _wait

from .errors import InputError


def connected(client: Client | None) -> Client:
    """``client`` (default: the current client), a running :class:`distributed.Client` that
    this thread may block on."""
    if client is None:
        return off_its_loop(default_client())  # "No clients found": Dask's error says what to do
    if not isinstance(client, Client):
        raise InputError(None, f"client= must be a distributed.Client, not {type(client).__name__}")
    if client.status != "running":
        raise InputError(
            None,
            f"client= is {client.status}, not running: connect a new one, e.g. "
            "Client(cluster), and pass that",
        )
    return off_its_loop(client)


def off_its_loop(client: Client) -> Client:
    """``client``, where the caller is not on its event loop: the package's calls wait for
    the cluster, and on an asynchronous client's loop they would get coroutines back (and fail
    deep inside with a ``TypeError``). From another thread that client blocks as any does."""
    if client.asynchronous:
        raise InputError(
            None,
            "this call waits for the cluster, so it cannot run on the event loop of an "
            "asynchronous Client (Client(asynchronous=True)): from async code, run it in a "
            "thread, e.g. await asyncio.to_thread(dg.shuffle, df, 'id', client=client), and "
            "for Dask's own shuffle_method='gpudirect' await asyncio.to_thread(client.persist, "
            "collection)",
        )
    return client


def wait_a_while(
    client: Client,
    futures: Iterable[Future],
    seconds: float,
    until: Literal["FIRST_COMPLETED", "ALL_COMPLETED"] = "FIRST_COMPLETED",
) -> None:
    """Until one of ``futures`` is done (``until="ALL_COMPLETED"``: all of them), or for
    ``seconds``; a timeout is not an error.

    Not ``distributed.wait(..., timeout=)`` in a ``suppress(TimeoutError)``: its TimeoutError
    comes up through ``Client.sync``, which keeps it in a reference cycle, and with its traceback
    every frame of the caller. The futures those frames hold (a shuffle's inputs, the collection
    they came from) then stay alive, and their data on the workers, until Python's garbage
    collector happens to run. Here the timeout is met and dropped on the event loop.
    """
    client.sync(_settle, list(futures), seconds, until)


async def _settle(futures: list[Future], seconds: float, until: str) -> None:
    with contextlib.suppress(TimeoutError):
        await _wait(futures, timeout=seconds, return_when=until)
