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
  on, at most ``EXTENSIONS`` times, for as long as ``rearm_delay`` says: a whole ``timeout`` when
  the loop was behind by a long pass (at least ``timeout / GRACE_PASSES``: a busy loop), else
  ``GRACE_PASSES`` times the lag, these short re-arms adding up to one ``timeout`` at most. A
  stall of a few ms (the process descheduled on a loaded machine, the loop itself idle) leaves a
  reply already received the few loop passes it needs, and is no reason to wait a whole timeout
  more: re-armed a whole timeout at every late firing, a silent store's calls took 5 timeouts;
* else the store is silent while our loop keeps up: the call times out.

So a hung store still fails a call within ``timeout`` on an idle loop, within about
``2 * timeout`` (plus the stalls themselves) on a loop whose process keeps stalling, and within
``(EXTENSIONS + 1) * timeout`` on a loop that stays busy, unless ``heard`` says it answers. The
Redis pipeline's timers (``redis/pipeline.py``) follow the same rule, through ``rearm_delay``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["EXTENSIONS", "GRACE_PASSES", "LATE", "loop_lag", "rearm_delay", "wait_for_store"]

LATE = 0.002
EXTENSIONS = 4  # re-arms for a busy loop alone (no sign from the store itself)
# Loop passes a reply already received takes to reach its caller, with room (Cluster: 4-6): a lag
# that long times this is a busy loop (re-armed a whole timeout), a shorter one a stall.
GRACE_PASSES = 8
_T = TypeVar("_T")


def rearm_delay(lag: float, timeout: float, graced: float) -> float:
    """Seconds a timer waits on whose own loop is ``lag`` behind (it fired that late, or one more
    loop pass took that long), with no sign from the store: 0 (not at all: the store is silent)
    for a lag up to ``LATE``; a whole ``timeout`` for a busy loop (``lag`` at least
    ``timeout / GRACE_PASSES``); else, a stall, ``GRACE_PASSES * lag``, within what is left of one
    ``timeout`` after the short re-arms so far (``graced`` seconds; 0 once no more than ``LATE``
    is left). A delay shorter than ``timeout`` is such a short re-arm: add it to ``graced``."""
    if lag <= LATE:
        return 0.0
    if lag * GRACE_PASSES >= timeout:
        return timeout
    grace = min(lag * GRACE_PASSES, timeout - graced)
    return grace if grace > LATE else 0.0


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
    the store is answering, or one behind our own busy (or stalled) loop, waits on."""
    task = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()
    extensions = 0
    graced = 0.0  # seconds of short re-arms for stalls (at most one timeout in all)
    wait = timeout
    while True:
        due = loop.time() + wait
        try:
            done, _ = await asyncio.wait((task,), timeout=wait)
            if not done:
                wait = timeout
                if heard is not None and heard():
                    continue
                if extensions < EXTENSIONS:
                    lag = loop.time() - due
                    if lag * GRACE_PASSES < timeout:  # a busy loop, or a stall? one more pass tells
                        lag = max(lag, await loop_lag())
                    wait = rearm_delay(lag, timeout, graced)
                    if wait:
                        extensions += 1
                        if wait < timeout:
                            graced += wait
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
