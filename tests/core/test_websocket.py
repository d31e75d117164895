"""WebSocket limits: on connect (HTTP 429 or close 1008) and per message (notify or close)."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule, StoreError
from ratewarden.limits import Limit
from tests.vectors.runner import FakeClock


async def echo(ws: WebSocket) -> None:
    await ws.accept()
    while True:
        try:
            text = await ws.receive_text()
        except WebSocketDisconnect:
            return
        await ws.send_text("echo:" + text)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(MemoryStore(clock=clock))


def make_app(limiter: Limiter, rules: list[Rule], **options: Any) -> Starlette:
    from starlette.routing import WebSocketRoute

    app = Starlette(routes=[WebSocketRoute("/ws", echo), WebSocketRoute("/free", echo)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=rules, **options)
    return app


def test_connect_limit_answers_http_429_when_the_server_supports_it(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", "2/min", websocket=True)])
    with TestClient(app) as client:
        for _ in range(2):
            with client.websocket_connect("/ws") as ws:
                ws.send_text("hi")
                assert ws.receive_text() == "echo:hi"
        with pytest.raises(WebSocketDenialResponse) as info, client.websocket_connect("/ws"):
            pass
        denial = info.value
        assert denial.status_code == 429
        assert denial.headers["content-type"] == "application/problem+json"
        assert denial.headers["retry-after"] == "60"
        assert denial.json()["status"] == 429
        # Another path is not limited.
        with client.websocket_connect("/free") as ws:
            ws.send_text("x")
            assert ws.receive_text() == "echo:x"


def test_connect_limit_closes_with_1008_when_asked(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", "1/min", websocket=True)], websocket_deny="close")
    with TestClient(app) as client:
        with client.websocket_connect("/ws"):
            pass
        with pytest.raises(WebSocketDisconnect) as info, client.websocket_connect("/ws"):
            pass
        assert info.value.code == 1008


async def test_connect_limit_closes_with_1008_without_the_http_response_extension(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", "1/min", websocket=True)])

    async def connect() -> list[MutableMapping[str, Any]]:
        sent: list[MutableMapping[str, Any]] = []
        incoming = [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}]

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "path": "/ws",
            "raw_path": b"/ws",
            "root_path": "",
            "query_string": b"",
            "headers": [],
            "client": ("198.51.100.1", 1),
            "server": ("testserver", 80),
            "subprotocols": [],
            "scheme": "ws",
        }
        await app(scope, receive, send)
        return sent

    first = await connect()
    assert first[0]["type"] == "websocket.accept"
    second = await connect()
    assert [m["type"] for m in second] == ["websocket.close"]
    assert second[0]["code"] == 1008


def test_message_limit_notifies_and_keeps_the_connection_open(limiter: Limiter, clock: FakeClock) -> None:
    app = make_app(limiter, [Rule("/ws", message_rate="3/min")])
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        for i in range(3):
            ws.send_text(f"m{i}")
            assert ws.receive_text() == f"echo:m{i}"
        clock.advance(15.0)
        ws.send_text("too many")
        notice = json.loads(ws.receive_text())
        assert notice["type"] == "rate_limit"
        assert notice["retry_after"] == pytest.approx(45.0)
        ws.send_text("still too many")
        assert json.loads(ws.receive_text())["type"] == "rate_limit"
        # The connection stayed open: once the window passes, messages flow again.
        clock.advance(45.0)
        ws.send_text("later")
        assert ws.receive_text() == "echo:later"


def test_message_limit_can_close_with_1008(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", message_rate="2/min")], websocket_on_message_limit="close")
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        for i in range(2):
            ws.send_text(str(i))
            assert ws.receive_text() == f"echo:{i}"
        ws.send_text("over")
        with pytest.raises(WebSocketDisconnect) as info:
            ws.receive_text()
        assert info.value.code == 1008


def test_connect_and_message_limits_together(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", "1/min", message_rate="1/min")])
    with TestClient(app) as client:
        with client.websocket_connect("/ws") as ws:
            ws.send_text("a")
            assert ws.receive_text() == "echo:a"
            ws.send_text("b")
            assert json.loads(ws.receive_text())["type"] == "rate_limit"
        with pytest.raises(WebSocketDenialResponse), client.websocket_connect("/ws"):
            pass


def test_http_rules_do_not_limit_websockets_and_back(limiter: Limiter) -> None:
    app = make_app(limiter, [Rule("/ws", "1/min"), Rule("/free", "1/min", websocket=True)])
    with TestClient(app) as client:
        for _ in range(3):
            with client.websocket_connect("/ws") as ws:
                ws.send_text("x")
                assert ws.receive_text() == "echo:x"


def test_bad_websocket_options(limiter: Limiter) -> None:
    with pytest.raises(ValueError, match="websocket_deny"):
        make_app(limiter, [], websocket_deny="maybe").build_middleware_stack()
    with pytest.raises(ValueError, match="websocket_on_message_limit"):
        make_app(limiter, [], websocket_on_message_limit="ignore").build_middleware_stack()


class DownStore(MemoryStore):
    local = False

    async def hit(self, keys: Any, limits: Any, costs: Any) -> Any:
        raise StoreError("down")


def test_websocket_failure_policy() -> None:
    open_app = make_app(Limiter(DownStore(), fallback=None), [Rule("/ws", "1/min", message_rate="1/min")])
    with TestClient(open_app) as client, client.websocket_connect("/ws") as ws:
        for _ in range(3):
            ws.send_text("x")
            assert ws.receive_text() == "echo:x"
    # With the insurance limiter (the default), the local limiter limits the messages instead.
    insured = make_app(Limiter(DownStore()), [Rule("/ws", "1/min", message_rate="1/min")])
    with TestClient(insured) as client, client.websocket_connect("/ws") as ws:
        ws.send_text("x")
        assert ws.receive_text() == "echo:x"
        ws.send_text("y")
        assert json.loads(ws.receive_text())["type"] == "rate_limit"
    closed_app = make_app(Limiter(DownStore(), on_error="closed"), [Rule("/ws", "1/min", websocket=True)])
    with (
        TestClient(closed_app) as client,
        pytest.raises(WebSocketDenialResponse) as info,
        client.websocket_connect("/ws"),
    ):
        pass
    assert info.value.status_code == 503


def test_limit_suffix_is_separate_for_messages(limiter: Limiter) -> None:
    # The connection and message limits of one rule never share a counter.
    rule = Rule("/ws", "5/min", message_rate="5/min")
    assert isinstance(rule.message_limits[0], Limit)
    assert rule.limits[0].name != rule.message_limits[0].name
