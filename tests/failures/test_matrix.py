"""The failure matrix: every integration x store x fault x failure policy, on real servers.

For every cell: no 500; every request answered within its bound (store round trips x the store
timeout + ``SLACK``); fail-closed lets nothing reach the app, fail-open lets everything through
and is logged and counted (``ratewarden_store_errors_total``); a refused request is not charged
(after the fault, the same client still gets exactly ``LIMIT``); and exact limiting resumes
(a new client: ``LIMIT + 2`` requests, exactly ``LIMIT`` served). See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest

from ratewarden import Limiter
from ratewarden.limits import make_limits
from ratewarden.metrics import Metrics
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.redis import RedisStore
from tests.failures.harness import (
    APPLICABLE,
    FAULTS,
    INTEGRATIONS,
    LIMIT,
    MAX_WAIT,
    SLACK,
    Backend,
    Driver,
    Fault,
    Slow,
    breaker_of,
    cluster_ok,
    memory_backend,
)
from tests.timing import Stopwatch

FAULT_REQUESTS = 3  # requests sent while the fault lasts
TIMEOUT = 0.1  # store timeout (Redis standalone, Sentinel, Memcached)
CLUSTER_TIMEOUT = 0.2  # cluster checks go through redis-py's slot routing


@pytest.fixture(scope="session")
def backends(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Backends built on first use, so a run of one column starts only its servers."""
    built: dict[str, Backend] = {}

    def get(name: str) -> Backend:
        if name in built:
            return built[name]
        if name == "memory":
            backend = memory_backend()
        elif name in ("redis", "breaker"):
            server = request.getfixturevalue("redis_standalone")
            make = (lambda: breaker_of(RedisStore(server.url, timeout=TIMEOUT))) if name == "breaker" else (
                lambda: RedisStore(server.url, timeout=TIMEOUT)
            )
            backend = Backend(name, TIMEOUT, make, [server.server], [server.port], fallback=name == "breaker")
        elif name == "sentinel":
            setup = request.getfixturevalue("matrix_sentinel")
            primary = setup.primary
            backend = Backend(name, TIMEOUT, lambda: RedisStore(setup.url, timeout=TIMEOUT), [primary], [primary.port])
        elif name == "cluster":
            cluster = request.getfixturevalue("redis_cluster")
            primaries = set(cluster.primaries())
            servers = [s for s in cluster.servers if s.port in primaries]
            backend = Backend(
                name, CLUSTER_TIMEOUT, lambda: RedisStore(cluster.url, timeout=CLUSTER_TIMEOUT), servers,
                sorted(primaries), after_restart=cluster_ok(cluster.ports),
            )
        else:
            server = request.getfixturevalue("memcached_server")
            backend = Backend(name, TIMEOUT, lambda: MemcachedStore(server.url, timeout=TIMEOUT), [server.server])
        built[name] = backend
        return backend

    return {"get": get}


def cells() -> list[Any]:
    out = []
    for backend, faults in APPLICABLE.items():
        for fault in faults:
            for integration in INTEGRATIONS:
                for on_error in ("open", "closed"):
                    out.append(pytest.param(integration, backend, fault, on_error,
                                            id=f"{integration}-{backend}-{fault}-{on_error}"))
    return out


class ChargedWhileRefused(AssertionError):
    """Requests answered during a fault were charged on the server afterwards."""


@pytest.fixture(autouse=True)
def unthrottled_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # Failures are logged at most once a second; let every cell see its own log line.
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)


# A slow fault on a starved machine may not bite (every reply within the wait a busy loop is allowed):
# it is tried again, this many times in all, before its cell fails.
SLOW_ATTEMPTS = 3


def check_failures(metrics: Metrics) -> float:
    return sum(
        s.value for m in metrics.registry.collect() if m.name.endswith("check_failures")
        for s in m.samples if s.labels.get("what") != "shadow rule"
    )


def store_errors(metrics: Metrics) -> float:
    return sum(s.value for m in metrics.store_errors.collect() for s in m.samples if s.name.endswith("_total"))


async def until_reachable(limiter: Limiter, deadline: float = 10.0) -> None:
    """After a fault: wait until the store answers again (and a breaker has closed)."""
    (probe,) = make_limits("1000/hour", "gcra")
    store = limiter.store
    inner = getattr(store, "inner", store)
    started = time.monotonic()
    while True:
        try:
            await store.peek([f"{limiter.prefix}:{{probe|p}}:{probe.suffix}"], [probe])
            if not isinstance(inner, Breaker) or inner.state == "closed":
                return
        except Exception:
            pass
        assert time.monotonic() - started < deadline, "the store did not come back"
        await asyncio.sleep(0.05)


async def timed(coro: Any) -> tuple[str, float]:
    started = time.perf_counter()
    try:
        outcome = await coro
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a crash is an outcome we report, not a test error
        outcome = f"error {exc!r}"
    return outcome, time.perf_counter() - started


async def serve_count(driver: Driver, client: str, n: int) -> list[str]:
    return [await driver.attempt(client) for _ in range(n)]


async def run_fault(
    driver: Driver, backend: Backend, fault: Fault, boom: bool, waiters: list[asyncio.Task[str]], bound: float, client: str
) -> list[tuple[str, float]]:
    """Send ``FAULT_REQUESTS`` requests while ``fault`` lasts; their outcomes and times (then the waiters')."""
    if boom:
        return [await timed(driver.attempt(client, boom=True)) for _ in range(FAULT_REQUESTS)]
    fault.begin(backend)
    try:
        if fault.mode == "cancel":
            tasks = [asyncio.ensure_future(driver.attempt(client)) for _ in range(FAULT_REQUESTS)]
            await asyncio.sleep(0.02)
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
            with Stopwatch() as clock:
                for t in tasks:
                    t.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results), results
            assert clock.within(SLACK), f"cancelled checks took too long to end: {clock}"
            return []
        # Held until every request sent during the fault is answered, or clearly hangs.
        pending = [asyncio.ensure_future(timed(driver.attempt(client))) for _ in range(FAULT_REQUESTS)]
        pending += [asyncio.ensure_future(timed(w)) for w in waiters]
        await asyncio.sleep(0)  # the requests write their first round trip
        fault.sent(backend)
        await asyncio.wait(pending, timeout=bound + MAX_WAIT + 0.3)
    finally:
        fault.end(backend)
    return list(await asyncio.wait_for(asyncio.gather(*pending), 10))


@pytest.mark.parametrize(("integration", "backend_name", "fault_name", "on_error"), cells())
async def test_cell(
    integration: str, backend_name: str, fault_name: str, on_error: str,
    backends: dict[str, Any], caplog: pytest.LogCaptureFixture,
) -> None:
    backend: Backend = backends["get"](backend_name)
    fault: Fault = FAULTS[fault_name]()
    metrics = Metrics(otel=False)
    store = backend.make()
    if isinstance(store, Breaker):
        store.store = metrics.instrument(store.store)  # count the failures behind the breaker
    else:
        store = metrics.instrument(store)
    limiter = Limiter(store, on_error=on_error, prefix=f"m{uuid.uuid4().hex[:10]}")  # type: ignore[arg-type]
    driver = INTEGRATIONS[integration](limiter, metrics)
    bound = driver.ops * 2 * backend.timeout + SLACK  # the documented bound: 2 x timeout per store call
    open_ = on_error == "open"
    a, b = "client-a", "client-b"
    try:
        if backend_name != "memory":
            await until_reachable(limiter)
        # --- the fault -------------------------------------------------------------------------
        waiters: list[asyncio.Task[str]] = []
        boom = fault_name == "key-raises"
        if isinstance(fault, Slow):
            fault.round_trips = driver.ops
        if integration == "policy-delay" and fault_name in ("down", "paused", "oom", "readonly"):
            waiters = await driver.before_fault()
        for attempt in range(SLOW_ATTEMPTS):
            calls = driver.calls
            failures_before = check_failures(metrics)
            errors_before = store_errors(metrics)
            with caplog.at_level(logging.INFO, logger="ratewarden"), Stopwatch() as clock:
                timings = await run_fault(driver, backend, fault, boom, waiters, bound, a)
            if not isinstance(fault, Slow) or store_errors(metrics) > errors_before or attempt == SLOW_ATTEMPTS - 1:
                break
            # No reply was late by the product's rule: a starved event loop waits on (stores/deadline.py)
            # and the replies came in time. The fault did not happen; again, with a client of its own.
            a = f"client-a{attempt + 1}"
            fault = Slow()
            fault.round_trips = driver.ops
            caplog.clear()
            await until_reachable(limiter)
        waiter_timings = timings[FAULT_REQUESTS:]
        timings = timings[:FAULT_REQUESTS]
        outcomes = [o for o, _ in timings]
        log = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

        # Never a 500, never a crash.
        assert not [o for o in outcomes + [o for o, _ in waiter_timings] if o.startswith("error")], (outcomes, waiter_timings)
        # Never a hang past the bound (plus what a busy machine made the fault's requests wait for a core).
        slowest = max((t for _, t in timings), default=0.0)
        assert slowest < bound + clock.slack, f"a request took {slowest:.3f}s (bound {bound:.3f}s, {clock}): {timings}"
        for _, elapsed in waiter_timings:
            assert elapsed < MAX_WAIT + bound + clock.slack, f"the delayed request took {elapsed:.3f}s ({clock})"
        if fault.mode == "hold":
            if backend.fallback and not boom:
                # The breaker's local fallback decides: limiting goes on, per process.
                expected = "served"
            else:
                expected = "served" if open_ else "unavailable"
            assert outcomes == [expected] * FAULT_REQUESTS, outcomes
            served = outcomes.count("served") + [o for o, _ in waiter_timings].count("served")
            assert driver.calls - calls == served, "fail-closed let a request or message reach the app"
            for outcome, _ in waiter_timings:  # a delayed request whose re-check met the fault
                if open_ and not backend.fallback:
                    # The insurance limiter is seeded from the store's last answer for the key, which
                    # the waiter found exhausted: it may refuse the re-check, never error or hang.
                    assert outcome in ("served", "limited"), waiter_timings
                else:
                    assert outcome == ("served" if open_ or backend.fallback else "unavailable"), waiter_timings
            # Logged, and (store faults) counted.
            if boom:
                assert any("rate limit check failed" in m for m in log), log
                assert check_failures(metrics) >= failures_before + FAULT_REQUESTS, "key failures not counted"
            else:
                assert store_errors(metrics) > 0, "the store failures were not counted"
                if not backend.fallback:
                    assert any("rate limit check failed" in m for m in log), log
                else:
                    assert any("store_error" in m for m in log), log
        else:
            assert driver.calls == calls, "a cancelled check reached the app"

        # --- after the fault -------------------------------------------------------------------
        if backend_name != "memory":
            await until_reachable(limiter)
        charged_at_most = 0 if not open_ and fault.mode == "hold" else FAULT_REQUESTS
        if backend.fallback and not boom:
            # The fallback charged them: a late charge on the server would count them twice.
            charged_at_most = FAULT_REQUESTS if fault.mode == "cancel" else 0
        calls = driver.calls
        seen_a = await serve_count(driver, a, LIMIT + 2)
        assert not [o for o in seen_a if o.startswith("error")], seen_a
        served_a = seen_a.count("served")
        assert served_a <= LIMIT, f"{served_a} served over a limit of {LIMIT}: {seen_a}"
        if served_a < LIMIT - charged_at_most:
            raise ChargedWhileRefused(
                f"after the fault {a} was served {served_a} of {LIMIT}: requests answered during the fault (refused, "
                f"or served by a fallback) were charged on the server: {seen_a}"
            )
        if integration == "policy-charge":  # refunds work again: a 404 does not count
            assert await driver.attempt(b, status=404) == "served"
        seen_b = await serve_count(driver, b, LIMIT + 2)
        assert seen_b.count("served") == LIMIT, seen_b
        assert set(seen_b[LIMIT:]) <= {"limited", "banned"}, seen_b
        assert driver.calls - calls == served_a + LIMIT + (integration == "policy-charge")
        memcached = getattr(getattr(store, "inner", store), "_locks", None)
        if memcached is not None:
            assert memcached == {}, "a per-key lock is still held"
    finally:
        await driver.close()
        await limiter.close()
