"""``MemcachedStore.adjust`` (refunds and penalties) against a real memcached: it answers and
stores exactly what the memory store does, and concurrent adjustments from two connections lose
no update."""

from __future__ import annotations

import asyncio
import math
import random
import uuid

import pytest

from ratewarden.charges import adjust
from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.memory import MemoryStore
from tests.servers import Memcached
from tests.stores.helpers import ALGORITHM_NAMES


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.25

    def __call__(self) -> float:
        return self.now


def _same(a: Decision, b: Decision, what: str) -> None:
    assert (a.allowed, a.limit, a.remaining, a.policy) == (b.allowed, b.limit, b.remaining, b.policy), what
    assert math.isclose(a.reset_after, b.reset_after, abs_tol=1e-6), what
    assert a.retry_after == b.retry_after or math.isclose(a.retry_after, b.retry_after, abs_tol=1e-6), what


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_adjust_matches_the_memory_store(memcached_server: Memcached, algorithm: str) -> None:
    clock = Clock()
    memory = MemoryStore(clock=clock)
    remote = MemcachedStore(memcached_server.url, timeout=5, clock=clock)
    limits = [Limit(Rate(10, 60), algorithm, "minute"), Limit(Rate(30, 3600, burst=15), algorithm, "hour")]
    base = f"rw:{{adj|{uuid.uuid4().hex}}}"
    keys = [f"{base}:{limit.suffix}" for limit in limits]
    rng = random.Random(algorithm)
    ops: list[tuple[str, float]] = [("hit", 1), ("hit", 1), ("adjust", 3), ("adjust", -2), ("adjust", 50),
                                    ("hit", 1), ("adjust", -4), ("adjust", -100), ("adjust", -1), ("hit", 2)]
    ops += [(rng.choice(["hit", "adjust", "adjust", "wait"]), rng.choice([-3, -1, 1, 2, 5])) for _ in range(60)]
    try:
        for step, (op, amount) in enumerate(ops):
            what = f"{algorithm} step {step}: {op} {amount}"
            if op == "wait":
                clock.now += abs(amount) * 1.7
                continue
            if op == "hit":
                _same(await remote.hit(keys, limits, [amount] * 2), memory.hit_now(keys, limits, [amount] * 2), what)
            else:
                got = await adjust(remote, keys, limits, [amount] * 2)
                want = await adjust(memory, keys, limits, [amount] * 2)
                for g, w in zip(got, want, strict=True):
                    _same(g, w, what)
            for g, w in zip(await remote.peek(keys, limits), await memory.peek(keys, limits), strict=True):
                _same(g, w, f"{what} (peek)")
    finally:
        await remote.reset(keys)
        await remote.close()


async def test_a_full_refund_reads_as_an_untouched_key(memcached_server: Memcached) -> None:
    remote = MemcachedStore(memcached_server.url, timeout=5)
    limit = Limit(Rate(5, 60), "sliding_log")
    key = f"rw:{{adj|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        # Refunding a key that was never charged writes nothing.
        (decision,) = await remote.adjust([key], [limit], [-3])
        assert decision.remaining == 5 and await remote._client.get(key.encode()) is None
        for _ in range(5):
            assert (await remote.hit([key], [limit], [1])).allowed
        assert not (await remote.hit([key], [limit], [1])).allowed
        (decision,) = await remote.adjust([key], [limit], [-5])
        assert decision.remaining == 5
        assert [(await remote.hit([key], [limit], [1])).allowed for _ in range(6)] == [True] * 5 + [False]
        with pytest.raises(ValueError, match="same length"):
            await remote.adjust([key], [limit], [1, 2])
    finally:
        await remote.reset([key])
        await remote.close()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_log", "gcra", "token_bucket"])
async def test_concurrent_refunds_from_two_connections_lose_nothing(memcached_server: Memcached, algorithm: str) -> None:
    """Two stores (two connection pools, as two processes would have) refund one key at once:
    every refund lands, so the compare-and-swap retry works across clients."""
    a = MemcachedStore(memcached_server.url, timeout=10)
    b = MemcachedStore(memcached_server.url, timeout=10)
    limit = Limit(Rate(100, 3600), algorithm)
    key = f"rw:{{adj|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        # Whether the two clients race is up to the scheduler (their waits are jittered): each
        # round must lose nothing, and rounds go on until one of them did race (at most 5).
        for _ in range(5):
            await a.adjust([key], [limit], [100])  # penalty: exhausted
            assert (await a.peek([key], [limit]))[0].remaining == 0
            await asyncio.gather(*(store.adjust([key], [limit], [-1]) for store in (a, b) for _ in range(20)))
            # gcra and token bucket refill a little while this runs; never less than the refunds.
            remaining = (await a.peek([key], [limit]))[0].remaining
            assert 40 <= remaining <= 41, remaining
            if a.cas_conflicts + b.cas_conflicts > 0:
                break
        assert a.cas_conflicts + b.cas_conflicts > 0  # the two clients did race
    finally:
        await a.reset([key])
        await a.close()
        await b.close()
