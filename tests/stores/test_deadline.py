"""wait_for_store: a timeout that bounds the awaited work, not time the loop spent elsewhere."""

from __future__ import annotations

import asyncio
import time

import pytest

from ratewarden.stores.deadline import wait_for_store
from tests.timing import Stopwatch


async def _reply_after(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "reply"


async def test_a_busy_loop_does_not_turn_a_ready_reply_into_a_timeout() -> None:
    pending = asyncio.ensure_future(wait_for_store(_reply_after(0.005), 0.02))
    await asyncio.sleep(0)
    time.sleep(0.1)  # the loop is busy elsewhere for five timeouts
    assert await pending == "reply"


async def test_a_slow_store_still_times_out_within_the_bound() -> None:
    with Stopwatch() as clock, pytest.raises(asyncio.TimeoutError):
        await wait_for_store(_reply_after(1.0), 0.02)
    assert clock.within(0.5), clock


async def test_asyncio_wait_for_shows_the_problem_it_fixes() -> None:
    pending = asyncio.ensure_future(asyncio.wait_for(_reply_after(0.005), 0.02))
    await asyncio.sleep(0)
    time.sleep(0.1)
    with pytest.raises(asyncio.TimeoutError):
        await pending
