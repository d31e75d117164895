"""Refunds and penalties on Redis (``RedisStore.adjust``): the same answers as the memory store,
one script call, and after-response charging through the policy middleware."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from ratewarden import Limiter
from ratewarden.charges import Adjusting, adjust
from ratewarden.limits import Limit, make_limits
from ratewarden.policy import PolicyMiddleware, parse_policy
from ratewarden.rates import Rate
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from tests.policy.apps import build_app, client
from tests.servers import RedisStandalone, redis_cmd
from tests.stores.helpers import ALGORITHM_NAMES
from tests.stores.test_redis_store import command_calls
from tests.vectors.runner import FakeClock


def test_redis_store_is_adjustable() -> None:
    assert issubclass(RedisStore, Adjusting) and RedisStore("redis://127.0.0.1:1/0").supports("adjust")


@pytest.mark.parametrize("where", ["redis", "cluster"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_adjust_same_answers_as_memory(where: str, seed: int, request: pytest.FixtureRequest) -> None:
    """Random hits, refunds and penalties on every algorithm: every decision and the final state
    equal the memory store's (on a cluster the adjusted keys span several hash slots)."""
    server = request.getfixturevalue("redis_standalone" if where == "redis" else "redis_cluster")
    rng = random.Random(seed)
    clock = FakeClock(2_000_000.0 + rng.random())
    remote = RedisStore(server.url, timeout=5, clock=clock, cache=rng.random() < 0.5)
    memory = MemoryStore(clock=clock)
    tags = [uuid.uuid4().hex for _ in range(2)]
    limits = [
        Limit(Rate(rng.randint(2, 8), rng.choice([1.0, 2.5, 10.0, 60.0]), rng.choice([None, 3]), rng.choice([None, 4])),
            name)
        for name in ALGORITHM_NAMES
        for _ in range(2)
    ]
    keys = [f"rw:{{adj|{tags[i % 2]}}}:{i}:{limit.suffix}" for i, limit in enumerate(limits)]
    adjusted = Counter[str]()
    try:
        for step in range(250):
            clock.advance(rng.choice([0.0, 0.0, 0.01, 0.1, 0.37, 1.0, 3.0]))
            picks = rng.sample(range(len(limits)), rng.randint(1, 3))
            if step % 2 == 0:
                tag = tags[step % 4 // 2]  # a check stays within one slot, as the limiter's keys do
                picks = [i for i in picks if tags[i % 2] == tag] or [tags.index(tag)]
                costs = [rng.choice([1.0, 1.0, 2.0, 0.5]) for _ in picks]
                args = ([keys[i] for i in picks], [limits[i] for i in picks], costs)
                got = await remote.hit(*args)
                want = await memory.hit(*args)
                assert got == want, f"step {step} hit: {got} != {want}"
            else:
                amounts = [rng.choice([-1.0, -2.0, -0.5, -10.0, 1.0, 3.0, 50.0, 0.0]) for _ in picks]
                args = ([keys[i] for i in picks], [limits[i] for i in picks], amounts)
                got_many = await adjust(remote, *args)
                want_many = await adjust(memory, *args)
                assert got_many == want_many, f"step {step} adjust {amounts}: {got_many} != {want_many}"
                adjusted.update(limits[i].algorithm for i in picks)
        assert await remote.peek(keys, limits) == await memory.peek(keys, limits)
        assert set(adjusted) == set(ALGORITHM_NAMES)
    finally:
        await remote.close()


# (clock advance, "hit" or "adjust", amount): edge cases the random walk meets only rarely.
SCRIPT = [
    (0.0, "hit", 4.0), (60.0, "hit", 1.0), (6.0, "adjust", -2.0),  # sliding window: refund below 0 this window
    (0.0, "hit", 2.0), (0.5, "adjust", 9.0), (0.0, "adjust", 2.0),  # penalty over the limit, then when full
    (1.0, "adjust", -0.5), (0.0, "hit", 6.0), (0.0, "adjust", -1.0),  # fractional refund; debt bucket in debt
    (30.0, "adjust", -100.0), (0.0, "adjust", 0.0), (0.0, "hit", 1.0),
]


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_adjust_edge_cases_same_as_memory(redis_standalone: RedisStandalone, algorithm: str) -> None:
    clock = FakeClock(3_000_000.0)
    remote = RedisStore(redis_standalone.url, timeout=5, clock=clock, cache=False)
    memory = MemoryStore(clock=clock)
    limits = [Limit(Rate(5, 60.0, None, 2), algorithm)]
    keys = [f"rw:{{edge|{uuid.uuid4().hex}}}:{limits[0].suffix}"]
    try:
        for step, (advance, op, amount) in enumerate(SCRIPT):
            clock.advance(advance)
            if op == "hit":
                got: object = await remote.hit(keys, limits, [amount])
                want: object = await memory.hit(keys, limits, [amount])
            else:
                got = await adjust(remote, keys, limits, [amount])
                want = await adjust(memory, keys, limits, [amount])
            assert got == want, f"step {step} {op} {amount}: {got} != {want}"
    finally:
        await remote.close()


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_refund_restores_the_allowance(redis_standalone: RedisStandalone, algorithm: str) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    limits = make_limits("5/min", algorithm)
    keys = [f"rw:{{refund|{uuid.uuid4().hex}}}:{limits[0].suffix}"]
    try:
        for _ in range(5):
            assert (await store.hit(keys, limits, [1.0])).allowed
        assert not (await store.hit(keys, limits, [1.0])).allowed  # now cached as a rejection
        (refunded,) = await adjust(store, keys, limits, [-2.0])
        assert refunded.allowed and refunded.remaining == 2
        assert (await store.hit(keys, limits, [1.0])).allowed  # the refund cleared the cache
        await adjust(store, keys, limits, [-50.0])  # never more than the whole limit
        assert (await store.peek(keys, limits))[0].remaining == 5
        assert redis_cmd(redis_standalone.port, "EXISTS", keys[0]) == "0"  # full again = no state
        (penalised,) = await adjust(store, keys, limits, [50.0])  # a penalty stops at the limit
        assert penalised.remaining == 0
        assert not (await store.hit(keys, limits, [1.0])).allowed
    finally:
        await store.close()


async def test_adjust_is_one_script_call(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    limits = make_limits("5/min; 100/hour", "sliding_log")
    keys = [f"rw:{{one|{uuid.uuid4().hex}}}:{limit.suffix}" for limit in limits]
    try:
        await store.hit(keys, limits, [3.0, 3.0])
        redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
        decisions = await store.adjust(keys, limits, [-1.0, -1.0])
        assert [d.remaining for d in decisions] == [3, 98]
        assert command_calls(redis_standalone.port).get("evalsha") == 1
        with pytest.raises(ValueError, match="must match"):
            await store.adjust(keys, limits, [-1.0])
    finally:
        await store.close()


POLICY = """
[[rules]]
name = "login"
path = "/login"
methods = ["POST"]
rate = "3/min"
algorithm = "{algorithm}"
charge = { statuses = [401, 404, "5xx"] }
"""


@pytest.mark.parametrize("algorithm", ["fixed_window", "gcra"])
async def test_after_response_charging_through_the_policy_middleware(
    redis_standalone: RedisStandalone, algorithm: str
) -> None:
    """Refund on success, count only 401/404/5xx, with the counters in Redis."""
    prefix = f"rwpol{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_standalone.url, timeout=5, prefix=prefix)
    policy = parse_policy(POLICY.replace("{algorithm}", algorithm))
    app = PolicyMiddleware(build_app(), Limiter(store, prefix=prefix), policy=policy)
    try:
        async with client(app) as http:
            ok = Counter([(await http.post("/login?status=200")).status_code for _ in range(10)])
            failed = Counter(
                [(await http.post(f"/login?status={status}")).status_code for status in (401, 404, 503, 401)]
            )
            after = (await http.post("/login?status=200")).status_code
        assert ok == {200: 10}  # successes were refunded: never limited
        assert failed == {401: 1, 404: 1, 503: 1, 429: 1}
        assert after == 429
        keys = redis_cmd(redis_standalone.port, "KEYS", f"{prefix}:*").split()
        assert len(keys) == 1  # the counter really lives in Redis
    finally:
        await store.close()
