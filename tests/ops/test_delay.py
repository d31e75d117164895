"""Delay instead of reject: bounded waits, a per-key burst and a cap on waiting requests."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from ratewarden import Limiter, MemoryStore
from ratewarden.keys import header
from ratewarden.policy import PolicyMiddleware, PolicyRule
from ratewarden.policy.delay import Delay

from ..policy.apps import build_app, client


async def test_requests_over_the_rate_wait_within_the_burst() -> None:
    delay = Delay(max_wait=2.0, burst=3, max_waiting=100)
    # GCRA at 10/s lets 10 through at once, then one every 0.1 s.
    rule = PolicyRule("/export", "10/s", algorithm="gcra", key=header("X-Client"), name="export", delay=delay)
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), [rule])
    async with client(app) as http:
        start = time.monotonic()
        responses = await asyncio.gather(*(http.get("/export", headers={"X-Client": "d"}) for _ in range(16)))
        elapsed = time.monotonic() - start
    got = Counter(r.status_code for r in responses)
    # 10 at once, 3 wait for their turn (burst), 3 are refused immediately.
    assert got == {200: 13, 429: 3}
    assert delay.delayed == 3 and delay.waiting == 0
    # The three waiters cannot all have been served before the rate allowed them.
    assert elapsed >= 0.25


async def test_wait_longer_than_max_wait_is_refused_at_once() -> None:
    delay = Delay(max_wait=0.5, burst=5)
    # A day's window: its reset is never within max_wait of now (a minute's was, 0.8% of runs).
    rule = PolicyRule("/export", "1/day", key=header("X-Client"), name="export", delay=delay)
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), [rule])
    async with client(app) as http:
        first = await http.get("/export", headers={"X-Client": "x"})
        second = await http.get("/export", headers={"X-Client": "x"})
    assert (first.status_code, second.status_code) == (200, 429)
    assert delay.delayed == 0 and delay.waiting == 0


async def test_cap_on_waiting_requests_is_global() -> None:
    delay = Delay(max_wait=2.0, burst=10, max_waiting=2)
    rule = PolicyRule("/export", "5/s", algorithm="gcra", key=header("X-Client"), name="export", delay=delay)
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), [rule])
    async with client(app) as http:
        responses = await asyncio.gather(
            *(http.get("/export", headers={"X-Client": f"c{i % 2}"}) for i in range(16))
        )
    got = Counter(r.status_code for r in responses)
    # 5 + 5 at once (two keys), 2 waiters in total, the rest refused.
    assert got == {200: 12, 429: 4}
    assert delay.waiting == 0
