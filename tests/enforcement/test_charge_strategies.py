"""``enforcement.charge_strategies``: each strategy on its own, on the memory store and on a real
Redis: all or nothing and each on its own admit exactly the limit under concurrency, shadow items
never refuse (nor apply the failure policy), quota items refuse only when every one is over."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from ratewarden.decision import Decision
from ratewarden.enforcement.charge_strategies import (
    ENFORCED,
    NONE,
    QUOTA,
    SHADOW,
    UNLIMITED,
    Item,
    charge_items,
    request_allowed,
)
from ratewarden.errors import LimitUnavailable, StoreError
from ratewarden.limiter import Limiter
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores import MemoryStore, RedisStore, Store

#: Mid-window, so no window ends during a test.
NOW = 1_000.5
L = 10
N = 40


def frozen() -> float:
    return NOW


def per_hour(n: int) -> Limit:
    return Limit(Rate(n, 3600.0), "fixed_window", name=f"{n}/h")


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Callable[[], Store]:
    if request.param == "memory":
        return lambda: MemoryStore(clock=frozen)
    url = request.getfixturevalue("redis_standalone").url
    return lambda: RedisStore(url, clock=frozen, timeout=5.0)  # a loaded machine must not turn an answer into a failure


@pytest.fixture
async def limiter(make_store: Callable[[], Store]) -> AsyncIterator[Limiter]:
    found = Limiter(make_store())
    try:
        yield found
    finally:
        await found.close()


@pytest.fixture
def key() -> Callable[[str], str]:
    """A test's own storage keys (the Redis server outlives the test)."""
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    return lambda name: prefix + name


async def request(limiter: Limiter, *items: Item, each: bool = False) -> bool:
    await charge_items(limiter, items, each)
    return request_allowed(items)


async def admitted(limiter: Limiter, build: Callable[[], list[Item]], each: bool = False) -> int:
    answers = await asyncio.gather(*(request(limiter, *build(), each=each) for _ in range(N)))
    return sum(answers)


async def left(limiter: Limiter, key: str, limit: Limit) -> float:
    return (await limiter.store.peek([key], [limit]))[0].remaining


async def test_all_or_nothing_admits_exactly_the_limit_and_charges_nothing_refused(limiter: Limiter, key: Callable[[str], str]) -> None:
    small, big = per_hour(L), per_hour(1000)
    assert await admitted(limiter, lambda: [Item(ENFORCED, key("small"), small), Item(ENFORCED, key("big"), big)]) == L
    assert await left(limiter, key("big"), big) == 1000 - L  # the refused requests charged neither counter


async def test_one_enforced_item_admits_exactly_the_limit(limiter: Limiter, key: Callable[[str], str]) -> None:
    assert await admitted(limiter, lambda: [Item(ENFORCED, key("one"), per_hour(L))]) == L


async def test_each_admits_exactly_the_limit_and_charges_the_refused_up_to_it(limiter: Limiter, key: Callable[[str], str]) -> None:
    small, big = per_hour(L), per_hour(1000)
    assert await admitted(limiter, lambda: [Item(ENFORCED, key("small"), small), Item(ENFORCED, key("big"), big)], each=True) == L
    assert await left(limiter, key("small"), small) == 0
    assert await left(limiter, key("big"), big) == 1000 - N  # each on its own: the refused requests charged it too
    item = Item(ENFORCED, key("small2"), small, cost=float(L - 3))
    assert await request(limiter, item, each=True) and item.decision is not None and item.decision.remaining == 3
    item = Item(ENFORCED, key("small2"), small, cost=5.0)
    assert not await request(limiter, item, each=True)
    assert item.left == 3 and item.decision is not None and item.decision.remaining == 0
    assert await left(limiter, key("small2"), small) == 0  # charged up to the limit


async def test_the_same_counter_twice_is_charged_once_for_both_costs(limiter: Limiter, key: Callable[[str], str]) -> None:
    limit = per_hour(L)
    first, second = Item(ENFORCED, key("twice"), limit, 2.0), Item(ENFORCED, key("twice"), limit, 3.0)
    assert await request(limiter, first, second)
    assert first.decision is second.decision and await left(limiter, key("twice"), limit) == L - 5


async def test_several_counters_each_say_their_own_and_the_over_one_is_named(limiter: Limiter, key: Callable[[str], str]) -> None:
    small, big = per_hour(2), per_hour(100)
    assert await request(limiter, Item(ENFORCED, key("a"), small, 2.0))
    a, b = Item(ENFORCED, key("a"), small), Item(ENFORCED, key("b"), big)
    assert not await request(limiter, a, b)
    assert a.decision is not None and b.decision is not None
    assert (a.decision.allowed, a.decision.remaining) == (False, 0)
    assert (b.decision.allowed, b.decision.remaining) == (True, 100)  # read, not charged
    assert await left(limiter, key("b"), big) == 100


async def test_an_enforced_limit_of_zero_refuses_and_charges_nothing(limiter: Limiter, key: Callable[[str], str]) -> None:
    limit = per_hour(L)
    zero, counted = Item(ENFORCED, zero=("blocked", 60)), Item(ENFORCED, key("c"), limit)
    assert not await request(limiter, zero, counted)
    assert zero.decision is not None and (zero.decision.allowed, zero.decision.policy, zero.decision.period) == (False, "blocked", 60.0)
    assert 0 < zero.decision.reset_after <= 60
    assert counted.decision is not None and counted.decision.allowed  # read, not charged
    assert await left(limiter, key("c"), limit) == L


async def test_shadow_never_refuses(limiter: Limiter, key: Callable[[str], str]) -> None:
    limit = per_hour(L)
    items = [[Item(SHADOW, key("watched"), limit)] for _ in range(N)]
    answers = await asyncio.gather(*(request(limiter, *found) for found in items))
    assert all(answers)
    over = [found[0] for found in items if found[0].decision is not None and not found[0].decision.allowed]
    assert len(over) == N - L  # counted: it would have refused the rest
    assert await request(limiter, Item(SHADOW, zero=("zero", 60)))  # a shadow limit of 0 neither


async def test_quota_refuses_only_when_every_quota_is_over(limiter: Limiter, key: Callable[[str], str]) -> None:
    one, three = per_hour(1), per_hour(3)
    assert await admitted(limiter, lambda: [Item(QUOTA, key("q1"), one), Item(QUOTA, key("q3"), three)]) == 3
    assert await request(limiter, Item(QUOTA, key("q1b"), one), Item(QUOTA, zero=("zero", 60)))
    assert not await request(limiter, Item(QUOTA, key("q1b"), one), Item(QUOTA, zero=("zero", 60)))


async def test_unlimited_and_none_touch_no_store() -> None:
    store = MemoryStore(clock=frozen)
    limiter = Limiter(store, on_error="closed")
    items = [Item(UNLIMITED), Item(NONE)]
    assert await request(limiter, *items) and all(item.decision is None for item in items)
    assert not store._data


@pytest.fixture
async def dead() -> AsyncIterator[Limiter]:
    """Fail-closed, on a Redis URL nothing listens on: every charge fails (connection refused)."""
    found = Limiter(RedisStore("redis://127.0.0.1:1/0", timeout=0.5, connect_timeout=0.5), on_error="closed")
    try:
        yield found
    finally:
        await found.close()


@pytest.mark.parametrize("kind", [ENFORCED, QUOTA])
async def test_a_failed_store_under_fail_closed_is_unavailable_naming_its_failure(dead: Limiter, kind: str) -> None:
    with pytest.raises(LimitUnavailable, match=r"^the rate limit store failed: ") as raised:
        await charge_items(dead, [Item(kind, "k", per_hour(L)), Item(SHADOW, "s", per_hour(L))])
    assert raised.value.__cause__ is not None and str(raised.value.__cause__) in str(raised.value)
    with pytest.raises(LimitUnavailable, match=r"^the rate limit store failed: "):
        await charge_items(dead, [Item(kind, "k", per_hour(L))], each=True)


class Failing(MemoryStore):
    """A local store whose every charge fails (a corrupt table, a bug): answered without I/O, so
    the one-counter charge takes its own path."""

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        raise StoreError("the table is corrupt", reason="unreachable")

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise StoreError("the table is corrupt", reason="unreachable")


@pytest.mark.parametrize("counters", [1, 2])
async def test_a_failed_local_store_takes_the_failure_policy(counters: int) -> None:
    def items() -> list[Item]:
        return [Item(ENFORCED, f"k{i}", per_hour(L)) for i in range(counters)]

    with pytest.raises(LimitUnavailable, match=r"^the rate limit store failed: the table is corrupt"):
        await charge_items(Limiter(Failing(), on_error="closed"), items())
    found = items()
    assert await request(Limiter(Failing(), on_error="open", fallback=None), *found)
    assert all(item.decision is None for item in found)  # fail-open, no insurance limiter: nothing decided
    insured = Limiter(Failing(), on_error="open")
    assert sum([await request(insured, *items()) for _ in range(L + 5)]) == L  # the insurance limiter's count


async def test_a_failed_store_never_makes_a_shadow_item_refuse(dead: Limiter) -> None:
    for each in (False, True):
        item = Item(SHADOW, "s", per_hour(L))
        assert await request(dead, item, each=each) and item.decision is None


async def test_a_window_that_turns_between_the_charge_and_its_read_leaves_the_request_refused() -> None:
    """The all-or-nothing charge said no; the counters read after it (a race: here a new window, the
    clock a second later at each reading) show room for every item: the store's refusal stands."""
    now = [NOW]
    ticking = [False]

    def clock() -> float:
        found = now[0]
        if ticking[0]:
            now[0] += 1.0
        return found

    limiter = Limiter(MemoryStore(clock=clock))
    small, big = Limit(Rate(1, 1.0), "fixed_window"), Limit(Rate(100, 1.0), "fixed_window")
    assert await request(limiter, Item(ENFORCED, "a", small))
    a, b = Item(ENFORCED, "a", small), Item(ENFORCED, "b", big)
    ticking[0] = True
    assert not await request(limiter, a, b)
    assert a.decision is not None and b.decision is not None
    assert (a.decision.allowed, b.decision.allowed) == (False, False)
    assert a.decision.remaining == 1  # the read saw the new window: only the race fix-up refuses it
