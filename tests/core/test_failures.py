"""Failure policy: a key function or store that fails is logged and fails open (default) or closed
(503) — never a 500, and routes without a rule never notice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ratewarden import Decision, Limiter, MemoryStore, RateLimitMiddleware, Rule, StoreError
from ratewarden.fastapi import RateLimit, install
from ratewarden.keys import header
from ratewarden.limits import Limit
from ratewarden.starlette import limit
from tests.core.asgi import request


class BrokenStore:
    """A remote store that is down."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.calls += 1
        raise self.error

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        raise self.error

    async def reset(self, keys: Sequence[str]) -> None:
        raise self.error


class SlowStore(BrokenStore):
    """A store whose server never answers; like the real remote stores it bounds its own wait."""

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.calls += 1
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 0.05)
        except asyncio.TimeoutError:
            raise StoreError("timed out after 0.05 s") from None
        raise AssertionError("unreachable")


class BrokenLocalStore(MemoryStore):
    """A local store (the middleware's no-coroutine fast path) that raises."""

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise MemoryError("out of memory")


def failing_key(scope: MutableMapping[str, Any]) -> str:
    raise KeyError("no such header")


async def failing_async_key(scope: MutableMapping[str, Any]) -> str:
    await asyncio.sleep(0)
    raise RuntimeError("auth service down")


def failing_cost(scope: MutableMapping[str, Any]) -> float:
    raise ValueError("bad cost")


STORES = {
    "store error": lambda: BrokenStore(StoreError("connection refused")),
    "store crash": lambda: BrokenStore(RuntimeError("protocol error")),
    "store timeout": lambda: SlowStore(StoreError("")),
    "local store crash": lambda: BrokenLocalStore(),
}
RULES = {
    "sync key raises": lambda: Rule("/limited/**", "5/min", key=failing_key),
    "async key raises": lambda: Rule("/limited/**", "5/min", key=failing_async_key),
    "cost raises": lambda: Rule("/limited/**", "5/min", cost=failing_cost),
}


@pytest.fixture(autouse=True)
def unthrottled_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # Failures are logged at most once a second; let every test see its own log line.
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)


async def inner(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await PlainTextResponse("served")(scope, receive, send)


def cases() -> list[tuple[str, Any, Any]]:
    out = [(name, make, lambda: Rule("/limited/**", "5/min")) for name, make in STORES.items()]
    out += [(name, MemoryStore, make) for name, make in RULES.items()]
    return out


@pytest.mark.parametrize(("name", "make_store", "make_rule"), cases(), ids=[c[0] for c in cases()])
async def test_fail_open_by_default(
    name: str, make_store: Any, make_rule: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = Limiter(make_store())
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[make_rule()])
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        replies = [await request(app, "/limited/x") for _ in range(8)]
    # A store's StoreError, and a store that crashed (any other exception, a plain MemoryStore's
    # too): the limiter's local insurance limiter decides (5/min). A key or cost function that
    # raises: key-error:<client address> is charged, or the rule's own cost: still 5/min.
    assert [r.status for r in replies] == [200] * 5 + [429] * 3
    if name.endswith("crash"):
        assert limiter.without_store()["local_limiter"] == 8
        crash = "RuntimeError: protocol error" if name == "store crash" else "MemoryError: out of memory"
        assert any(crash in rec.getMessage() for rec in caplog.records)  # logged with its type
    assert all(r.body == b"served" for r in replies if r.status == 200)
    assert any("rate limit check failed" in rec.getMessage() for rec in caplog.records)
    assert (await request(app, "/unrelated")).status == 200


@pytest.mark.parametrize(("name", "make_store", "make_rule"), cases(), ids=[c[0] for c in cases()])
async def test_fail_open_without_the_insurance_limiter_lets_everything_through(
    name: str, make_store: Any, make_rule: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = Limiter(make_store(), fallback=None)
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[make_rule()])
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        replies = [await request(app, "/limited/x") for _ in range(8)]
    if name.endswith("key raises") or name == "cost raises":  # no store failure: the fallback is charged
        assert [r.status for r in replies] == [200] * 5 + [429] * 3
    else:
        assert [r.status for r in replies] == [200] * 8
    assert all(r.body == b"served" for r in replies if r.status == 200)
    assert any("rate limit check failed" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize(("name", "make_store", "make_rule"), cases(), ids=[c[0] for c in cases()])
async def test_fail_closed_gives_503(name: str, make_store: Any, make_rule: Any) -> None:
    limiter = Limiter(make_store(), on_error="closed")
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[make_rule()])
    if name == "cost raises":  # nothing failed to answer: the rule's own cost is charged
        assert [(await request(app, "/limited/x")).status for _ in range(6)] == [200] * 5 + [429]
        return
    reply = await request(app, "/limited/x")
    assert reply.status == 503
    assert reply.header("content-type") == "application/problem+json"
    assert reply.header("retry-after") == "1"
    assert reply.json()["status"] == 503
    unrelated = await request(app, "/unrelated")
    assert (unrelated.status, unrelated.body) == (200, b"served")


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_several_rules_with_a_failing_store(on_error: str) -> None:
    limiter = Limiter(BrokenStore(StoreError("down")), on_error=on_error)  # type: ignore[arg-type]
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[Rule("/**", "5/min"), Rule("/limited/**", "1/min")])
    assert (await request(app, "/limited/x")).status == (200 if on_error == "open" else 503)


def fastapi_app(limiter: Limiter, key: Any = None) -> FastAPI:
    options = {"key": key} if key is not None else {}
    app = FastAPI()
    install(app)

    @app.get("/limited", dependencies=[Depends(RateLimit("5/min", limiter=limiter, **options))])
    async def limited() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/unrelated")
    def unrelated() -> dict[str, bool]:
        return {"ok": True}

    return app


@pytest.mark.parametrize("on_error", ["open", "closed"])
@pytest.mark.parametrize("failure", ["store", "key"])
async def test_dependency_failure_policy(on_error: str, failure: str) -> None:
    store = BrokenStore(StoreError("down")) if failure == "store" else MemoryStore()
    limiter = Limiter(store, on_error=on_error)  # type: ignore[arg-type]
    app = fastapi_app(limiter, failing_key if failure == "key" else None)
    reply = await request(app, "/limited")
    assert reply.status == (200 if on_error == "open" else 503)
    if on_error == "closed":
        assert reply.header("retry-after") == "1"
    assert (await request(app, "/unrelated")).status == 200


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_decorator_failure_policy(on_error: str) -> None:
    limiter = Limiter(BrokenStore(StoreError("down")), on_error=on_error)  # type: ignore[arg-type]

    @limit("5/min", limiter=limiter)
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse("served")

    from starlette.applications import Starlette
    from starlette.routing import Route

    app = Starlette(routes=[Route("/limited", endpoint)])
    reply = await request(app, "/limited")
    assert reply.status == (200 if on_error == "open" else 503)


async def test_store_recovers_after_an_outage() -> None:
    class Flaky(MemoryStore):
        local = False  # behave like a remote store
        down = True

        async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
            if self.down:
                raise StoreError("down")
            return self.hit_now(keys, limits, costs)

    store = Flaky()
    app = RateLimitMiddleware(inner, limiter=Limiter(store), rules=[Rule("/**", "2/min")])
    # Down: the local insurance limiter decides; back: the store decides, with its own counts.
    assert [(await request(app, "/x")).status for _ in range(5)] == [200] * 2 + [429] * 3
    store.down = False
    assert [(await request(app, "/x")).status for _ in range(3)] == [200, 200, 429]


async def test_sync_key_with_async_fallback_is_awaited() -> None:
    """A sync key function may return an awaitable (here: header() falling back to an async key)."""

    async def account(scope: MutableMapping[str, Any]) -> str:
        return "acct-1"

    limiter = Limiter(MemoryStore())
    rule = Rule("/**", "2/min", key=header("X-API-Key", fallback=account))
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[rule])
    # Different peers, no header: the async fallback puts them all on one account.
    statuses = [(await request(app, "/x", client=(f"198.51.100.{i}", 1))).status for i in range(3)]
    assert statuses == [200, 200, 429]


class HangingStore(BrokenStore):
    """A store that never answers and does not bound its own wait."""

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.calls += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_hanging_store_behind_a_breaker_timeout(on_error: str) -> None:
    from ratewarden.stores.breaker import Breaker

    hanging = HangingStore(StoreError(""))
    limiter = Limiter(Breaker(hanging, timeout=0.05, failures=2, cooldown=60), on_error=on_error)  # type: ignore[arg-type]
    app = RateLimitMiddleware(inner, limiter=limiter, rules=[Rule("/limited/**", "5/min")])
    replies = await asyncio.wait_for(asyncio.gather(*(request(app, "/limited/x") for _ in range(4))), 5)
    assert [r.status for r in replies] == [200 if on_error == "open" else 503] * 4
    # Once the breaker opened, later requests do not wait for the dead store at all.
    calls = hanging.calls
    reply = await request(app, "/limited/x")
    assert reply.status == (200 if on_error == "open" else 503)
    assert hanging.calls == calls
    assert (await request(app, "/unrelated")).status == 200
