"""A stalled process is not a busy loop, for calls outside the coalescing pipeline too:
``wait_for_store`` (RedisStore calls outside the pipeline: ``coalesce=0``, Cluster checks spanning
several slots; ``Breaker(timeout=...)`` around any store) fails a silent store's call within about
2 x timeout when every timer fires a few ms late, the loop itself idle.

It re-armed a whole timeout at every timer that fired more than ``LATE`` late, up to
``EXTENSIONS`` (4) times: on a loaded machine (the process descheduled just as a timer is due) a
silent store's calls took 5 timeouts, as the Cluster pipeline's did (see test_stalls.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any

import pytest

from ratewarden.limits import Limit, make_limits
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.deadline import GRACE_PASSES, LATE, rearm_delay, wait_for_store
from ratewarden.stores.memory import MemoryStore
from tests.timing import Stopwatch

TIMEOUT = 0.2
STALL = 0.006  # the process descheduled just as a timer is due (2-23 ms seen in CI)
# 2 x timeout with room for the stalls themselves (test_stalls.py's bound), and one more timeout: on a
# busy machine (load 9-11, two xdist workers) runs took 0.62-0.68 s with little run-queue wait. Still
# well under the 5 timeouts (1.03 s) of re-arming at each late firing.
BOUND = 3 * TIMEOUT + 0.15


def stall_every_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timer of the running loop runs its callback ``STALL`` late, the loop itself idle
    (its other callbacks, ``call_soon``'s, run at once)."""
    loop = asyncio.get_running_loop()
    call_later = loop.call_later

    def late(
        delay: float, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        def stalled(*args: Any) -> None:
            time.sleep(STALL)
            callback(*args)

        return call_later(delay, stalled, *args, context=context)

    monkeypatch.setattr(loop, "call_later", late)


async def _silent() -> str:
    await asyncio.Event().wait()  # the store is paused
    raise AssertionError("unreachable")


async def test_a_silent_store_call_fails_within_two_timeouts_when_every_timer_fires_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stall_every_timer(monkeypatch)
    with Stopwatch() as clock, pytest.raises(asyncio.TimeoutError):
        await wait_for_store(_silent(), TIMEOUT)
    # Re-armed a whole timeout at each late firing, the call failed after 5 timeouts (1.03 s).
    assert clock.elapsed > TIMEOUT and clock.within(BOUND), clock


async def test_a_breaker_falls_back_within_two_timeouts_when_every_timer_fires_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Paused(MemoryStore):
        async def hit(self, keys: list[str], limits: list[Limit], costs: list[float]) -> Any:
            return await _silent()

    (limit,) = make_limits("3/hour", "gcra")
    breaker = Breaker(Paused(), timeout=TIMEOUT, failures=2, cooldown=60, fallback=MemoryStore())
    stall_every_timer(monkeypatch)
    with Stopwatch() as clock:
        decision = await breaker.hit(["rw:{a}:x"], [limit], [1.0])
    assert decision.allowed  # answered by the fallback
    assert clock.elapsed > TIMEOUT and clock.within(BOUND), clock


async def test_a_reply_received_during_a_stall_still_reaches_its_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The short re-arm leaves a received reply the loop passes it needs: no false timeout."""

    async def late_reply() -> str:
        await asyncio.sleep(TIMEOUT + STALL / 2)  # arrives while the process is stalled at the expiry
        for _ in range(6):  # passes a client takes to read a reply and hand it over
            await asyncio.sleep(0)
        return "reply"

    stall_every_timer(monkeypatch)
    assert await wait_for_store(late_reply(), TIMEOUT) == "reply"


async def test_a_busy_loop_still_rearms_a_whole_timeout() -> None:
    """A loop whose every pass is long (here half the timeout) waits a whole timeout per re-arm,
    as before: the reply, which needs six of those passes (three timeouts), arrives."""
    stop = False

    async def hog() -> None:
        while not stop:
            time.sleep(TIMEOUT / 2)
            await asyncio.sleep(0)

    async def slow_passes() -> str:
        for _ in range(6):
            await asyncio.sleep(0)
        return "reply"

    hogging = asyncio.ensure_future(hog())
    await asyncio.sleep(0)
    try:
        assert await wait_for_store(slow_passes(), TIMEOUT) == "reply"
    finally:
        stop = True
        await hogging


def test_rearm_delay_is_a_whole_timeout_for_a_busy_loop_and_a_bounded_grace_for_a_stall() -> None:
    assert rearm_delay(LATE, TIMEOUT, 0.0) == 0.0  # the loop keeps up: the store is silent
    assert rearm_delay(TIMEOUT / GRACE_PASSES, TIMEOUT, 0.0) == TIMEOUT  # a long pass: a busy loop
    assert rearm_delay(TIMEOUT, TIMEOUT, TIMEOUT) == TIMEOUT  # whatever the stalls took
    assert rearm_delay(STALL, TIMEOUT, 0.0) == pytest.approx(GRACE_PASSES * STALL)
    graced = 0.0
    while delay := rearm_delay(STALL, TIMEOUT, graced):
        assert delay < TIMEOUT
        graced += delay
    assert graced == pytest.approx(TIMEOUT)  # stalls alone: one timeout at most, in all
