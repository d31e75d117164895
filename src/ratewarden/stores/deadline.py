"""Timeouts that bound a store, not the event loop.

When the loop is busy (a CPU-bound handler, a backlog of a thousand requests), a timeout timer
fires in the same loop pass that delivers the reply it was guarding, or a few passes before the
reply's callbacks run, and wins: a healthy store "times out", and under fail-open the request
went through unchecked. A timeout here is judged when it fires:

* the store was heard from (``heard()``: bytes arrived on the call's connection since the last
  look, or wait unread in the kernel): the store is answering, so the call waits another
  ``timeout``, as often as it keeps answering;
* else, if our own loop is behind (the timer fired more than ``LATE`` late, or one more loop
  pass took more than ``LATE``), the reply may be queued behind our own callbacks: the call waits
  another ``timeout``, at most ``EXTENSIONS`` times;
* else the store is silent while our loop keeps up: the call times out.

So a hung store still fails a call within ``timeout`` on an idle loop, and within
``(EXTENSIONS + 1) * timeout`` on a loop that stays busy, unless ``heard`` says it answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["EXTENSIONS", "LATE", "loop_lag", "wait_for_store"]

LATE = 0.002
EXTENSIONS = 4  # re-arms for a busy loop alone (no sign from the store itself)
_T = TypeVar("_T")


async def loop_lag() -> float:
    """Seconds one more pass of the running loop takes to reach us: near zero on an idle loop,
    the length of the loop's backlog on a busy one."""
    loop = asyncio.get_running_loop()
    asked = loop.time()
    future: asyncio.Future[None] = loop.create_future()
    loop.call_soon(_settle, future)
    await future
    return loop.time() - asked


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_for_store(
    awaitable: Awaitable[_T], timeout: float, heard: Callable[[], bool] | None = None
) -> _T:
    """Like ``asyncio.wait_for``, but a timeout is judged as the module docstring says: a call
    the store is answering, or one behind our own busy loop, waits on."""
    task = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()
    extensions = 0
    while True:
        due = loop.time() + timeout
        try:
            done, _ = await asyncio.wait((task,), timeout=timeout)
            if not done:
                if heard is not None and heard():
                    continue
                late = loop.time() - due > LATE
                if extensions < EXTENSIONS and (late or await loop_lag() > LATE):
                    extensions += 1
                    continue
        except asyncio.CancelledError:  # our caller is cancelled: so is the work it waited for
            task.cancel()
            task.add_done_callback(_retrieve)
            raise
        if task.done():
            return task.result()
        task.cancel()
        task.add_done_callback(_retrieve)  # no "exception was never retrieved" warnings
        raise asyncio.TimeoutError


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
