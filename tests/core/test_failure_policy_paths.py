"""The failure policy beyond the main check: a store or key function that fails while a delayed
request is re-checked, while WebSocket messages are checked, or while a ban key is computed answers
as ``on_error`` says (fail open: served; fail closed: 503 / close 1013), never with a 500."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.keys import header
from ratewarden.policy import PolicyMiddleware, PolicyRule
from ratewarden.policy.bans import Bans
from ratewarden.policy.delay import Delay
from tests.core.asgi import request
from tests.policy.apps import build_app
from tests.stores.helpers import FlakyStore


def _delayed_app(on_error: str, fallback: str | None = "local") -> tuple[PolicyMiddleware, Delay, FlakyStore]:
    # One request per 0.25 s: the second one is delayed; the store fails on its re-check.
    delay = Delay(max_wait=2.0, burst=5)
    rule = PolicyRule("/export", "1/250ms", algorithm="gcra", key=header("X-Client"), name="export", delay=delay)
    store = FlakyStore(up_for=2)
    limiter = Limiter(store, on_error=on_error, fallback=fallback)  # type: ignore[arg-type]
    app = PolicyMiddleware(build_app(), limiter, [rule])
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


async def test_delay_recheck_failing_under_fail_open_is_decided_by_the_insurance_limiter() -> None:
    app, delay, store = _delayed_app("open")
    first = await request(app, "/export", headers=[("X-Client", "a")])
    second = await request(app, "/export", headers=[("X-Client", "a")])
    assert (first.status, second.status) == (200, 200)
    assert store.hits == 3
    # The local limiter (no count of "a" yet) allowed the re-check: delayed, then served.
    assert delay.delayed == 1 and delay.waiting == 0
    assert app.limiter.without_store()["local_limiter"] == 1


async def test_delay_recheck_failing_under_fail_open_serves_and_is_not_counted_as_delayed() -> None:
    app, delay, store = _delayed_app("open", fallback=None)
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


def broken_key(scope: MutableMapping[str, Any]) -> str:
    raise RuntimeError("key service down")


async def endpoint(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_a_ban_key_function_that_raises_follows_the_failure_policy(
    on_error: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to escape PolicyMiddleware as an HTTP 500 under either policy."""
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)
    limiter = Limiter(MemoryStore(), on_error=on_error)  # type: ignore[arg-type]
    bans = Bans(after=1, within=60, duration=60, key=broken_key)
    app = PolicyMiddleware(endpoint, limiter, [Rule("/x", "1/hour")], bans=bans)
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        replies = [await request(app, "/x") for _ in range(3)]
    if on_error == "open":
        # No ban check and no strike: the rule itself still limits.
        assert [r.status for r in replies] == [200, 429, 429]
    else:
        assert [r.status for r in replies] == [503] * 3
    assert any("ban key function" in r.getMessage() for r in caplog.records)
    assert (await request(app, "/unrelated")).status == 200
