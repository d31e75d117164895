"""Killing and restarting real servers under concurrent load; the circuit breaker; memcached keys."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memcached import THIRTY_DAYS, MemcachedStore, expiry, memcached_key
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from tests.servers import Memcached, RedisStandalone, redis_cmd
from tests.timing import Stopwatch


async def _load(store: Breaker, stop: asyncio.Event, workers: int = 50) -> tuple[list[float], list[BaseException], int]:
    (limit,) = make_limits("1000000/hour", "token_bucket")
    latencies: list[float] = []
    errors: list[BaseException] = []
    allowed = 0

    async def worker(n: int) -> None:
        nonlocal allowed
        key = f"rw:{{load|{n % 5}}}:{limit.suffix}"
        while not stop.is_set():
            started = time.perf_counter()
            try:
                decision = await store.hit([key], [limit], [1.0])
                allowed += decision.allowed
            except BaseException as exc:
                errors.append(exc)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(worker(n) for n in range(workers)))
    return latencies, errors, allowed


async def _kill_and_restart(
    server: RedisStandalone, store: Breaker, clock: Stopwatch
) -> tuple[list[float], list[BaseException], int]:
    """Kills the server under load and restarts it; ``clock`` times the load (its ``waited``: the
    slack a busy machine adds to every latency)."""
    clock.start()
    stop = asyncio.Event()
    load = asyncio.create_task(_load(store, stop))
    await asyncio.sleep(0.4)
    server.stop()
    await asyncio.sleep(1.0)
    assert store.state in ("open", "half-open")
    server.server.start()
    await asyncio.sleep(1.5)  # cooldown (0.3 s) elapses; a probe closes the circuit
    stop.set()
    result = await load
    clock.stop()
    # A slow batch on this busy machine may have reopened the circuit late in the run: after one
    # cooldown a single probe must close it again by itself.
    await asyncio.sleep(0.35)
    (limit,) = make_limits("10/min", "fixed_window")
    await store.hit(["rw:{probe|x}:p"], [limit], [1.0])
    return result


async def test_redis_killed_and_restarted_under_load_with_fallback() -> None:
    server = RedisStandalone().start()
    store = Breaker(RedisStore(server.url, timeout=0.02), cooldown=0.3, fallback=MemoryStore())
    try:
        clock = Stopwatch()
        latencies, errors, allowed = await _kill_and_restart(server, store, clock)
        assert errors == []  # the fallback answered while Redis was gone
        assert allowed == len(latencies)
        # bounded by the 20 ms store timeout, never a connect hang
        assert max(latencies) < 0.75 + clock.slack, (max(latencies), clock)
        assert store.opened >= 1 and store.short_circuited > 0
        assert store.state == "closed"  # closed by itself
        assert int(redis_cmd(server.port, "DBSIZE")) > 0  # and limiting resumed on Redis
    finally:
        await store.close()
        server.close()


async def test_redis_killed_without_fallback_fails_fast_with_store_error() -> None:
    server = RedisStandalone().start()
    inner = RedisStore(server.url, timeout=0.02)
    store = Breaker(inner, cooldown=0.3)
    try:
        clock = Stopwatch()
        latencies, errors, _ = await _kill_and_restart(server, store, clock)
        assert errors and all(isinstance(e, StoreError) for e in errors)
        assert max(latencies) < 0.75 + clock.slack, (max(latencies), clock)
        assert store.short_circuited > len(errors) // 2  # most failures cost no timeout at all
        assert store.state == "closed"
        (limit,) = make_limits("1/min", "gcra")
        key = f"rw:{{after|{uuid.uuid4().hex}}}:{limit.suffix}"
        assert (await store.hit([key], [limit], [1.0])).allowed
        assert not (await store.hit([key], [limit], [1.0])).allowed
    finally:
        await store.close()
        server.close()


async def test_breaker_with_wait_for_timeout_on_a_hanging_store() -> None:
    class Hanging(MemoryStore):
        async def hit(self, keys, limits, costs):  # type: ignore[no-untyped-def]
            await asyncio.sleep(10)
            raise AssertionError("unreachable")

    (limit,) = make_limits("2/min")
    store = Breaker(Hanging(), timeout=0.01, failures=2, cooldown=60)
    for _ in range(2):
        with contextlib.suppress(StoreError):
            await store.hit(["k"], [limit], [1.0])
    with Stopwatch() as clock:
        try:
            await store.hit(["k"], [limit], [1.0])
        except StoreError as exc:
            assert "circuit open" in str(exc)
    assert clock.within(0.005), clock
    assert store.state == "open"


async def test_memcached_odd_keys_and_long_ttls(memcached_server: Memcached) -> None:
    assert memcached_key("rw:{a|b}:x") == b"rw:{a|b}:x"
    for odd in ["rw:{a b|c}:x", "rw:" + "k" * 300, "rw:{caf\u00e9}:x", "rw:\x01"]:
        hashed = memcached_key(odd)
        assert len(hashed) <= 250 and b" " not in hashed and hashed.startswith(b"rw:h:")
    assert expiry(10.2, 1_000_000.0) == 12
    assert expiry(40 * 86400, 1_700_000_000.5) == 1_700_000_000 + 40 * 86400 + 1
    assert expiry(THIRTY_DAYS - 1, 0.0) == THIRTY_DAYS
    store = MemcachedStore(memcached_server.url, timeout=5)
    limits = make_limits("1/60 days", "fixed_window") + make_limits("2/s", "sliding_log")
    keys = [f"rw:{{odd key {uuid.uuid4().hex}}}:{limit.suffix}" for limit in limits]
    try:
        assert (await store.hit(keys, limits, [1.0, 1.0])).allowed
        denied = await store.hit(keys, limits, [1.0, 1.0])
        # the 60-day state was kept (a TTL past 30 days read as a 1970 timestamp would have expired it):
        # denied until the end of its window, which fixed windows align to the epoch
        period = 60 * 86400
        assert not denied.allowed and abs(denied.retry_after - (period - time.time() % period)) < 5, denied
    finally:
        await store.close()
