"""Bans are shared by every worker using the same store: two ``PolicyMiddleware`` instances
("workers", each with its own ``Bans``) on one MemoryStore, and on one real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.keys import header, header_key
from ratewarden.policy import PolicyMiddleware
from ratewarden.policy.bans import Bans
from ratewarden.stores.base import Store
from tests.servers import RedisStandalone

from ..policy.apps import build_app, client


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000.0

    def __call__(self) -> float:
        return self.now


def _workers(store: Store, prefix: str, clock: Clock | None = None, cache_for: float = 1.0) -> list[PolicyMiddleware]:
    """Two workers: separate middleware, limiter and ban cache, one shared store."""
    out = []
    for _ in range(2):
        options = {} if clock is None else {"clock": clock}
        bans = Bans(after=3, within=60, duration=100, growth=2.0, status=403, key=header("X-Client"),
                    cache_for=cache_for, **options)  # type: ignore[arg-type]
        rules = [Rule("/api/**", "2/min", key=header("X-Client"), name="api")]
        out.append(PolicyMiddleware(build_app(), Limiter(store, prefix=prefix), rules, bans=bans))
    return out


async def _get(worker: PolicyMiddleware, who: str) -> int:
    async with client(worker) as http:
        return (await http.get("/api/x", headers={"X-Client": who})).status_code


async def test_a_ban_from_one_worker_holds_in_the_other_memory() -> None:
    clock = Clock()
    a, b = _workers(MemoryStore(clock=clock), "rw", clock)
    # Limit and strikes are shared: rejections seen by either worker add up to the ban.
    assert [await _get(w, "bad") for w in (a, a, a, b, a)] == [200, 200, 429, 429, 429]
    assert b.bans is not None and b.bans.banned_for(header_key("X-Client", "bad")) == 0  # b never saw the ban...
    assert await _get(b, "bad") == 403  # ...and enforces it from the store
    assert 99 < b.bans.banned_for(header_key("X-Client", "bad")) <= 100
    assert await _get(a, "good") == 200 and await _get(b, "good") == 200
    # After it ends, a second offence counted by the other worker doubles the ban.
    clock.now += 101
    assert [await _get(b, "bad") for _ in range(6)] == [200, 200, 429, 429, 429, 403]
    assert await _get(a, "bad") == 403
    assert a.bans is not None and 199 < a.bans.banned_for(header_key("X-Client", "bad")) <= 200
    # Explicit block and unblock, from either side.
    await b.block(header_key("X-Client", "mallory"), 30)
    assert await _get(a, "mallory") == 403
    await b.unblock(header_key("X-Client", "mallory"))
    assert await _get(a, "mallory") == 403  # a's cache still holds it...
    clock.now += 1.01
    assert await _get(a, "mallory") == 200  # ...for at most cache_for seconds


async def test_a_ban_from_one_worker_holds_in_the_other_redis(redis_standalone: RedisStandalone) -> None:
    from ratewarden.stores.redis import RedisStore

    prefix = f"bans{uuid.uuid4().hex[:8]}"
    stores = [RedisStore(redis_standalone.url, timeout=5, prefix=prefix) for _ in range(2)]
    a = _workers(stores[0], prefix, cache_for=0.2)[0]
    b = _workers(stores[1], prefix, cache_for=0.2)[1]
    try:
        assert [await _get(w, "bad") for w in (a, a, b, a, b)] == [200, 200, 429, 429, 429]
        assert b.bans is not None and 90 < b.bans.banned_for(header_key("X-Client", "bad")) <= 100  # b's strike banned
        assert a.bans is not None and a.bans.banned_for(header_key("X-Client", "bad")) == 0
        r = [await _get(a, "bad") for _ in range(3)]
        assert r == [403, 403, 403]
        assert 90 < a.bans.banned_for(header_key("X-Client", "bad")) <= 100
        assert await _get(a, "good") == 200
        await a.block(header_key("X-Client", "mallory"), 60)
        assert await _get(b, "mallory") == 403
        await a.unblock(header_key("X-Client", "mallory"))
        await asyncio.sleep(0.25)
        assert await _get(b, "mallory") == 200
    finally:
        for store in stores:
            await store.clear()
            await store.close()


async def test_the_ban_check_fails_open_on_a_broken_store() -> None:
    class Broken(MemoryStore):  # a local store: the ban check reads it with peek_now
        def peek_now(self, keys, limits):  # type: ignore[no-untyped-def]
            raise OSError("down")

    (worker, _) = _workers(Broken(), "rw")
    assert await _get(worker, "someone") == 200


async def test_no_ban_read_without_bans() -> None:
    reads = 0

    class Counting(MemoryStore):  # a local store: the ban check reads it with peek_now
        def peek_now(self, keys, limits):  # type: ignore[no-untyped-def]
            nonlocal reads
            reads += 1
            return super().peek_now(keys, limits)

    plain = PolicyMiddleware(build_app(), Limiter(Counting()), [Rule("/api/**", "5/min", name="api")])
    assert [await _get(plain, "c") for _ in range(3)] == [200, 200, 200]
    assert reads == 0
    (banned, _) = _workers(Counting(), "rw")
    async with client(banned) as http:
        assert (await http.get("/open")).status_code == 200  # no rule matches: no ban read
    assert reads == 0
    assert await _get(banned, "c") == 200
    assert reads == 1


@pytest.mark.parametrize("bad", [{"cache_for": -1}, {"after": 0}])
def test_bad_settings_are_named(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Bans(**bad)  # type: ignore[arg-type]


def test_policy_file_sets_the_ban_cache() -> None:
    from ratewarden.policy import PolicyError, parse_policy

    policy = parse_policy('[bans]\nafter = 3\nduration = "10m"\ncache_for = "250ms"\n[[rules]]\npath = "/**"\nrate = "1/s"\n')
    assert policy.bans is not None and policy.bans.cache_for == 0.25 and policy.bans.duration == 600
    with pytest.raises(PolicyError, match="cache_for"):
        parse_policy('[bans]\ncache_for = "soon"\n[[rules]]\npath = "/**"\nrate = "1/s"\n')
