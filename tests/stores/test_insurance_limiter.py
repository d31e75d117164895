"""The insurance limiter (issue 19, "never unlimited" and "visible"), on a real redis-server.

With the store killed (connection refused) or hung (SIGSTOP: every check waits the store's
timeout), a limiter under ``on_error="open"`` decides each check with its own local
``MemoryStore``: ``N`` requests against a limit of ``L`` admit exactly ``L``, through the
middleware, the policy middleware, the FastAPI dependency (the edge) and ``Limiter.hit``. With
``fallback=None`` they all pass (``Limiter.hit`` raises); under ``on_error="closed"`` they get 503.
Once the server is back the store decides again, charged first with what was admitted without it;
an outage starts from what the store last said was left, split among the workers. Every check
decided without the store is counted by reason (``Limiter.without_store``,
``ratewarden_checks_without_store_total``) and logged at most once a second, with the count since
the previous line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import time
import uuid
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ratewarden import ConfigurationError, Limiter, MemoryStore, RateLimitMiddleware, Rule, StoreError
from ratewarden.fastapi import RateLimit, install
from ratewarden.limiter import OUTAGE_GAP, storage_key
from ratewarden.limits import make_limits
from ratewarden.metrics import Metrics
from ratewarden.policy import PolicyMiddleware
from ratewarden.stores.base import client_error, failure_reason, no_reply
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.redis import RedisStore
from tests.core.asgi import request
from tests.servers import Memcached, RedisStandalone

LIMIT = 5
REQUESTS = 12
RATE = f"{LIMIT}/hour"
TIMEOUT = 0.025  # RedisStore's default
CLIENT = "203.0.113.7"  # tests.core.asgi.request's client address: the rules' default key


async def endpoint(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


@contextlib.contextmanager
def fault(server: RedisStandalone, kind: str) -> Iterator[None]:
    """The store killed (``down``) or hung (``paused``) until the block ends; then it answers again."""
    if kind == "down":
        server.stop()
        try:
            yield
        finally:
            server.server.start()
    else:
        with server.server.paused():
            yield


async def answering(limiter: Limiter) -> None:
    """Wait until the store answers again (a restarted server takes a moment to accept)."""
    (probe,) = make_limits("1000/hour")
    deadline = time.monotonic() + 10
    while True:
        try:
            await limiter.store.peek([f"{limiter.prefix}:{{probe|p}}:{probe.suffix}"], [probe])
            return
        except StoreError:
            assert time.monotonic() < deadline, "the store did not come back"
            await asyncio.sleep(0.05)


async def remaining_on_the_store(limiter: Limiter, key: str, rule: Rule | None = None) -> int:
    """What the store (not the insurance limiter) says is left for ``key`` (under ``rule``)."""
    limits = limiter.limits(RATE) if rule is None else rule.limits
    scope = "" if rule is None else rule.name
    keys = [storage_key(limiter.prefix, scope, key, limit.suffix) for limit in limits]
    (decision,) = await limiter.store.peek(keys, limits)
    return decision.remaining


@pytest.fixture
async def server(redis_standalone: RedisStandalone) -> AsyncIterator[RedisStandalone]:
    """The session's redis-server, running again after the test whatever it did to it."""
    yield redis_standalone
    redis_standalone.server.resume()
    if not redis_standalone.server.running:
        redis_standalone.server.start()


def new_limiter(server: RedisStandalone, **options: Any) -> Limiter:
    return Limiter(RedisStore(server.url, timeout=TIMEOUT), prefix=f"i{uuid.uuid4().hex[:10]}", **options)


# -- the middleware and Limiter.hit ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["down", "paused"])
async def test_middleware_admits_exactly_the_limit_while_the_store_fails(server: RedisStandalone, kind: str) -> None:
    limiter = new_limiter(server)
    rule = Rule("/x", RATE)
    app = RateLimitMiddleware(endpoint, limiter, [rule])
    try:
        await answering(limiter)
        assert (await request(app, "/x")).status == 200  # the store decides: 1 used on the server
        with fault(server, kind):
            statuses = [(await request(app, "/x")).status for _ in range(REQUESTS)]
        # The insurance limiter starts from what the store last said was left: LIMIT - 1.
        assert statuses == [200] * (LIMIT - 1) + [429] * (REQUESTS - LIMIT + 1)
        reason = "unreachable" if kind == "down" else "timeout"
        assert limiter.without_store() == {
            "timeout": 0, "unreachable": 0, "error": 0, "local_limiter": REQUESTS, "over_limit_cache": 0,
            reason: REQUESTS,
        }
        # Back: the store decides again, charged first with what was admitted without it.
        await answering(limiter)
        before = await remaining_on_the_store(limiter, CLIENT, rule)
        assert before == (LIMIT if kind == "down" else LIMIT - 1)  # a killed server lost its data
        statuses = [(await request(app, "/x")).status for _ in range(3)]
        # What the killed server lost (1) is all that is admitted again.
        assert statuses == ([200, 429, 429] if kind == "down" else [429] * 3)
        assert await remaining_on_the_store(limiter, CLIENT, rule) == 0
        assert limiter.without_store()["local_limiter"] == REQUESTS  # nothing more decided without it
    finally:
        await limiter.close()


@pytest.mark.parametrize("kind", ["down", "paused"])
async def test_limiter_hit_admits_exactly_the_limit_while_the_store_fails(server: RedisStandalone, kind: str) -> None:
    limiter = new_limiter(server)
    try:
        await answering(limiter)
        with fault(server, kind):
            allowed = [(await limiter.hit("client", RATE)).allowed for _ in range(REQUESTS)]
            other = (await limiter.hit("other", RATE)).allowed  # each key has its own local count
        assert allowed == [True] * LIMIT + [False] * (REQUESTS - LIMIT)
        assert other
        counts = limiter.without_store()
        assert counts["local_limiter"] == REQUESTS + 1
        assert counts["unreachable" if kind == "down" else "timeout"] == REQUESTS + 1
        await answering(limiter)
        assert await remaining_on_the_store(limiter, "client") == LIMIT  # nothing charged on the store yet
        # The first check the store answers charges it first with what was admitted without it.
        assert not (await limiter.hit("client", RATE)).allowed
        assert await remaining_on_the_store(limiter, "client") == 0
        assert await remaining_on_the_store(limiter, "other") == LIMIT - 1
    finally:
        await limiter.close()


def test_hit_sync_goes_through_the_insurance_limiter(server: RedisStandalone) -> None:
    limiter = new_limiter(server)
    try:
        limiter.hit_sync("warm", RATE)  # connects on the facade's loop
        with fault(server, "down"):
            allowed = [limiter.hit_sync("client", RATE).allowed for _ in range(REQUESTS)]
        assert allowed == [True] * LIMIT + [False] * (REQUESTS - LIMIT)
        assert limiter.without_store()["local_limiter"] == REQUESTS
    finally:
        limiter.close_sync()


# -- the other integrations --------------------------------------------------------------------


def fastapi_app(limiter: Limiter) -> FastAPI:
    app = FastAPI()
    install(app)  # the edge layer checks the dependency's limit before routing

    @app.get("/x", dependencies=[Depends(RateLimit(RATE, limiter=limiter))])
    async def limited() -> dict[str, bool]:
        return {"ok": True}

    return app


@pytest.mark.parametrize("integration", ["policy", "dependency"])
async def test_other_integrations_admit_exactly_the_limit(server: RedisStandalone, integration: str) -> None:
    limiter = new_limiter(server)
    try:
        await answering(limiter)
        if integration == "policy":
            app: Any = PolicyMiddleware(endpoint, limiter, [Rule("/x", RATE)])
            with fault(server, "down"):
                statuses = [(await request(app, "/x")).status for _ in range(REQUESTS)]
        else:
            transport = httpx.ASGITransport(app=fastapi_app(limiter))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                with fault(server, "down"):
                    statuses = [(await client.get("/x")).status_code for _ in range(REQUESTS)]
        assert statuses == [200] * LIMIT + [429] * (REQUESTS - LIMIT)
        assert limiter.without_store()["local_limiter"] == REQUESTS
    finally:
        await limiter.close()


# -- opting out, failing closed ----------------------------------------------------------------


async def test_without_the_insurance_limiter_every_request_passes(server: RedisStandalone) -> None:
    limiter = new_limiter(server, fallback=None)
    app = RateLimitMiddleware(endpoint, limiter, [Rule("/x", RATE)])
    try:
        await answering(limiter)
        with fault(server, "down"):
            statuses = [(await request(app, "/x")).status for _ in range(REQUESTS)]
            with pytest.raises(StoreError):  # called directly, the caller decides
                await limiter.hit("client", RATE)
        assert statuses == [200] * REQUESTS
        counts = limiter.without_store()
        assert counts["unreachable"] == REQUESTS + 1 and counts["local_limiter"] == 0
    finally:
        await limiter.close()


@pytest.mark.parametrize("kind", ["down", "paused"])
async def test_fail_closed_still_answers_503(server: RedisStandalone, kind: str) -> None:
    limiter = new_limiter(server, on_error="closed")
    app = RateLimitMiddleware(endpoint, limiter, [Rule("/x", RATE)])
    try:
        await answering(limiter)
        with fault(server, kind):
            statuses = [(await request(app, "/x")).status for _ in range(REQUESTS)]
            with pytest.raises(StoreError):
                await limiter.hit("client", RATE)
        assert statuses == [503] * REQUESTS
        counts = limiter.without_store()
        assert counts["unreachable" if kind == "down" else "timeout"] == REQUESTS + 1
        assert counts["local_limiter"] == 0
    finally:
        await limiter.close()


# -- visible: metrics and the log --------------------------------------------------------------


def metric(metrics: Metrics, reason: str) -> float:
    return sum(
        s.value for m in metrics.registry.collect() if m.name == "ratewarden_checks_without_store"
        for s in m.samples if s.labels.get("reason") == reason
    )


async def test_metrics_count_the_checks_decided_without_the_store(server: RedisStandalone) -> None:
    metrics = Metrics(otel=False)
    store = RedisStore(server.url, timeout=TIMEOUT)
    metrics.watch(store)
    limiter = Limiter(store, prefix=f"i{uuid.uuid4().hex[:10]}")
    before = {r: metric(metrics, r) for r in ("timeout", "unreachable", "local_limiter", "over_limit_cache")}
    try:
        await answering(limiter)
        # Over the limit with the store up: its rejection cache answers the last two.
        assert [(await limiter.hit("cached", RATE)).allowed for _ in range(LIMIT + 3)] == [True] * LIMIT + [False] * 3
        assert store.cached_rejections == 2
        with fault(server, "paused"):
            for _ in range(3):
                await limiter.hit("client", RATE)
        with fault(server, "down"):
            for _ in range(4):
                await limiter.hit("client", RATE)
        assert limiter.without_store() == {
            "timeout": 3, "unreachable": 4, "error": 0, "local_limiter": 7, "over_limit_cache": 2,
        }
        assert metric(metrics, "timeout") - before["timeout"] == 3
        assert metric(metrics, "unreachable") - before["unreachable"] == 4
        assert metric(metrics, "local_limiter") - before["local_limiter"] == 7
        assert metric(metrics, "over_limit_cache") - before["over_limit_cache"] == 2
        assert b'ratewarden_checks_without_store_total{reason="local_limiter"}' in metrics.exposition()
    finally:
        await limiter.close()


async def test_the_log_line_says_how_many_checks_it_covers(
    server: RedisStandalone, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = new_limiter(server)
    try:
        await answering(limiter)
        with caplog.at_level(logging.WARNING, logger="ratewarden"), fault(server, "down"):
            for _ in range(REQUESTS):
                await limiter.hit("client", RATE)
            await asyncio.sleep(1.05)  # the next line comes a second after the first
            await limiter.hit("client", RATE)
        lines = [r.getMessage() for r in caplog.records if "decided without the store" in r.getMessage()]
        assert len(lines) == 2, lines
        name = repr(limiter.store)
        assert lines[0].startswith(f"rate limit check failed: {name}: 1 check decided without the store in the last 0.0 s ")
        assert "(unreachable: 1, local limiter: 1): " in lines[0]
        # The second line covers every check since the first: the 11 after it and its own.
        assert lines[1].startswith(f"rate limit check failed: {name}: {REQUESTS} checks decided without the store in the last 1.")
        assert f"(unreachable: {REQUESTS}, local limiter: {REQUESTS}): " in lines[1]
        assert "Connect" in lines[1] or "Connection" in lines[1]  # the last error, without the store's name again
        assert f": {name}:" not in lines[1][len("rate limit check failed: ") + len(name):]
    finally:
        await limiter.close()


# -- outages, options, reasons -----------------------------------------------------------------


async def test_a_new_outage_starts_from_empty_local_counts(server: RedisStandalone) -> None:
    limiter = new_limiter(server)
    try:
        await answering(limiter)
        with fault(server, "down"):
            assert [(await limiter.hit("client", RATE)).allowed for _ in range(LIMIT + 1)] == [True] * LIMIT + [False]
        await answering(limiter)
        with fault(server, "down"):  # a flapping store: its outage's local counts carry on
            assert not (await limiter.hit("client", RATE)).allowed
        limiter._last_failure -= OUTAGE_GAP  # as if a minute had passed without a failed check
        with fault(server, "down"):
            assert [(await limiter.hit("client", RATE)).allowed for _ in range(LIMIT + 1)] == [True] * LIMIT + [False]
    finally:
        await limiter.close()


async def test_the_fallback_option(server: RedisStandalone) -> None:
    assert isinstance(Limiter(RedisStore(server.url)).fallback, MemoryStore)  # the default: "local"
    assert Limiter(RedisStore(server.url), fallback=None).fallback is None
    assert Limiter(MemoryStore()).fallback is None  # a local store needs none
    mine = MemoryStore(max_keys=100)
    assert Limiter(RedisStore(server.url), fallback=mine).fallback is mine
    with pytest.raises(ConfigurationError, match="fallback"):
        Limiter(MemoryStore(), fallback=RedisStore(server.url))  # not local: would need its own fallback
    with pytest.raises(ValueError, match="fallback"):
        Limiter(fallback="memory")  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # the compiled build's own argument check may raise first
        Limiter(fallback=42)  # type: ignore[arg-type]


async def test_a_breaker_without_a_fallback_is_insured_by_the_limiter(server: RedisStandalone) -> None:
    breaker = Breaker(RedisStore(server.url, timeout=TIMEOUT), failures=2, cooldown=60)
    limiter = Limiter(breaker, prefix=f"i{uuid.uuid4().hex[:10]}")
    try:
        await answering(limiter)
        with fault(server, "down"):
            allowed = [(await limiter.hit("client", RATE)).allowed for _ in range(REQUESTS)]
        assert allowed == [True] * LIMIT + [False] * (REQUESTS - LIMIT)
        assert breaker.state == "open" and breaker.short_circuited == REQUESTS - 2
        # The circuit's own errors carry the reason of the failure that opened it.
        assert limiter.without_store()["unreachable"] == REQUESTS
    finally:
        await limiter.close()


def test_store_error_reasons() -> None:
    assert StoreError("x").reason == "error"
    assert no_reply("RedisStore('redis://h')", "hit", 0.025).reason == "timeout"
    assert client_error("s", "hit", ConnectionRefusedError(111, "refused")).reason == "unreachable"
    assert client_error("s", "hit", RedisConnectionError("Connection closed by server.")).reason == "unreachable"
    assert client_error("s", "hit", RedisTimeoutError("Timeout reading from socket")).reason == "timeout"
    assert client_error("s", "hit", asyncio.TimeoutError()).reason == "timeout"
    assert client_error("s", "hit", ResponseError("OOM command not allowed")).reason == "error"
    try:  # a client error wrapping a refused connection: the cause decides
        raise RuntimeError("pipeline broken") from ConnectionResetError(104, "reset")
    except RuntimeError as exc:
        assert client_error("s", "hit", exc).reason == "unreachable"
    assert failure_reason(StoreError("x", reason="timeout")) == "timeout"
    copy = pickle.loads(pickle.dumps(StoreError("gone", reason="unreachable")))
    assert (str(copy), copy.reason) == ("gone", "unreachable")


# -- an outage costs what was left, and is charged back (issue 28, finding 8) ------------------


SEEDED_RATE = "20/hour"


@pytest.mark.parametrize("kind", ["down", "paused"])
async def test_an_outage_admits_what_the_store_had_left_split_among_workers(server: RedisStandalone, kind: str) -> None:
    """12 of 20 used on the store, then it fails: each of 2 workers' insurance limiters starts from
    the store's last answer (8 left) and admits its half, 4, not a whole new limit of 20. Once the
    store answers, the first check charges it those 4 first (the same pipeline)."""
    limiter = new_limiter(server, workers=2)
    try:
        await answering(limiter)
        assert all([(await limiter.hit("client", SEEDED_RATE)).allowed for _ in range(12)])
        with fault(server, kind):
            outage = [(await limiter.hit("client", SEEDED_RATE)).allowed for _ in range(20)]
        assert outage.count(True) == 4 and outage[:4] == [True] * 4
        await answering(limiter)
        assert (await limiter.hit("client", SEEDED_RATE)).allowed
        # The store counts what was admitted without it: 12 + 4 + 1 (a killed server lost its 12).
        limits = limiter.limits(SEEDED_RATE)
        (decision,) = await limiter.store.peek(limiter.keys_for("client", limits), limits)
        left = decision.remaining
        assert left == (20 - 4 - 1 if kind == "down" else 20 - 12 - 4 - 1)
    finally:
        await limiter.close()


async def test_a_denied_key_stays_denied_through_an_outage(server: RedisStandalone) -> None:
    """The store's last answer was a denial (0 left): the insurance limiter admits nothing more."""
    limiter = new_limiter(server)
    try:
        await answering(limiter)
        assert [(await limiter.hit("client", RATE)).allowed for _ in range(LIMIT + 1)] == [True] * LIMIT + [False]
        with fault(server, "paused"):
            assert not any([(await limiter.hit("client", RATE)).allowed for _ in range(REQUESTS)])
    finally:
        await limiter.close()


def test_the_blocking_path_seeds_and_charges_back(server: RedisStandalone) -> None:
    """``hit_blocking`` (WSGI apps, threads) notes the store's answers and settles what is owed, as
    ``hit`` does: the store restarted empty ends at exactly what was admitted over the outage."""
    limiter = new_limiter(server)
    store = limiter.store
    (limit,) = limiter.limits(SEEDED_RATE)
    keys = limiter.keys_for("client", [limit])

    def check() -> bool:
        try:
            return store.hit_blocking(keys, [limit], [1.0]).allowed
        except StoreError as exc:
            decision = limiter.decide_without_store(exc, keys, [limit], [1.0])
            assert decision is not None
            return decision.allowed

    try:
        assert all(check() for _ in range(15))
        with fault(server, "down"):
            outage = [check() for _ in range(10)]
        assert outage == [True] * 5 + [False] * 5
        deadline = time.monotonic() + 10
        while True:  # the restarted server accepts again
            try:
                back = store.hit_blocking(keys, [limit], [1.0])
                break
            except StoreError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert back.allowed  # the killed server lost the 15: only the 5 are charged back, ahead of this check
        assert store.peek_blocking(keys, [limit])[0].remaining == 20 - 1 - 5
    finally:
        limiter.close_sync()


async def test_memcached_outage_is_seeded_and_charged_back(memcached_server: Memcached) -> None:
    """The same on memcached: 8 of 20 left at its last answer, 8 admitted while it is down, and the
    restarted (empty) memcached charged those 8 by the first check it answers."""
    limiter = Limiter(MemcachedStore(memcached_server.url, timeout=0.05), prefix=f"i{uuid.uuid4().hex[:10]}")
    limits = limiter.limits(SEEDED_RATE)
    keys = limiter.keys_for("client", limits)
    try:
        assert all([(await limiter.hit("client", SEEDED_RATE)).allowed for _ in range(12)])
        memcached_server.server.stop()
        try:
            outage = [(await limiter.hit("client", SEEDED_RATE)).allowed for _ in range(20)]
        finally:
            memcached_server.server.start()
        assert outage == [True] * 8 + [False] * 12
        deadline = time.monotonic() + 10
        while True:
            try:
                assert (await limiter.store.hit(keys, limits, [1.0])).allowed
                break
            except StoreError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        (decision,) = await limiter.store.peek(keys, limits)
        assert decision.remaining == 20 - 1 - 8
    finally:
        await limiter.close()


@pytest.mark.parametrize("path", ["redis", "redis-nocoalesce", "redis-blocking", "memcached", "memcached-blocking"])
async def test_the_check_after_a_failed_one_counts_what_the_insurance_limiter_admitted(
    server: RedisStandalone, memcached_server: Memcached, path: str
) -> None:
    """One check fails (its server paused, as a loaded machine can leave it past the timeout) and
    the insurance limiter admits it: the next check the store decides counts that admission. Charged
    back after that check (Memcached, Redis without coalescing, the blocking calls), the 6th request
    against 5/hour was admitted."""
    kind, _, variant = path.partition("-")
    paused = memcached_server.server if kind == "memcached" else server.server
    store = (
        MemcachedStore(memcached_server.url, timeout=1.0) if kind == "memcached"
        else RedisStore(server.url, timeout=1.0, coalesce=variant != "nocoalesce")
    )
    limiter = Limiter(store, prefix=f"i{uuid.uuid4().hex[:10]}")
    limits = limiter.limits(RATE)
    keys = limiter.keys_for("client", limits)

    async def check() -> bool:
        if variant != "blocking":
            return (await limiter.hit("client", RATE)).allowed
        try:
            return store.hit_blocking(keys, limits, [1.0]).allowed
        except StoreError as exc:
            decision = limiter.decide_without_store(exc, keys, limits, [1.0])
            assert decision is not None
            return decision.allowed

    try:
        assert [await check() for _ in range(LIMIT - 1)] == [True] * (LIMIT - 1)
        with paused.paused():
            assert await check()  # the insurance limiter: 1 left at the store's last answer
        assert limiter.without_store()["local_limiter"] == 1
        assert [await check() for _ in range(2)] == [False, False]
        (decision,) = await store.peek(keys, limits)
        assert decision.remaining == 0
    finally:
        paused.resume()
        await limiter.close()


def test_the_ledger_is_bounded_whatever_the_keys() -> None:
    """A flood of distinct keys: the last answers stay at most ``ANSWERS`` (one pushed out at a
    time when full), the charges owed at most ``OWED`` (beyond, counted as ``dropped``), a long key kept too."""
    from ratewarden.decision import Decision
    from ratewarden.stores.insurance import ANSWERS, OWED, Ledger

    ledger = Ledger()
    (limit,) = make_limits("5/hour")
    answer = Decision(True, 5, 4, 3600.0, 0.0)
    for i in range(ANSWERS + 100):
        ledger.note(f"rw:{{|{i}}}:{limit.suffix}", answer)
        ledger.owe([f"rw:{{|{i}}}:{limit.suffix}"], [limit], [1.0], answer)
    assert len(ledger.answers) <= ANSWERS and len(ledger.owed) == OWED and ledger.dropped == 100
    long_key = "rw:{|" + "k" * 200 + "}:" + limit.suffix
    ledger.note(long_key, answer)
    assert ledger.last_remaining(long_key, time.monotonic()) == 4
