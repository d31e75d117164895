"""Timeouts that bound a store, not the event loop.

When the loop is busy elsewhere (a CPU-bound handler, a backlog of requests), a timeout timer
fires late, in the same loop pass that delivers the reply it was guarding, and wins: a healthy
store "times out", and under the default fail-open policy the request is let through. Here a
timer that fires late (more than ``LATE`` after it was due) gives the call its timeout once
more, measured from then (``EXTENSIONS`` = 1): a call waits at most ``timeout``, or
``2 * timeout`` when the loop itself ran the timer late, plus that lateness.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["EXTENSIONS", "LATE", "wait_for_store"]

LATE = 0.002
EXTENSIONS = 1  # re-arms of a late timer: a call never waits more than 2 * timeout
_T = TypeVar("_T")


async def wait_for_store(awaitable: Awaitable[_T], timeout: float) -> _T:
    """Like ``asyncio.wait_for``, but late timer firings (a busy loop) extend the deadline."""
    task = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()
    extensions = 0
    while True:
        due = loop.time() + timeout
        try:
            done, _ = await asyncio.wait((task,), timeout=timeout)
        except asyncio.CancelledError:  # our caller is cancelled: so is the work it waited for
            task.cancel()
            task.add_done_callback(_retrieve)
            raise
        if done:
            return task.result()
        if loop.time() - due > LATE and extensions < EXTENSIONS:
            extensions += 1
            continue
        task.cancel()
        task.add_done_callback(_retrieve)  # no "exception was never retrieved" warnings
        raise asyncio.TimeoutError


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
