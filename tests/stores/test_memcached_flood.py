"""MemcachedStore under a flood (issue 19): exact counts with the default 50 ms timeout, a busy
loop that is not memcached's fault, a hung memcached that still fails fast, per-key coalescing
that decides exactly as sequential checks, and the rejection cache."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import StoreError
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.memory import MemoryStore
from tests.servers import Memcached
from tests.timing import Stopwatch
from tests.vectors.runner import FakeClock

#: The timeout of the tests about decisions, not timeouts: a loaded machine can leave memcached
#: without a core for longer than the default 50 ms, which would fail a check these tests compare.
GENEROUS = 5.0


def _key(tag: str, limit: Limit) -> str:
    return f"rw:{{flood|{uuid.uuid4().hex}|{tag}}}:{limit.suffix}"


def _count_commands(store: MemcachedStore) -> dict[str, int]:
    """Count the commands ``store`` sends, by name (``gets``, ``cas``, ...)."""
    counts: dict[str, int] = {}
    real = store._send

    def send(conn: Any, payload: bytes, read: Any) -> Any:
        name = payload.split(b" ", 1)[0].strip().decode()
        counts[name] = counts.get(name, 0) + 1
        return real(conn, payload, read)

    store._send = send  # type: ignore[method-assign]
    return counts


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_300_concurrent_against_100_with_the_default_timeout(memcached_server: Memcached, algorithm: str) -> None:
    store = MemcachedStore(memcached_server.url, cache=False)  # default timeout: 50 ms
    limit = Limit(Rate(100, 3600), algorithm)
    key = _key("exact", limit)
    counts = _count_commands(store)
    try:
        decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(300)))
        assert sum(d.allowed for d in decisions) == 100
        assert [d.remaining for d in decisions[:100]] == list(range(99, -1, -1))  # in arrival order
        assert not any(d.allowed for d in decisions[100:])
        assert counts["gets"] <= 10  # coalesced: a few batches, not 300 rounds
    finally:
        await store.reset([key])
        await store.close()


async def test_a_busy_loop_is_not_a_timeout(memcached_server: Memcached) -> None:
    """A CPU-bound task hogs the loop in 30 ms slices while 300 checks run: with a 50 ms timeout,
    none fails (the reply is there, our loop is late) and exactly the limit is allowed."""
    store = MemcachedStore(memcached_server.url, cache=False)
    limit = Limit(Rate(100, 3600), "fixed_window")
    keys = [_key(f"busy{i}", limit) for i in range(3)]
    await store.hit([f"{keys[0]}:warm"], [limit], [1.0])  # connections open
    stop = False

    async def hog() -> None:
        while not stop:
            time.sleep(0.03)
            await asyncio.sleep(0)

    async def check(key: str) -> bool:
        await asyncio.sleep(0)
        return (await store.hit([key], [limit], [1.0])).allowed

    hogging = asyncio.ensure_future(hog())
    try:
        results = await asyncio.gather(*(check(keys[i % 3]) for i in range(300)), return_exceptions=True)
    finally:
        stop = True
        await hogging
        await store.reset(keys)
        await store.close()
    assert not [r for r in results if isinstance(r, BaseException)], "a check failed on a healthy memcached"
    assert sum(results) == 300  # 100 per key: all allowed


async def test_a_busy_loop_over_the_limit_is_exact(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, cache=False)
    limit = Limit(Rate(100, 3600), "sliding_window")
    key = _key("busy", limit)
    await store.hit([f"{key}:warm"], [limit], [1.0])
    stop = False

    async def hog() -> None:
        while not stop:
            time.sleep(0.03)
            await asyncio.sleep(0)

    async def check() -> bool:
        await asyncio.sleep(0)
        return (await store.hit([key], [limit], [1.0])).allowed

    hogging = asyncio.ensure_future(hog())
    try:
        results = await asyncio.gather(*(check() for _ in range(300)), return_exceptions=True)
    finally:
        stop = True
        await hogging
        await store.reset([key])
        await store.close()
    assert not [r for r in results if isinstance(r, BaseException)]
    assert sum(results) == 100


async def test_a_reply_read_late_by_a_blocked_loop_is_used(memcached_server: Memcached) -> None:
    # 50 ms: a woken memcached answers well within it even with both cores busy.
    store = MemcachedStore(memcached_server.url, timeout=0.05, cache=False)
    limit = Limit(Rate(10, 3600), "gcra")  # nothing drains back while the loop is blocked
    key = _key("late", limit)
    try:
        await store.hit([key], [limit], [1.0])
        for multi in (False, True):
            call = store.hit([key, f"{key}:b"], [limit, limit], [1.0, 1.0]) if multi else store.hit([key], [limit], [1.0])
            pending = asyncio.ensure_future(call)
            await asyncio.sleep(0)
            # Ten timeouts (time enough for memcached to answer, even waiting for a core): the timer
            # fires in the same pass as the reply arrives.
            time.sleep(0.5)
            assert (await pending).allowed
        assert (await store.peek([key], [limit]))[0].remaining == 7
    finally:
        await store.reset([key, f"{key}:b"])
        await store.close()


async def test_a_hung_memcached_fails_checks_within_about_the_timeout(private_memcached: Memcached) -> None:
    timeout = 0.1
    store = MemcachedStore(private_memcached.url, timeout=timeout, pool_size=2)
    limit = Limit(Rate(100, 3600), "token_bucket")
    keys = [_key(f"hung{i}", limit) for i in range(6)]
    try:
        await store.hit([keys[0]], [limit], [1.0])
        with private_memcached.server.paused():
            with Stopwatch() as clock:
                checks = [store.hit([keys[i % 6]], [limit], [1.0]) for i in range(60)]
                checks += [store.hit(keys[:2], [limit, limit], [1.0, 1.0]) for _ in range(5)]
                results = await asyncio.wait_for(asyncio.gather(*checks, return_exceptions=True), 5)
            assert all(isinstance(r, StoreError) for r in results), results
            assert clock.within(2.5 * timeout), clock
            with Stopwatch() as clock, pytest.raises(StoreError, match="no reply within 100 ms"):
                await store.hit([keys[5]], [limit], [1.0])  # a later check: its own timeout
            assert clock.within(2.5 * timeout), clock
        await asyncio.sleep(0.3)  # put-backs finish once it answers again
        decisions = await asyncio.gather(*(store.hit([k], [limit], [1.0]) for k in keys))
        assert all(d.allowed for d in decisions)
        assert store._locks == {} and store._queues == {}
    finally:
        await store.close()


async def test_coalesced_checks_decide_as_sequential_ones(memcached_server: Memcached) -> None:
    """Concurrent checks of one key, mixed costs, every algorithm: each decision equals the one
    the memory store gives the same checks one after the other, in arrival order."""
    clock = FakeClock(1_000_000.25)
    costs = [1.0, 2.0, 0.5, 3.0, 1.0, 0.0, 5.0, 1.0]
    for name in ALGORITHMS:
        limit = Limit(Rate(17, 10.0, 5 if name.startswith("token") else None), name)
        key = _key("seq", limit)
        store = MemcachedStore(memcached_server.url, clock=clock, cache=False, timeout=GENEROUS)
        memory = MemoryStore(clock=clock)
        counts = _count_commands(store)
        try:
            for _ in range(3):
                batch = [costs[i % len(costs)] for i in range(25)]
                got = await asyncio.gather(*(store.hit([key], [limit], [c]) for c in batch))
                want = [await memory.hit([key], [limit], [c]) for c in batch]
                assert got == want, name
                assert [(g.reset_after, g.retry_after) for g in got] == [(w.reset_after, w.retry_after) for w in want]
                clock.advance(1.3)
            assert counts["gets"] <= 6, (name, counts)
        finally:
            await store.reset([key])
            await store.close()


async def test_over_the_limit_costs_no_round_trip_until_its_retry_time(memcached_server: Memcached) -> None:
    clock = FakeClock(2_000_000.5)
    for name in ALGORITHMS:
        limit = Limit(Rate(5, 10.0), name)
        key = _key("cache", limit)
        store = MemcachedStore(memcached_server.url, clock=clock, timeout=GENEROUS)
        memory = MemoryStore(clock=clock)
        counts = _count_commands(store)
        try:
            for _ in range(5):
                assert (await store.hit([key], [limit], [1.0])).allowed
                await memory.hit([key], [limit], [1.0])
            denied = await store.hit([key], [limit], [1.0])
            assert denied == await memory.hit([key], [limit], [1.0]) and not denied.allowed
            sent = dict(counts)
            for step in range(4):
                clock.advance(denied.retry_after / 5)
                cached = store.cached_rejection([key], [1.0])
                assert cached is not None and cached == await memory.hit([key], [limit], [1.0]), (name, step)
                assert abs(cached.retry_after - (await memory.hit([key], [limit], [1.0])).retry_after) < 1e-9
                again = await store.hit([key], [limit], [1.0])
                assert again == cached
            assert counts == sent, name  # no round trip
            assert store.cached_rejections == 8
            assert store.cached_rejection([key], [2.0]) is None  # another cost: not known
            clock.advance(denied.retry_after / 5 + 1e-6)  # its retry time has come
            assert store.cached_rejection([key], [1.0]) is None
            assert (await store.hit([key], [limit], [1.0])).allowed == (await memory.hit([key], [limit], [1.0])).allowed
            assert counts != sent
        finally:
            await store.reset([key])
            await store.close()


async def test_the_cache_forgets_a_key_it_resets_or_refunds(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, timeout=GENEROUS)
    limit = Limit(Rate(2, 60), "fixed_window")
    key = _key("forget", limit)
    try:
        for _ in range(3):
            await store.hit([key], [limit], [1.0])
        assert store.cached_rejection([key], [1.0]) is not None
        await store.adjust([key], [limit], [-1.0])
        assert store.cached_rejection([key], [1.0]) is None
        assert (await store.hit([key], [limit], [1.0])).allowed
        assert not (await store.hit([key], [limit], [1.0])).allowed
        await store.reset([key])
        assert store.cached_rejection([key], [1.0]) is None
        assert (await store.hit([key], [limit], [1.0])).allowed
    finally:
        await store.reset([key])
        await store.close()


async def test_a_multi_key_denial_is_cached_as_the_store_combines_it(memcached_server: Memcached) -> None:
    clock = FakeClock(3_000_000.0)
    store = MemcachedStore(memcached_server.url, clock=clock, timeout=GENEROUS)
    memory = MemoryStore(clock=clock)
    limits = [Limit(Rate(3, 10.0), "sliding_window"), Limit(Rate(10, 100.0), "gcra")]
    tag = uuid.uuid4().hex
    keys = [f"rw:{{multi|{tag}}}:{limit.suffix}" for limit in limits]
    try:
        for _ in range(4):
            got = await store.hit(keys, limits, [1.0, 1.0])
            assert got == await memory.hit(keys, limits, [1.0, 1.0])
        assert not got.allowed
        clock.advance(1.0)
        cached = store.cached_rejection(keys, [1.0, 1.0])
        assert cached == await memory.hit(keys, limits, [1.0, 1.0])
        assert store.cached_rejection(keys[:1], [1.0]) is not None  # the denied key alone
        assert store.cached_rejection(keys[1:], [1.0]) is None  # the other one allows
        assert (await store.hit(keys[1:], limits[1:], [1.0])).allowed  # and is forgotten once written
        await memory.hit(keys[1:], limits[1:], [1.0])
        assert store.cached_rejection(keys, [1.0, 1.0]) is None
        assert await store.hit(keys, limits, [1.0, 1.0]) == await memory.hit(keys, limits, [1.0, 1.0])
    finally:
        await store.reset(keys)
        await store.close()


async def test_a_cancelled_caller_leaves_its_batch_exact(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, cache=False, timeout=GENEROUS)
    limit = Limit(Rate(50, 3600), "fixed_window")
    key = _key("cancel", limit)
    try:
        tasks = [asyncio.ensure_future(store.hit([key], [limit], [1.0])) for _ in range(40)]
        for task in tasks[::3]:
            task.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        answered = [d for d in done if not isinstance(d, BaseException)]
        assert len(answered) == 26
        remaining = (await store.peek([key], [limit]))[0].remaining
        assert remaining == 50 - 26  # those cancelled before their batch charged nothing
        assert store._queues == {} and store._locks == {}
    finally:
        await store.reset([key])
        await store.close()
