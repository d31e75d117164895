"""Checks cancelled at random points (a client disconnecting, a timeout) on real servers: no lock
left held, no connection out of step, no unit charged twice, and exact results afterwards."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import pytest

from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import StoreError
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.redis import RedisStore
from tests.servers import Memcached, RedisStandalone
from tests.stores.helpers import make_store

ROUNDS = 80


@pytest.fixture(params=["redis", "redis-no-coalesce", "memcached"])
def store_url(request: pytest.FixtureRequest) -> tuple[str, str, dict[str, Any]]:
    if request.param == "memcached":
        server: Memcached = request.getfixturevalue("memcached_server")
        return "memcached", server.url, {}
    redis: RedisStandalone = request.getfixturevalue("redis_standalone")
    return "redis", redis.url, {"coalesce": request.param == "redis"}


@pytest.mark.parametrize("seed", [1, 2])
async def test_checks_cancelled_at_random_points(store_url: tuple[str, str, dict[str, Any]], seed: int) -> None:
    kind, url, options = store_url
    store = make_store(kind, url, **options)
    rng = random.Random(seed)
    tag = uuid.uuid4().hex
    # Distinct limits per key, so a reply read for the wrong key shows in its `limit`.
    singles = [(f"rw:{{c{n}|{tag}}}:k", Limit(Rate(1000 + n, 3600), "fixed_window")) for n in range(4)]
    pair_limits = [Limit(Rate(2000, 3600), "fixed_window"), Limit(Rate(2001, 3600), "fixed_window")]
    pair_keys = [f"rw:{{p0|{tag}}}:k", f"rw:{{p1|{tag}}}:k"]
    answered: Counter[str] = Counter()
    attempted: Counter[str] = Counter()

    def launch() -> tuple[str, list[str], list[Limit], asyncio.Task[Decision]]:
        if rng.random() < 0.3:
            return "pair", pair_keys, pair_limits, asyncio.ensure_future(store.hit(pair_keys, pair_limits, [1.0, 1.0]))
        key, limit = rng.choice(singles)
        return key, [key], [limit], asyncio.ensure_future(store.hit([key], [limit], [1.0]))

    try:
        for _ in range(ROUNDS):
            # Interrupted by the store's own timeout too, at random points (a few ms on loopback).
            store.timeout = rng.choice([5.0, rng.uniform(0.0003, 0.004)])  # type: ignore[attr-defined]
            checks = [launch() for _ in range(rng.randint(1, 12))]
            for name, *_ in checks:
                attempted[name] += 1
            for _ in range(rng.randint(0, 4)):  # cancel after a random number of loop passes
                await asyncio.sleep(0)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.002))
            for *_, task in rng.sample(checks, rng.randint(0, len(checks))):
                task.cancel()
            for name, _keys, limits, task in checks:
                try:
                    decision = await task
                except (asyncio.CancelledError, StoreError):
                    continue
                assert decision.allowed
                assert decision.limit in {limit.rate.limit for limit in limits}  # its own key's reply
                answered[name] += 1
        store.timeout = 5.0  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)  # writes of cancelled checks still in flight (redis) land
        if isinstance(store, MemcachedStore):
            # Batches whose callers left, and the put-backs of interrupted writes, finish (a put-back
            # tries a failed command again, so it may outlast any fixed wait; it holds its keys).
            await asyncio.wait_for(asyncio.gather(*store._leaders, *store._undoing, return_exceptions=True), 20)
        peeked = await store.peek([k for k, _ in singles] + pair_keys, [lim for _, lim in singles] + pair_limits)
        charged = {key: lim.rate.limit - d.remaining for (key, lim), d in zip(singles, peeked, strict=False)}
        pair_charged = [lim.rate.limit - d.remaining for lim, d in zip(pair_limits, peeked[-2:], strict=True)]
        assert pair_charged[0] == pair_charged[1]  # all or nothing, cancellations included
        charged["pair"] = pair_charged[0]
        for name, count in charged.items():
            # every answered check charged once; a cancelled one at most once
            assert answered[name] <= count <= attempted[name], (name, answered[name], count, attempted[name])
        # Exact afterwards: each next check sees precisely what is stored.
        for (key, limit), _ in zip(singles, range(4), strict=False):
            decision = await store.hit([key], [limit], [1.0])
            assert decision.remaining == limit.rate.limit - charged[key] - 1
        fresh = Limit(Rate(10, 3600), "fixed_window")
        fresh_key = f"rw:{{fresh|{tag}}}:k"
        results = await asyncio.gather(*(store.hit([fresh_key], [fresh], [1.0]) for _ in range(25)))
        assert sum(d.allowed for d in results) == 10
        if isinstance(store, MemcachedStore):
            assert store._locks == {}  # no lock left held
        if isinstance(store, RedisStore):
            assert store._pipeline.inflight == 0 and store._pipeline.batch is None
    finally:
        await store.close()


async def test_a_connect_cancelled_at_any_step_ends_cancelled(redis_standalone: RedisStandalone) -> None:
    """A pipeline's task is cancelled by its timer; a connect that swallowed that cancellation
    (``asyncio.wait_for`` on a future already done does, before Python 3.12) ran on with nobody
    waiting, and the soak saw such tasks garbage-collected while pending."""
    from ratewarden.stores.redis.client import new_connection

    store = RedisStore(redis_standalone.url)
    try:
        for steps in range(12):
            conn = new_connection(store._client)
            task = asyncio.ensure_future(conn.connect())
            for _ in range(steps):
                await asyncio.sleep(0)
            cancelled = task.cancel()
            try:
                await task
                ended = "returned"
            except asyncio.CancelledError:
                ended = "cancelled"
            finally:
                await conn.disconnect()
            if cancelled:
                assert ended == "cancelled", f"cancelled after {steps} loop steps, the connect {ended}"
    finally:
        await store.close()
