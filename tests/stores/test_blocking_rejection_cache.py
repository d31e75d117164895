"""The rejection cache on the synchronous path (``hit_blocking`` on Redis and memcached): a key
exhausted through threads is answered from the cache without a server call, with the decision
shape the server gives, until its reset time; ``reset_blocking`` and ``adjust_blocking`` (and the
async ones) invalidate it; threads (and threads mixed with coroutines) stay exact with it on."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from ratewarden.limits import Limit, make_limits
from ratewarden.stores.base import Store
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.redis import RedisStore

_T = TypeVar("_T")
KINDS = ["redis", "memcached"]


@pytest.fixture(params=KINDS)
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Store]]:
    made: list[Store] = []
    if request.param == "redis":
        url = request.getfixturevalue("redis_standalone").url

        def build(**kw: Any) -> Store:
            made.append(RedisStore(url, timeout=0.5, **kw))
            return made[-1]
    else:
        url = request.getfixturevalue("memcached_server").url

        def build(**kw: Any) -> Store:
            made.append(MemcachedStore(url, timeout=0.5, **kw))
            return made[-1]
    yield build
    for store in made:
        await store.close()


def _calls(store: Store) -> list[str]:
    """Count the synchronous client's server calls (every one takes a turn of its pool)."""
    seen: list[str] = []
    if isinstance(store, RedisStore):
        client = store._blocking
        turn = client._turn

        def counting_turn(operation: str, command: Callable[[Any], _T]) -> _T:
            seen.append(operation)
            return turn(operation, command)

        client._turn = counting_turn  # type: ignore[method-assign]
    else:
        assert isinstance(store, MemcachedStore)
        take = store._sync_take

        def counting_take(keys: set[bytes], operation: str = "hit") -> Any:
            seen.append(operation)
            return take(keys, operation)

        store._sync_take = counting_take  # type: ignore[method-assign]
    return seen


def _key(limit: Limit) -> str:
    return f"rw:{{rc|{uuid.uuid4().hex}}}:{limit.suffix}"


def _flood(call: Callable[[], _T], threads: int) -> list[_T]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: call(), range(threads)))


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "gcra", "token_bucket"])
async def test_a_denied_key_is_answered_without_a_server_call(make_store: Callable[..., Store], algorithm: str) -> None:
    store = make_store()
    (limit,) = make_limits("3/hour", algorithm)
    key = _key(limit)
    calls = _calls(store)
    assert all(store.hit_blocking([key], [limit], [1.0]).allowed for _ in range(3))
    denied = store.hit_blocking([key], [limit], [1.0])  # the server's denial fills the cache
    assert not denied.allowed and len(calls) == 4
    before = store.cached_rejections
    again = [store.hit_blocking([key], [limit], [1.0]) for _ in range(20)]
    assert len(calls) == 4  # no round trip
    assert store.cached_rejections == before + 20
    for d in again:
        assert not d.allowed
        assert (d.limit, d.remaining, d.period, d.policy) == (denied.limit, denied.remaining, denied.period, denied.policy)
        assert 0 < d.retry_after <= denied.retry_after and d.reset_after <= denied.reset_after + 1e-6
    # the uncached store (another process) gives the same denial
    other = make_store(cache=False)
    fresh = other.hit_blocking([key], [limit], [1.0])
    assert not fresh.allowed
    assert (fresh.limit, fresh.remaining, fresh.policy) == (denied.limit, denied.remaining, denied.policy)
    assert abs(fresh.retry_after - again[-1].retry_after) < 1.0
    # the async path answers from what the threads filled
    assert store.cached_rejection([key], [1.0]) is not None
    # another cost is another entry: it goes to the server
    store.hit_blocking([key], [limit], [2.0])
    assert len(calls) == 5


async def test_after_the_reset_time_checks_go_to_the_server(make_store: Callable[..., Store]) -> None:
    store = make_store()
    (limit,) = make_limits("2/second", "fixed_window")
    key = _key(limit)
    calls = _calls(store)
    while store.hit_blocking([key], [limit], [1.0]).allowed:
        pass
    sent = len(calls)
    denied = store.hit_blocking([key], [limit], [1.0])
    assert not denied.allowed and len(calls) == sent
    time.sleep(denied.retry_after + 0.05)
    assert store.hit_blocking([key], [limit], [1.0]).allowed
    assert len(calls) == sent + 1


@pytest.mark.parametrize("operation", ["reset_blocking", "adjust_blocking", "reset", "adjust"])
async def test_reset_and_adjust_invalidate(make_store: Callable[..., Store], operation: str) -> None:
    store = make_store()
    (limit,) = make_limits("3/hour", "fixed_window")
    key = _key(limit)
    calls = _calls(store)
    while store.hit_blocking([key], [limit], [1.0]).allowed:
        pass
    assert store.cached_rejection([key], [1.0]) is not None
    if operation == "reset_blocking":
        store.reset_blocking([key])
    elif operation == "adjust_blocking":
        store.adjust_blocking([key], [limit], [-1.0])
    elif operation == "reset":
        await store.reset([key])
    else:
        await store.adjust([key], [limit], [-1.0])
    assert store.cached_rejection([key], [1.0]) is None
    sent = len(calls)
    assert store.hit_blocking([key], [limit], [1.0]).allowed
    assert len(calls) == sent + 1


async def test_a_denial_read_before_an_invalidation_is_not_remembered(make_store: Callable[..., Store]) -> None:
    store = make_store()
    (limit,) = make_limits("1/hour", "fixed_window")
    key = _key(limit)
    assert store.hit_blocking([key], [limit], [1.0]).allowed
    cache: Any = store._rejected if isinstance(store, RedisStore) else store._rejections  # type: ignore[attr-defined]
    epoch = cache.epoch  # a check takes it before its round trip
    denied = store.hit_blocking([key], [limit], [1.0])
    assert not denied.allowed
    store.reset_blocking([key])  # lands between that check's denying read and its fill
    assert cache.epoch != epoch
    if isinstance(store, RedisStore):
        cache.remember(key, 1.0, time.monotonic() + 60, denied, epoch, 0.0)
    else:
        cache.remember(key, 1.0, time.time() + 60, denied, epoch=epoch)
    assert store.cached_rejection([key], [1.0]) is None
    assert store.hit_blocking([key], [limit], [1.0]).allowed


async def test_150_threads_against_100_are_exactly_100(make_store: Callable[..., Store]) -> None:
    store = make_store()
    (limit,) = make_limits("100/hour", "gcra")
    key = _key(limit)
    decisions = _flood(lambda: [store.hit_blocking([key], [limit], [1.0]) for _ in range(2)], 150)
    flat = [d for pair in decisions for d in pair]
    assert sum(d.allowed for d in flat) == 100
    assert store.cached_rejections > 0  # the later denials came from the cache
    other = make_store(cache=False)
    assert not other.hit_blocking([key], [limit], [1.0]).allowed


async def test_threads_and_coroutines_on_one_key_stay_exact(make_store: Callable[..., Store]) -> None:
    store = make_store()
    (limit,) = make_limits("60/hour", "token_bucket")
    key = _key(limit)

    threads = asyncio.ensure_future(asyncio.to_thread(_flood, lambda: store.hit_blocking([key], [limit], [1.0]), 60))
    coros = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(60)))
    assert sum(d.allowed for d in await threads) + sum(d.allowed for d in coros) == 60
    later = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(10)))
    assert not any(d.allowed for d in later)
    for _ in range(5):
        assert not store.hit_blocking([key], [limit], [1.0]).allowed
    assert store.cached_rejections > 0
    # a refund through threads invalidates what the coroutines cached: exactly one more is allowed
    store.adjust_blocking([key], [limit], [-1.0])
    assert sum(store.hit_blocking([key], [limit], [1.0]).allowed for _ in range(3)) == 1
