"""Limiter: hit/peek/reset (async and sync), several rates, costs, and awkward keys."""

from __future__ import annotations

import asyncio
import math

import pytest

from ratewarden import Limiter, MemoryStore, Rate
from ratewarden.algorithms import ALGORITHMS
from ratewarden.limiter import MAX_KEY_LENGTH, safe_key, storage_key
from tests.vectors.runner import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(MemoryStore(clock=clock))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_hit_peek_reset(limiter: Limiter, algorithm: str) -> None:
    for expected in (2, 1, 0):
        decision = await limiter.hit("alice", "3/min", algorithm=algorithm)
        assert decision.allowed and decision.remaining == expected and decision.limit == 3
    denied = await limiter.hit("alice", "3/min", algorithm=algorithm)
    assert not denied.allowed and denied.retry_after > 0
    assert (await limiter.peek("alice", "3/min", algorithm=algorithm)).remaining == 0
    assert (await limiter.peek("bob", "3/min", algorithm=algorithm)).remaining == 3
    # Another algorithm or rate is a separate counter.
    assert (await limiter.hit("alice", "4/min", algorithm=algorithm)).allowed
    await limiter.reset("alice", "3/min", algorithm=algorithm)
    assert (await limiter.peek("alice", "3/min", algorithm=algorithm)).remaining == 3
    assert (await limiter.hit("alice", "3/min", algorithm=algorithm)).remaining == 2


def test_sync_equivalents(limiter: Limiter) -> None:
    assert limiter.hit_sync("k", "2/min").remaining == 1
    assert limiter.hit_sync("k", "2/min").remaining == 0
    assert not limiter.hit_sync("k", "2/min").allowed
    assert limiter.peek_sync("k", "2/min").remaining == 0
    limiter.reset_sync("k", "2/min")
    assert limiter.peek_sync("k", "2/min").remaining == 2
    limiter.hit_sync("k", "2/min")
    limiter.clear_sync()
    assert limiter.peek_sync("k", "2/min").remaining == 2


async def test_time_moves_the_window(limiter: Limiter, clock: FakeClock) -> None:
    assert (await limiter.hit("k", "1/min")).allowed
    denied = await limiter.hit("k", "1/min")
    assert denied.retry_after == pytest.approx(60.0)
    clock.advance(59.9)
    assert not (await limiter.hit("k", "1/min")).allowed
    clock.advance(0.1)
    assert (await limiter.hit("k", "1/min")).allowed


async def test_several_rates_are_all_or_nothing(limiter: Limiter) -> None:
    rates = "10/s; 3/min"
    for _ in range(3):
        assert (await limiter.hit("k", rates)).allowed
    denied = await limiter.hit("k", rates)
    assert not denied.allowed and denied.limit == 3
    # The per-second limit was charged only by the three admitted requests.
    assert (await limiter.peek("k", "10/s")).remaining == 7
    assert (await limiter.peek("k", ["10/s", "3/min"])).remaining == 0


async def test_costs(limiter: Limiter) -> None:
    assert (await limiter.hit("k", "10/min", cost=4)).remaining == 6
    assert (await limiter.hit("k", "10/min", cost=6)).remaining == 0
    assert not (await limiter.hit("k", "10/min", cost=1)).allowed
    never = await limiter.hit("other", "10/min", cost=11)
    assert not never.allowed and math.isinf(never.retry_after)
    assert (await limiter.hit("free", "1/min", cost=0)).allowed
    with pytest.raises(ValueError, match="cost"):
        await limiter.hit("k", "10/min", cost=-1)
    with pytest.raises(ValueError, match="cost"):
        limiter.hit_sync("k", "10/min", cost=float("nan"))


async def test_rate_objects_and_burst(limiter: Limiter) -> None:
    rate = Rate(1, 1.0, burst=5)
    admitted = [(await limiter.hit("k", rate, algorithm="gcra")).allowed for _ in range(7)]
    assert admitted == [True] * 5 + [False] * 2


async def test_bad_arguments_fail_loudly(limiter: Limiter) -> None:
    with pytest.raises(ValueError, match="fortnight"):
        await limiter.hit("k", "1/fortnight")
    with pytest.raises(ValueError, match="unknown algorithm"):
        await limiter.hit("k", "1/s", algorithm="magic")
    with pytest.raises(ValueError, match="on_error"):
        Limiter(on_error="maybe")  # type: ignore[arg-type]


async def test_scopes_separate_counters(limiter: Limiter) -> None:
    assert (await limiter.hit("k", "1/min", namespace="a")).allowed
    assert (await limiter.hit("k", "1/min", namespace="b")).allowed
    assert not (await limiter.hit("k", "1/min", namespace="a")).allowed


async def test_oversized_keys_are_bounded_and_distinct(limiter: Limiter) -> None:
    long_a = "a" * 100_000
    long_b = "a" * 99_999 + "b"
    keys = limiter.keys_for(long_a, limiter.limits("1/min"))
    assert len(keys[0]) < MAX_KEY_LENGTH + 100
    assert (await limiter.hit(long_a, "1/min")).allowed
    assert (await limiter.hit(long_b, "1/min")).allowed  # a different key, not a hash clash
    assert not (await limiter.hit(long_a, "1/min")).allowed


@pytest.mark.parametrize("key", ["a}b", "a{b", "{x}", "}}}{{{", "x|y", "é😀", "a\x00b"])
async def test_brace_and_odd_keys_keep_one_hash_tag(limiter: Limiter, key: str) -> None:
    stored = limiter.keys_for(key, limiter.limits("1/min"))[0]
    assert stored.count("{") == 1 and stored.count("}") == 1
    assert stored.index("{") < stored.index("}")
    assert (await limiter.hit(key, "1/min")).allowed
    assert not (await limiter.hit(key, "1/min")).allowed


async def test_brace_keys_do_not_collide(limiter: Limiter) -> None:
    assert safe_key("a}b") != safe_key("a{b")
    assert (await limiter.hit("a}b", "1/min")).allowed
    assert (await limiter.hit("a{b", "1/min")).allowed
    assert (await limiter.hit("ab", "1/min")).allowed


def test_storage_key_shape() -> None:
    assert storage_key("rw", "api", "1.2.3.4") == "rw:{api|1.2.3.4}"
    limiter = Limiter(MemoryStore(), prefix="app")
    keys = limiter.keys_for("u", limiter.limits("10/s; 5/min", "gcra"), "s")
    assert keys == ["app:{s|u}:gcra:10/1000", "app:{s|u}:gcra:5/60000"]


async def test_disabled_limiter_flag_and_default_store() -> None:
    limiter = Limiter()
    assert isinstance(limiter.store, MemoryStore)
    assert limiter.enabled and limiter.on_error == "open"


async def test_sync_facade_works_inside_a_running_loop() -> None:
    limiter = Limiter(MemoryStore())
    assert limiter.hit_sync("k", "1/min").allowed
    assert limiter.peek_sync("k", "1/min").remaining == 0
    limiter.reset_sync("k", "1/min")
    assert limiter.peek_sync("k", "1/min").remaining == 1
    limiter.clear_sync()
    await asyncio.sleep(0)
