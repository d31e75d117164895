"""``RedisStore.hit_blocking`` (issue 23): the check on redis-py's synchronous client, in the calling
thread, against real standalone, Sentinel and Cluster servers: exact under 150 threads, one state
with the async path (and the shared vectors), all or nothing over several keys, one round trip per
check, failures as ``StoreError`` within about twice the timeout (a paused server: nothing charged
once it resumes; a killed one), ``NOSCRIPT`` recovered, late refusals, ``close``, ``Breaker``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from ratewarden.decision import Decision
from ratewarden.limits import Limit, make_limits
from ratewarden.stores.base import Store, StoreError
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis.clock import ScriptClock
from ratewarden.stores.redis.errors import RESENDS
from tests.servers import RedisCluster, RedisSentinel, RedisStandalone, Server, redis_cmd
from tests.timing import Stopwatch
from tests.vectors.runner import run_vectors

TOPOLOGIES = ["redis_standalone", "redis_sentinel", "redis_cluster"]
ALGORITHMS = ["fixed_window", "sliding_window", "gcra", "token_bucket"]
_T = TypeVar("_T")


@pytest.fixture(params=TOPOLOGIES, ids=["standalone", "sentinel", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param).url)


def _flood(call: Callable[[], _T], threads: int) -> list[_T]:
    """``call()`` from ``threads`` threads at once."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: call(), range(threads)))


def _key(limit: Limit, tag: str = "") -> str:
    return f"rw:{{blk{tag}|{uuid.uuid4().hex}}}:{limit.suffix}"


def _close(store: Store) -> None:
    asyncio.run(store.close())


def _primaries(request: pytest.FixtureRequest, url: str) -> list[int]:
    """The ports of the servers a topology's checks run on."""
    for name in TOPOLOGIES:
        if name in request.fixturenames:
            server = request.getfixturevalue(name)
            if server.url == url:
                if isinstance(server, RedisCluster):
                    return server.primaries()
                if isinstance(server, RedisSentinel):
                    return [server.master_port()]
                return [server.port]
    raise AssertionError(url)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_150_threads_on_one_key_admit_exactly_the_limit(url: str, algorithm: str) -> None:
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits("100/hour", algorithm)
    key = _key(limit)
    try:
        decisions = _flood(lambda: store.hit_blocking([key], [limit], [1.0]), 150)
        assert sum(d.allowed for d in decisions) == 100
        assert all(d.retry_after > 0 for d in decisions if not d.allowed)
        assert not store.hit_blocking([key], [limit], [1.0]).allowed
    finally:
        _close(store)


class _Blocking:
    """A store of one's own whose ``hit`` is ``RedisStore.hit_blocking`` (the vectors call ``hit``)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.store.hit_blocking(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        raise NotImplementedError

    async def reset(self, keys: Sequence[str]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        await self.store.close()


async def test_the_shared_vectors_through_hit_blocking(url: str) -> None:
    steps = await run_vectors(lambda clock: _Blocking(RedisStore(url, timeout=5, clock=clock)))
    assert steps > 40


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_blocking_and_async_checks_share_one_state(url: str, algorithm: str) -> None:
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits("10/hour", algorithm)
    key = _key(limit)
    try:
        for i in range(12):
            decision = store.hit_blocking([key], [limit], [1.0]) if i % 2 else await store.hit([key], [limit], [1.0])
            assert decision.allowed == (i < 10), i
            if i < 10:
                assert decision.remaining == 9 - i, i
        (peeked,) = await store.peek([key], [limit])
        assert peeked.remaining == 0
    finally:
        await store.close()


@pytest.mark.parametrize("same_slot", [True, False], ids=["one-slot", "across-slots"])
async def test_several_keys_are_charged_all_or_nothing(url: str, same_slot: bool) -> None:
    store = RedisStore(url, timeout=5)
    limits = list(make_limits("5/hour; 3/hour", "sliding_window"))
    tag = uuid.uuid4().hex
    keys = [f"rw:{{mk|{tag}}}:{limit.suffix}" if same_slot else f"rw:{{mk{i}|{tag}}}:{limit.suffix}"
            for i, limit in enumerate(limits)]
    try:
        decisions = [store.hit_blocking(keys, limits, [1.0, 1.0]) for _ in range(5)]
        assert [d.allowed for d in decisions] == [True, True, True, False, False]
        assert decisions[-1].limit == 3  # the deciding limit
        assert [d.remaining for d in await store.peek(keys, limits)] == [2, 0]  # denials charged nothing
        other = [keys[0], _key(limits[1])]  # the first key again, with a fresh second one
        assert store.hit_blocking(other, limits, [1.0, 1.0]).remaining == 1
        assert [d.remaining for d in await store.peek(keys, limits)] == [1, 0]
    finally:
        await store.close()


def test_one_script_call_per_check(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    (limit,) = make_limits("100/hour", "gcra")
    key = _key(limit)
    try:
        store.hit_blocking([key], [limit], [1.0])  # connects: measures the clock, loads the script
        redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
        for _ in range(5):
            store.hit_blocking([key], [limit], [1.0])
        stats = redis_cmd(redis_standalone.port, "INFO", "commandstats")
        calls = {line.split(":")[0].removeprefix("cmdstat_"): int(line.split("calls=")[1].split(",")[0])
                 for line in stats.splitlines() if line.startswith("cmdstat_")}
        assert calls["evalsha"] == 5
        assert calls.get("time") == 5, calls  # the scripts' own: no clock measurement
        assert not {"script|load", "eval", "hello", "client|setinfo"} & set(calls), calls
    finally:
        _close(store)


def test_noscript_after_script_flush_recovers(url: str, request: pytest.FixtureRequest) -> None:
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits("10/hour", "token_bucket")
    key = _key(limit)
    try:
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 9
        for port in _primaries(request, url):
            redis_cmd(port, "SCRIPT", "FLUSH")
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 8
        for port in _primaries(request, url):
            redis_cmd(port, "SCRIPT", "FLUSH")
        decisions = _flood(lambda: store.hit_blocking([key], [limit], [1.0]), 20)
        assert sum(d.allowed for d in decisions) == 8
    finally:
        _close(store)


class _LateClock(ScriptClock):
    """Its first ``late`` deadlines lie 10 s in the past: the script refuses them as late."""

    __slots__ = ()
    late = 0
    asked = 0

    def deadline(self, wall_due: float, strict: bool = False) -> str:
        _LateClock.asked += 1
        return super().deadline(wall_due - 10 if _LateClock.asked <= _LateClock.late else wall_due, strict)


@pytest.mark.parametrize("server", ["redis_standalone", "redis_cluster"])
def test_checks_refused_as_late_are_sent_again_and_never_charged(request: pytest.FixtureRequest, server: str) -> None:
    store = RedisStore(request.getfixturevalue(server).url, timeout=5)
    (limit,) = make_limits("5/hour")
    key = _key(limit)
    clock = store._blocking.script_clock
    try:
        store.hit_blocking([_key(limit)], [limit], [1.0])  # connected, the clock measured
        clock.__class__ = _LateClock
        _LateClock.late, _LateClock.asked = RESENDS, 0
        decision = store.hit_blocking([key], [limit], [1.0])
        assert _LateClock.asked == RESENDS + 1  # refused RESENDS times, then run
        assert decision.allowed and decision.remaining == 4  # charged once
        _LateClock.late, _LateClock.asked = RESENDS + 1, 0
        with pytest.raises(StoreError, match="expired") as failed:
            store.hit_blocking([key], [limit], [1.0])
        assert failed.value.reason == "error"
        clock.__class__ = ScriptClock
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 3  # the refused check charged nothing
    finally:
        clock.__class__ = ScriptClock
        _close(store)


@dataclass
class _Private:
    """Servers of a test's own (it pauses and kills them): the URL, and the process serving a key."""

    url: str
    serving: Callable[[RedisStore, str], Server]
    close: Callable[[], None]


@pytest.fixture(params=["standalone", "sentinel", "cluster"])
def private(request: pytest.FixtureRequest) -> Iterator[_Private]:
    if request.param == "standalone":
        standalone = RedisStandalone().start()
        setup = _Private(standalone.url, lambda store, key: standalone.server, standalone.close)
    elif request.param == "sentinel":
        sentinel = RedisSentinel(down_after_ms=60_000).start()  # no failover while paused or killed
        setup = _Private(sentinel.url, lambda store, key: sentinel.primary, sentinel.close)
    else:
        cluster = RedisCluster().start()

        def serving(store: RedisStore, key: str) -> Server:
            port = store._blocking._client.get_node_from_key(key).port
            return next(s for s in cluster.servers if s.port == port)

        setup = _Private(cluster.url, serving, cluster.close)
    yield setup
    setup.close()


def _timed(call: Callable[[], Any]) -> tuple[str, float]:
    """How the call ended, and how long it took less what a busy machine added (``Stopwatch.slack``)."""
    with Stopwatch() as clock:
        try:
            call()
        except StoreError as exc:
            reason = exc.reason
        else:
            reason = "answered"
    return reason, clock.elapsed - clock.slack


def test_a_paused_then_killed_server_fails_checks_within_two_timeouts(private: _Private) -> None:
    timeout = 0.1
    store = RedisStore(private.url, timeout=timeout)
    (limit,) = make_limits("1000/hour", "fixed_window")
    key = _key(limit)
    server: Server | None = None
    try:
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 999  # connected, script loaded
        server = private.serving(store, key)
        with server.paused():
            results = _flood(lambda: _timed(lambda: store.hit_blocking([key], [limit], [1.0])), 8)
        assert {reason for reason, _ in results} == {"timeout"}, results
        assert max(elapsed for _, elapsed in results) < 2 * timeout + 0.2, results
        time.sleep(0.3)  # the server ran what it had queued: refused as late
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 998  # the failed checks charged nothing
        server.stop()
        reason, elapsed = _timed(lambda: store.hit_blocking([key], [limit], [1.0]))
        assert reason == "unreachable" and elapsed < 2 * timeout + 0.2, (reason, elapsed)
    finally:
        if server is not None:
            server.resume()
        _close(store)


def test_close_closes_the_synchronous_client(redis_standalone: RedisStandalone) -> None:
    name = f"rwblkclose{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{redis_standalone.url}?client_name={name}", timeout=5)
    (limit,) = make_limits("100/hour")
    _flood(lambda: store.hit_blocking([_key(limit)], [limit], [1.0]), 20)
    assert name in redis_cmd(redis_standalone.port, "CLIENT", "LIST")
    _close(store)
    assert name not in redis_cmd(redis_standalone.port, "CLIENT", "LIST")
    assert store.hit_blocking([_key(limit)], [limit], [1.0]).allowed  # still answers, leaves nothing open
    assert name not in redis_cmd(redis_standalone.port, "CLIENT", "LIST")


def test_a_breaker_guards_hit_blocking(redis_standalone: RedisStandalone) -> None:
    (limit,) = make_limits("3/hour")
    key = _key(limit)
    healthy = Breaker(RedisStore(redis_standalone.url, timeout=5))
    try:
        assert [healthy.hit_blocking([key], [limit], [1.0]).remaining for _ in range(3)] == [2, 1, 0]
    finally:
        _close(healthy)
    dead = RedisStandalone().start()
    dead.stop()
    breaker = Breaker(RedisStore(dead.url, timeout=0.1), failures=2, cooldown=60)
    with_fallback = Breaker(RedisStore(dead.url, timeout=0.1), failures=1, cooldown=60, fallback=MemoryStore())
    try:
        for _ in range(2):
            with pytest.raises(StoreError, match="ConnectionError"):
                breaker.hit_blocking([key], [limit], [1.0])
        assert breaker.state == "open"
        with pytest.raises(StoreError, match="circuit open") as short:
            breaker.hit_blocking([key], [limit], [1.0])
        assert short.value.reason == "unreachable" and breaker.short_circuited == 1
        assert [with_fallback.hit_blocking([key], [limit], [1.0]).remaining for _ in range(3)] == [2, 1, 0]
        assert with_fallback.state == "open" and with_fallback.short_circuited == 2
    finally:
        _close(breaker)
        _close(with_fallback)
        dead.close()
