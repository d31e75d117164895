"""``WSGIPolicyMiddleware`` on Redis and Memcached, called directly (PEP 3333): bans (a ban after N
rejections, read back by another worker, lifted by ``unblock``, ended by expiry) and ``charge``
rules run on the stores' synchronous clients (``*_blocking``); stores that truly cannot are still
refused at start-up."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import pytest

from ratewarden import Limiter
from ratewarden.charges import Charge
from ratewarden.decision import Decision
from ratewarden.errors import ConfigurationError
from ratewarden.limits import Limit
from ratewarden.policy import Bans, PolicyRule, WSGIPolicyMiddleware
from ratewarden.stores.base import Store
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from tests.policy.test_wsgi_policy import call, hello, statuses

_T = TypeVar("_T")
# A day's window: no test here may see its window end (one sleeps 1.2 s; a minute's fixed window
# ended inside it in about 2% of runs).
API = [PolicyRule("/api/**", "1/day", name="api")]


class Remote:
    """A limiter on a remote store, with one event loop for the admin coroutines and the close."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.limiter = Limiter(store, prefix=f"t{uuid.uuid4().hex[:8]}")
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[_T]) -> _T:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self.limiter.close())
        self.loop.close()


@pytest.fixture(params=["redis", "memcached"])
def remote(request: pytest.FixtureRequest) -> Iterator[Remote]:
    if request.param == "redis":
        store: Store = RedisStore(request.getfixturevalue("redis_standalone").url, timeout=0.5)
    else:
        store = MemcachedStore(request.getfixturevalue("memcached_server").url, timeout=0.5)
    made = Remote(store)
    yield made
    made.close()


def test_a_ban_after_n_rejections_is_shared_and_lifted(remote: Remote) -> None:
    bans = Bans(after=3, within=60, duration=120)
    app = WSGIPolicyMiddleware(hello, remote.limiter, API, bans=bans)
    assert statuses(app, "/api/x", 4) == [200, 429, 429, 429]  # the third rejection bans
    status, headers, body = call(app, "/api/x")
    assert status == 403 and headers["retry-after"] == "120" and b"blocked for 120s" in body
    assert call(app, "/api/x", ip="10.0.0.2")[0] == 200  # another client
    bans._cache.clear()  # another worker: reads the ban back from the store
    assert 119 < bans.check_blocking(remote.limiter, "10.0.0.1") <= 120
    other = WSGIPolicyMiddleware(hello, remote.limiter, API, bans=Bans(after=3, within=60, duration=120))
    assert call(other, "/api/x")[0] == 403  # a second app (worker) on the same store
    remote.run(app.unblock("10.0.0.1"))  # the admin calls are the ASGI middleware's coroutines
    assert call(app, "/api/x")[0] == 429  # the day's limit again, not the ban
    assert bans.check_blocking(remote.limiter, "10.0.0.1") == 0


def test_a_ban_ends_when_it_expires(remote: Remote) -> None:
    bans = Bans(after=2, within=60, duration=1, cache_for=0)
    app = WSGIPolicyMiddleware(hello, remote.limiter, API, bans=bans)
    assert statuses(app, "/api/x", 4) == [200, 429, 429, 403]
    assert call(app, "/api/x")[1]["retry-after"] == "1"
    time.sleep(1.2)
    assert statuses(app, "/api/x", 3) == [429, 429, 403]  # over the limit still: two more rejections ban again


def test_an_admin_block_is_seen_by_the_wsgi_app(remote: Remote) -> None:
    bans = Bans(after=5, within=60, duration=60, cache_for=0)
    app = WSGIPolicyMiddleware(hello, remote.limiter, API, bans=bans)
    assert bans.block_blocking(remote.limiter, "10.0.0.7", 30) == 30
    assert call(app, "/api/x", ip="10.0.0.7")[0] == 403
    assert bans.block_blocking(remote.limiter, "10.0.0.7", 10) > 29  # a longer ban stays in force
    remote.run(bans.unblock(remote.limiter, "10.0.0.7"))
    assert call(app, "/api/x", ip="10.0.0.7")[0] == 200


def test_a_charge_rule_refunds_statuses_that_do_not_count(remote: Remote) -> None:
    rules = [PolicyRule("/login", "2/day", methods=["POST"], charge=Charge([401]), name="login")]
    app = WSGIPolicyMiddleware(hello, remote.limiter, rules)
    assert statuses(app, "/login", 5, method="POST") == [200] * 5  # successes are refunded
    assert statuses(app, "/login", 3, method="POST", query="status=401") == [401, 401, 429]
    assert call(app, "/login", method="POST", ip="10.0.0.9")[0] == 200  # another client


def test_bans_and_charges_through_a_breaker(remote: Remote) -> None:
    limiter = Limiter(Breaker(remote.store, fallback=MemoryStore()), prefix=remote.limiter.prefix)
    rules = [*API, PolicyRule("/login", "1/day", methods=["POST"], charge=Charge([401]), name="login")]
    app = WSGIPolicyMiddleware(hello, limiter, rules, bans=Bans(after=1, within=60, duration=60))
    assert statuses(app, "/login", 3, method="POST") == [200] * 3
    assert statuses(app, "/api/x", 3) == [200, 429, 403]


class _SyncHitOnly:
    """A remote store that can adjust and answers checks synchronously, but has no other
    synchronous method."""

    can_adjust = True

    def __init__(self) -> None:
        self.memory = MemoryStore()

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.memory.peek_now(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        self.memory.reset_now(keys)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.memory.adjust_now(keys, limits, amounts)


@pytest.mark.parametrize("wrap", [lambda s: s, lambda s: Breaker(s, fallback=MemoryStore())], ids=["bare", "breaker"])
def test_stores_that_cannot_are_still_refused(wrap: Callable[[Store], Store]) -> None:
    limiter = Limiter(wrap(_SyncHitOnly()), fallback=None)
    assert call(WSGIPolicyMiddleware(hello, limiter, API), "/api/x")[0] == 200  # checks: fine
    with pytest.raises(ConfigurationError, match=r"bans .*peek_blocking, reset_blocking; .* has no such method"):
        WSGIPolicyMiddleware(hello, limiter, API, bans=Bans(after=2))
    charged = [PolicyRule("/login", "1/day", charge=Charge([401]), name="login")]
    with pytest.raises(ConfigurationError, match=r"rule 'login' .*needs adjust_blocking; .* has none"):
        WSGIPolicyMiddleware(hello, limiter, charged)
