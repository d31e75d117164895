"""``Store.peek_blocking``, ``reset_blocking`` and ``adjust_blocking``: the synchronous peek, reset and
adjust (WSGI apps, threads) on every store that has them - a local store's ``*_now``, ``RedisStore``'s
and ``MemcachedStore``'s own synchronous clients - agree with the async ones on the same keys,
alternating; ``Breaker`` delegates them through its states; ``can_block`` tells who can."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import pytest

from ratewarden.decision import Decision
from ratewarden.errors import ConfigurationError
from ratewarden.limits import Limit, make_limits
from ratewarden.stores.adapted import as_store
from ratewarden.stores.base import Store, StoreError
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.protocols import BlockingStore, LocalStore
from ratewarden.stores.redis import RedisStore
from tests.shm import shm_store

KINDS = ["memory", "shm", "redis", "valkey", "redis_cluster", "memcached"]
ALGORITHMS = ["fixed_window", "sliding_window", "gcra", "token_bucket"]


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    kind = request.param
    made: Store
    if kind == "memory":
        made = MemoryStore()
    elif kind == "shm":
        made = shm_store()
    elif kind == "redis":
        made = RedisStore(request.getfixturevalue("redis_standalone").url, timeout=0.5)
    elif kind == "valkey":
        made = RedisStore(request.getfixturevalue("valkey_standalone").url, timeout=0.5)
    elif kind == "redis_cluster":
        made = RedisStore(request.getfixturevalue("redis_cluster").url, timeout=0.5)
    else:
        made = MemcachedStore(request.getfixturevalue("memcached_server").url, timeout=0.5)
    yield made
    await made.close()


def _key(limit: Limit) -> str:
    return f"rw:{{ops|{uuid.uuid4().hex}}}:{limit.suffix}"


def _left(decisions: Sequence[Decision]) -> list[tuple[bool, int]]:
    return [(d.allowed, d.remaining) for d in decisions]


def test_every_store_with_a_synchronous_client_can_block(store: Store) -> None:
    assert store.can_block("hit", "peek", "reset", "adjust")
    assert Breaker(store).can_block("hit", "peek", "reset", "adjust")
    assert Breaker(store, fallback=MemoryStore()).can_block("peek", "reset")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_peek_agrees_with_the_async_peek(store: Store, algorithm: str) -> None:
    (limit,) = make_limits("10/hour", algorithm)
    key = _key(limit)
    assert _left(store.peek_blocking([key], [limit])) == [(True, 10)]
    for _ in range(3):
        store.hit_blocking([key], [limit], [1.0])
    (sync,) = store.peek_blocking([key], [limit])
    (async_,) = await store.peek([key], [limit])
    assert (sync.allowed, sync.remaining, sync.limit, sync.policy) == (async_.allowed, async_.remaining, 10, limit.name)
    assert sync.remaining == 7 and abs(sync.reset_after - async_.reset_after) < 1.0
    await store.hit([key], [limit], [1.0])
    assert _left(store.peek_blocking([key], [limit])) == [(True, 6)]  # the async charge, read synchronously


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_adjust_alternates_with_the_async_adjust(store: Store, algorithm: str) -> None:
    (limit,) = make_limits("10/hour", algorithm)
    key = _key(limit)
    for _ in range(5):
        store.hit_blocking([key], [limit], [1.0])
    assert _left(store.adjust_blocking([key], [limit], [-2.0])) == [(True, 7)]  # a refund
    assert _left(await store.adjust([key], [limit], [-1.0])) == [(True, 8)]
    assert _left(store.peek_blocking([key], [limit])) == [(True, 8)]
    assert store.adjust_blocking([key], [limit], [25.0])[0].remaining == 0  # a penalty stops at the limit
    assert (await store.peek([key], [limit]))[0].remaining == 0
    assert (await store.adjust([key], [limit], [-3.0]))[0].remaining == 3
    assert _left(store.adjust_blocking([key], [limit], [-50.0])) == [(True, 10)]  # never past the whole limit
    assert _left(await store.peek([key], [limit])) == [(True, 10)]
    assert store.adjust_blocking([], [], []) == []


async def test_reset_alternates_with_the_async_reset(store: Store) -> None:
    limits = make_limits("5/hour; 50/day", "fixed_window")
    keys = [_key(limit) for limit in limits]  # two slots on a cluster
    for _ in range(5):
        store.hit_blocking(keys, limits, [1.0, 1.0])
    assert not store.hit_blocking(keys, limits, [1.0, 1.0]).allowed
    store.reset_blocking(keys)
    assert _left(await store.peek(keys, limits)) == [(True, 5), (True, 50)]
    await store.hit(keys, limits, [2.0, 2.0])
    assert _left(store.peek_blocking(keys, limits)) == [(True, 3), (True, 48)]
    await store.reset(keys[:1])
    assert _left(store.peek_blocking(keys, limits)) == [(True, 5), (True, 48)]
    store.reset_blocking([])


async def test_multi_key_adjust_and_peek_agree(store: Store) -> None:
    limits = make_limits("10/min; 100/hour", "sliding_window")
    keys = [_key(limit) for limit in limits]
    store.hit_blocking(keys, limits, [4.0, 4.0])
    assert _left(store.adjust_blocking(keys, limits, [-1.0, 2.0])) == [(True, 7), (True, 94)]
    assert _left(await store.peek(keys, limits)) == _left(store.peek_blocking(keys, limits)) == [(True, 7), (True, 94)]


async def test_a_synchronous_reset_or_adjust_drops_cached_rejections(store: Store) -> None:
    (limit,) = make_limits("2/hour", "fixed_window")
    key = _key(limit)
    for _ in range(3):
        await store.hit([key], [limit], [1.0])
    assert not (await store.hit([key], [limit], [1.0])).allowed  # remote stores: cached from here on
    store.reset_blocking([key])
    assert (await store.hit([key], [limit], [1.0])).allowed
    await store.hit([key], [limit], [1.0])
    assert not (await store.hit([key], [limit], [1.0])).allowed
    store.adjust_blocking([key], [limit], [-1.0])
    assert (await store.hit([key], [limit], [1.0])).allowed


async def test_a_breaker_delegates_and_falls_back(store: Store) -> None:
    (limit,) = make_limits("10/hour", "gcra")
    key = _key(limit)
    breaker = Breaker(store)
    breaker.hit_blocking([key], [limit], [3.0])
    assert _left(breaker.peek_blocking([key], [limit])) == [(True, 7)]
    assert _left(breaker.adjust_blocking([key], [limit], [-1.0])) == [(True, 8)]
    assert _left(await store.peek([key], [limit])) == [(True, 8)]
    breaker.reset_blocking([key])
    assert _left(await store.peek([key], [limit])) == [(True, 10)]


class _Remote:
    """A remote store of one's own with no synchronous client: ``AsyncStore`` alone."""

    def __init__(self) -> None:
        self.memory = MemoryStore()

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.memory.peek_now(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        self.memory.reset_now(keys)


class _SyncHit(_Remote):
    """``AsyncStore`` and ``BlockingHit``: synchronous checks, nothing else synchronous, no adjust."""

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)


def test_a_remote_store_without_a_synchronous_client_cannot_block() -> None:
    remote = as_store(_Remote())
    (limit,) = make_limits("1/s", "gcra")
    assert not remote.can_block("hit") and not remote.can_block("peek") and remote.can_block()
    assert not remote.supports("adjust") and not remote.supports("local")
    assert not Breaker(_Remote()).can_block("peek")
    assert not Breaker(MemoryStore(), fallback=_Remote()).can_block("reset")
    for call in (lambda: remote.peek_blocking(["k"], [limit]), lambda: remote.reset_blocking(["k"]),
                 lambda: remote.adjust_blocking(["k"], [limit], [1.0])):
        with pytest.raises(ConfigurationError, match=r"_Remote object .* has no (peek|reset|adjust)_blocking \(it does not implement stores\.protocols\.Blocking"):
            call()


def test_capabilities_are_the_protocols_a_store_implements() -> None:
    store = as_store(_SyncHit())
    assert store.can_block("hit") and not store.can_block("hit", "peek") and not store.can_block("adjust")
    assert type(store).__name__ == "_SyncHit"  # errors name the class of the store adapted
    assert as_store(store) is store and as_store(MemoryStore()).local
    assert isinstance(MemoryStore(), LocalStore) and isinstance(MemoryStore(), BlockingStore)
    assert not RedisStore("redis://127.0.0.1:1/0").supports("local")  # a Store's *_now are its blocking methods
    with pytest.raises(TypeError, match=r"store must be a ratewarden Store or None .*got object \(no hit, peek, reset\)"):
        as_store(object())  # type: ignore[arg-type]


def test_an_open_breaker_answers_from_its_fallback() -> None:
    (limit,) = make_limits("10/hour", "gcra")
    dead = RedisStore("redis://127.0.0.1:1/0", timeout=0.2, connect_timeout=0.2)
    fallback = MemoryStore()
    breaker = Breaker(dead, failures=1, cooldown=60, fallback=fallback)
    fallback.hit_now(["k"], [limit], [4.0])
    assert _left(breaker.peek_blocking(["k"], [limit])) == [(True, 6)]  # failed over: the fallback's
    assert breaker.state == "open"
    assert _left(breaker.adjust_blocking(["k"], [limit], [-1.0])) == [(True, 7)]  # short-circuited
    assert breaker.short_circuited == 1
    with pytest.raises(StoreError):
        breaker.reset_blocking(["k"])  # the fallback's, then the store's (as reset)
    assert _left(fallback.peek_now(["k"], [limit])) == [(True, 10)]


async def test_keys_limits_and_amounts_of_different_lengths_are_refused(store: Store) -> None:
    limits = make_limits("10/hour", "gcra")
    with pytest.raises(ValueError):
        await store.adjust(["a", "b"], limits, [1.0, 1.0])
    with pytest.raises(ValueError):
        store.adjust_blocking(["a", "b"], limits, [1.0, 1.0])
