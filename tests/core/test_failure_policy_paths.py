"""Failure edges found by trying the package (issue 11): a delay rule when the store fails, WebSocket
messages under fail-closed, custom 429 answers keeping their headers, and ``Breaker.adjust``."""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest
from starlette.responses import PlainTextResponse

from ratewarden import Decision, Limiter, MemoryStore, RateLimitMiddleware, Rule, Store, StoreError
from ratewarden.charges import adjust
from ratewarden.delay import Delay
from ratewarden.keys import header
from ratewarden.limits import Limit, make_limits
from ratewarden.policy import PolicyMiddleware, PolicyRule
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.redis import RedisStore
from tests.core.asgi import request
from tests.policy.apps import build_app
from tests.servers import RedisStandalone


class FlakyStore(Store):
    """A remote-style store (answers with a coroutine) over a ``MemoryStore`` that goes down
    after ``up_for`` checks."""

    def __init__(self, up_for: int) -> None:
        self.memory = MemoryStore()
        self.up_for = up_for
        self.hits = 0

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.hits += 1
        if self.hits > self.up_for:
            raise StoreError("store went down")
        return await self.memory.hit(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self.memory.peek(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        await self.memory.reset(keys)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        if self.hits >= self.up_for:
            raise StoreError("store is down")
        return await adjust(self.memory, keys, limits, amounts)


def _delayed_app(on_error: str) -> tuple[PolicyMiddleware, Delay, FlakyStore]:
    # One request per 0.25 s: the second one is delayed; the store fails on its re-check.
    delay = Delay(max_wait=2.0, burst=5)
    rule = PolicyRule("/export", "1/250ms", algorithm="gcra", key=header("X-Client"), name="export", delay=delay)
    store = FlakyStore(up_for=2)
    app = PolicyMiddleware(build_app(), Limiter(store, on_error=on_error), [rule])  # type: ignore[arg-type]
    return app, delay, store


async def test_delay_recheck_failing_under_fail_closed_answers_503_not_500() -> None:
    app, delay, store = _delayed_app("closed")
    first = await request(app, "/export", headers=[("X-Client", "a")])
    second = await request(app, "/export", headers=[("X-Client", "a")])
    assert first.status == 200
    assert second.status == 503
    assert second.header("retry-after") == "1"
    assert store.hits == 3  # the check, the denial and the failed re-check
    assert delay.delayed == 0 and delay.waiting == 0


async def test_delay_recheck_failing_under_fail_open_serves_and_is_not_counted_as_delayed() -> None:
    app, delay, store = _delayed_app("open")
    first = await request(app, "/export", headers=[("X-Client", "a")])
    second = await request(app, "/export", headers=[("X-Client", "a")])
    assert (first.status, second.status) == (200, 200)
    assert store.hits == 3
    # Fail-open let the request through; it was not "delayed then served" by the limiter.
    assert delay.delayed == 0 and delay.waiting == 0


async def _websocket_session(app: Any, messages: list[str]) -> list[MutableMapping[str, Any]]:
    """Connect, send ``messages``, disconnect; returns what the middleware and app sent."""
    incoming: list[MutableMapping[str, Any]] = [{"type": "websocket.connect"}]
    incoming += [{"type": "websocket.receive", "text": m} for m in messages]
    incoming.append({"type": "websocket.disconnect", "code": 1000})
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/ws", "headers": [], "client": ("203.0.113.9", 1), "query_string": b""}
    await app(scope, receive, send)
    return sent


async def test_websocket_messages_do_not_reach_the_app_while_the_store_is_down_under_fail_closed() -> None:
    seen: list[str] = []

    async def chat(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            seen.append(message["text"])

    store = FlakyStore(up_for=1)
    app = RateLimitMiddleware(chat, Limiter(store, on_error="closed"), [Rule("/ws", message_rate="100/s")])
    sent = await _websocket_session(app, ["one", "two", "three"])
    assert seen == ["one"]  # the store answered the first message only
    closes = [m for m in sent if m["type"] == "websocket.close"]
    assert len(closes) == 1 and closes[0]["code"] == 1013  # try again later


async def test_websocket_messages_still_flow_under_fail_open() -> None:
    seen: list[str] = []

    async def chat(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            seen.append(message["text"])

    app = RateLimitMiddleware(chat, Limiter(FlakyStore(up_for=1)), [Rule("/ws", message_rate="100/s")])
    sent = await _websocket_session(app, ["one", "two"])
    assert seen == ["one", "two"]
    assert not [m for m in sent if m["type"] == "websocket.close"]


def _slow_down(scope: Any, decision: Decision) -> PlainTextResponse:
    return PlainTextResponse("slow down", 429)


def _slow_down_with_retry(scope: Any, decision: Decision) -> PlainTextResponse:
    return PlainTextResponse("slow down", 429, headers={"Retry-After": "99"})


@pytest.mark.parametrize("middleware", [RateLimitMiddleware, PolicyMiddleware])
async def test_custom_on_limit_answer_keeps_retry_after_and_rate_limit_headers(middleware: Any) -> None:
    app = middleware(build_app(), Limiter(MemoryStore()), [Rule("/api/**", "1/min")], on_limit=_slow_down)
    assert (await request(app, "/api/x")).status == 200
    reply = await request(app, "/api/x")
    assert reply.status == 429 and reply.body == b"slow down"
    retry = reply.headers_named("retry-after")
    assert len(retry) == 1 and 1 <= int(retry[0]) <= 60
    assert reply.header("ratelimit-policy") is not None and reply.header("ratelimit") is not None
    assert reply.header("x-ratelimit-remaining") == "0"


@pytest.mark.parametrize("middleware", [RateLimitMiddleware, PolicyMiddleware])
async def test_custom_on_limit_headers_are_not_duplicated(middleware: Any) -> None:
    app = middleware(build_app(), Limiter(MemoryStore()), [Rule("/api/**", "1/min")], on_limit=_slow_down_with_retry,
                     headers="on_limit", header_style="legacy")
    await request(app, "/api/x")
    reply = await request(app, "/api/x")
    assert reply.status == 429
    assert reply.headers_named("retry-after") == ["99"]  # the handler's own value wins
    assert reply.headers_named("x-ratelimit-limit") == ["1"]
    assert reply.header("ratelimit") is None  # header_style="legacy"


async def _breaker_adjust_roundtrip(store: Store) -> None:
    limits = make_limits("5/min", "fixed_window", "t")
    key = f"rw:{{t|{uuid.uuid4().hex}}}:x"
    breaker = Breaker(store)
    assert (await breaker.hit([key], limits, [1.0])).remaining == 4
    penalised = await adjust(breaker, [key], limits, [3.0])
    assert penalised[0].remaining == 1
    refunded = await adjust(breaker, [key], limits, [-2.0])
    assert refunded[0].remaining == 3
    assert (await store.peek([key], limits))[0].remaining == 3


async def test_breaker_adjusts_through_to_the_memory_store() -> None:
    await _breaker_adjust_roundtrip(MemoryStore())


async def test_breaker_adjusts_through_to_redis(request: pytest.FixtureRequest) -> None:
    server: RedisStandalone = request.getfixturevalue("redis_standalone")
    store = RedisStore(server.url, timeout=5)
    try:
        await _breaker_adjust_roundtrip(store)
    finally:
        await store.close()


async def test_breaker_adjust_uses_the_fallback_while_the_store_is_down() -> None:
    limits = make_limits("5/min", "fixed_window", "t")
    fallback = MemoryStore()
    breaker = Breaker(FlakyStore(up_for=0), fallback=fallback)
    assert (await adjust(breaker, ["k"], limits, [2.0]))[0].remaining == 3
    assert (await fallback.peek(["k"], limits))[0].remaining == 3


def _raising_key(scope: Any) -> str:
    raise RuntimeError("key function bug")


@pytest.mark.parametrize(("on_error", "status"), [("open", 200), ("closed", 503)])
async def test_a_raising_ban_key_function_follows_the_failure_policy(on_error: str, status: int) -> None:
    from ratewarden.bans import Bans

    bans = Bans(after=1, duration=60, key=_raising_key)
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore(), on_error=on_error),  # type: ignore[arg-type]
                           [Rule("/api/**", "1/min")], bans=bans)
    first = await request(app, "/api/x")
    second = await request(app, "/api/x")
    assert first.status == status
    assert second.status == (429 if on_error == "open" else 503)  # limits still apply when open
