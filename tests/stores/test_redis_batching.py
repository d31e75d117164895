"""Runs of single-key checks go to Redis as one script call (``stores.redis.batching``): fewer
calls, the same answers, and a failing check failing alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis.batching import BATCH_MAX, fold, spread
from ratewarden.stores.redis.protocol import PackedCommands, ScriptArgs, bulk
from tests.servers import RedisStandalone, redis_cmd
from tests.stores.test_redis_store import command_calls


@pytest.fixture
async def store(redis_standalone: RedisStandalone) -> AsyncIterator[RedisStore]:
    """A store on the test server without a rejection cache: every check reaches Redis."""
    opened = RedisStore(redis_standalone.url, timeout=5, cache=False)
    yield opened
    await opened.close()


def fresh_keys(tag: str, count: int) -> list[str]:
    return [f"rw:{{{tag}|{uuid.uuid4().hex}}}:{i}" for i in range(count)]


ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "token_bucket_debt", "leaky_bucket", "gcra")


def _commands(count: int, mode: str = "h", keys: int = 1) -> list[bytes]:
    packed = PackedCommands(ScriptArgs(None))
    limits = make_limits("5/minute")
    return [
        packed.request(mode, [f"k{i}-{j}" for j in range(keys)], limits * keys, [1.0] * keys, bulk("-1e12"))
        for i in range(count)
    ]


def test_fold_keeps_the_order_and_folds_only_runs_of_single_key_hits() -> None:
    hits, peek, pair = _commands(3), _commands(1, "p")[0], _commands(1, keys=2)[0]
    sent, sizes = fold([hits[0], peek, hits[1], hits[2], pair, hits[0]])
    assert sizes == [0, 0, 2, 0, 0]
    assert sent[0] == hits[0] and sent[1] == peek and sent[3] == pair and sent[4] == hits[0]
    assert sent[2].startswith(b"*21\r\n") and sent[2].count(b"\r\nh\r\n") == 2  # 3 + 9 x 2 arguments


def test_fold_caps_a_call_at_batch_max_checks() -> None:
    _, sizes = fold(_commands(2 * BATCH_MAX + 3))
    assert sizes == [BATCH_MAX, BATCH_MAX, 3]


def test_spread_gives_each_check_its_reply_or_the_call_s_error() -> None:
    error = StoreError("NOSCRIPT")
    assert spread([[1], [0]], 2) == [[1], [0]]
    assert spread(error, 3) == [error] * 3
    assert spread("x", 0) == ["x"]
    malformed = spread([[1]], 2)
    assert len(malformed) == 2 and all("a folded call of 2 checks" in str(r) for r in malformed)


async def test_concurrent_checks_go_as_few_script_calls_and_admit_exactly_the_limit(
    redis_standalone: RedisStandalone, store: RedisStore,
) -> None:
    limits = make_limits("50/minute")
    key, warm = fresh_keys("fold", 2)
    await store.hit([warm], limits, [1.0])  # connects and loads both scripts
    redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
    results = await asyncio.gather(*(store.hit([key], limits, [1.0]) for _ in range(200)))
    assert sum(d.allowed for d in results) == 50
    assert [d.remaining for d in results if d.allowed] == list(range(49, -1, -1))
    calls = command_calls(redis_standalone.port)
    assert calls.get("evalsha", 0) <= 200 // BATCH_MAX + 4, calls  # 200 checks, a handful of calls
    assert "eval" not in calls


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_folded_checks_answer_as_the_same_checks_alone_and_as_memory(
    redis_standalone: RedisStandalone, algorithm: str
) -> None:
    now = [1_700_000_000.25]
    store = RedisStore(redis_standalone.url, timeout=5, clock=lambda: now[0], cache=False)
    memory = MemoryStore(clock=lambda: now[0])
    limits = make_limits("7/10s", algorithm)
    keys = fresh_keys("same", 3)
    try:
        for step in range(12):
            now[0] += 0.7
            folded = await asyncio.gather(*(store.hit([k], limits, [1.0]) for k in keys[:2] for _ in range(2)))
            alone = [await store.hit([keys[2]], limits, [1.0]) for _ in range(2)]
            local = [memory.hit_now([keys[2]], limits, [1.0]) for _ in range(2)]
            assert folded[:2] == folded[2:] == alone == local, (algorithm, step)
    finally:
        await store.close()


async def test_a_check_on_a_key_of_another_type_fails_alone(redis_standalone: RedisStandalone, store: RedisStore) -> None:
    limits = make_limits("5/minute")
    *good, bad = fresh_keys("alone", 11)
    redis_cmd(redis_standalone.port, "RPUSH", bad, "not a counter")
    await store.hit([good[0]], limits, [1.0])
    redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
    results = await asyncio.gather(
        *(store.hit([k], limits, [1.0]) for k in good[:5]), store.hit([bad], limits, [1.0]),
        *(store.hit([k], limits, [1.0]) for k in good[5:]), return_exceptions=True,
    )
    assert isinstance(results[5], StoreError) and "WRONGTYPE" in str(results[5])
    answered = [r for i, r in enumerate(results) if i != 5]
    assert [getattr(r, "remaining", r) for r in answered] == [3] + [4] * 9
    assert command_calls(redis_standalone.port).get("evalsha", 0) == 1  # all eleven in one call


async def test_folded_checks_are_answered_after_the_server_lost_its_scripts(
    redis_standalone: RedisStandalone, store: RedisStore,
) -> None:
    limits = make_limits("5/minute")
    keys = fresh_keys("flush", 20)
    await store.hit([keys[0]], limits, [1.0])
    redis_cmd(redis_standalone.port, "SCRIPT", "FLUSH")
    results = await asyncio.gather(*(store.hit([k], limits, [1.0]) for k in keys))
    assert [d.remaining for d in results] == [3] + [4] * 19  # each charged once, none lost
    again = await asyncio.gather(*(store.hit([k], limits, [1.0]) for k in keys))
    assert [d.remaining for d in again] == [2] + [3] * 19


def test_a_folded_check_past_its_deadline_charges_nothing_and_says_so(redis_standalone: RedisStandalone) -> None:
    import redis

    from ratewarden.stores.redis.batching import BATCH_SCRIPT, TIME_EVERY

    client = redis.Redis(port=redis_standalone.port)
    keys = fresh_keys("late", TIME_EVERY + 3)
    server_now = float(client.time()[0])
    passed, ahead = f"-{server_now - 5:.4f}", f"-{server_now + 60:.4f}"
    limit = ["1", "5", "60", "5", "0", "1"]
    deadlines = [passed if i % 3 == 0 else ahead for i in range(len(keys))]
    try:
        replies = client.eval(
            BATCH_SCRIPT, len(keys), *keys, *(arg for d in deadlines for arg in ["h", d, *limit]),
        )
        for key, deadline, reply in zip(keys, deadlines, replies, strict=True):
            if deadline == passed:
                assert isinstance(reply, redis.ResponseError) and str(reply).startswith("ratewarden: expired")
                assert client.exists(key) == 0  # nothing charged
            else:
                assert reply[:3] == [1, 5, 4] and client.exists(key) == 1
    finally:
        client.delete(*keys)
        client.close()
