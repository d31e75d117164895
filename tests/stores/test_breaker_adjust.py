"""``Breaker.adjust``: refunds and penalties pass through the breaker to the store it wraps
(memory, Redis), and go to the fallback while that store is down."""

from __future__ import annotations

import uuid

import pytest

from ratewarden import MemoryStore, Store
from ratewarden.charges import adjust
from ratewarden.limits import make_limits
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisStandalone
from tests.stores.helpers import FlakyStore


async def _breaker_adjust_roundtrip(store: Store) -> None:
    limits = make_limits("5/min", "fixed_window", "t")
    key = f"rw:{{t|{uuid.uuid4().hex}}}:x"
    breaker = Breaker(store)
    assert (await breaker.hit([key], limits, [1.0])).remaining == 4
    penalised = await adjust(breaker, [key], limits, [3.0])
    assert penalised[0].remaining == 1
    refunded = await adjust(breaker, [key], limits, [-2.0])
    assert refunded[0].remaining == 3
    assert (await store.peek([key], limits))[0].remaining == 3


async def test_breaker_adjusts_through_to_the_memory_store() -> None:
    await _breaker_adjust_roundtrip(MemoryStore())


async def test_breaker_adjusts_through_to_redis(request: pytest.FixtureRequest) -> None:
    server: RedisStandalone = request.getfixturevalue("redis_standalone")
    store = RedisStore(server.url, timeout=5)
    try:
        await _breaker_adjust_roundtrip(store)
    finally:
        await store.close()


async def test_breaker_adjust_uses_the_fallback_while_the_store_is_down() -> None:
    limits = make_limits("5/min", "fixed_window", "t")
    fallback = MemoryStore()
    breaker = Breaker(FlakyStore(up_for=0), fallback=fallback)
    assert (await adjust(breaker, ["k"], limits, [2.0]))[0].remaining == 3
    assert (await fallback.peek(["k"], limits))[0].remaining == 3
