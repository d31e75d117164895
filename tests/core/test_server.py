"""A real uvicorn server on a free loopback port serving the README example: limits, headers,
streaming and WebSocket denial over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import websockets
from starlette.responses import StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ratewarden import RateLimitMiddleware, Rule
from tests.readme import first_example, run_block
from tests.servers import uvicorn_in_thread
from tests.vectors.runner import FakeClock

CHUNKS = 200
CHUNK = bytes(range(256)) * 4  # 1 KiB with every byte value


def build_app() -> tuple[Any, Any]:
    ns = run_block(first_example())
    app, limiter = ns["app"], ns["limiter"]
    limiter.store.clock = FakeClock(6000.0)  # exact counts, whatever the wall clock does

    @app.get("/api/stream")
    async def stream() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(CHUNKS):
                yield CHUNK
                await asyncio.sleep(0)

        return StreamingResponse(body(), media_type="application/octet-stream")

    @app.get("/api/ping")
    async def ping() -> dict[str, bool]:
        return {"pong": True}

    @app.websocket("/ws")
    async def ws_echo(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            return

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[Rule("/ws", "1/min", websocket=True)])
    return app, limiter


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Any]]:
    app, limiter = build_app()
    with uvicorn_in_thread(app, ws="websockets") as port:
        yield f"127.0.0.1:{port}", limiter


@pytest.fixture
def base(server: tuple[str, Any]) -> Iterator[str]:
    address, limiter = server
    limiter.clear_sync()
    yield f"http://{address}"


def test_limits_and_headers_over_http(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as client:
        replies = [client.get("/items") for _ in range(12)]
    assert [r.status_code for r in replies] == [200] * 10 + [429, 429]
    first = replies[0]
    assert first.json() == {"ok": True}
    assert first.headers["x-ratelimit-limit"] == "10"
    assert first.headers["x-ratelimit-remaining"] == "9"
    assert first.headers["ratelimit-policy"].endswith(";q=10;w=1")
    assert first.headers["ratelimit"].endswith(";r=9;t=1")
    limited = replies[10]
    assert limited.headers["retry-after"] == "1"
    assert limited.headers["x-ratelimit-remaining"] == "0"


def test_middleware_rule_over_http(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as client:
        codes = [client.get("/api/ping").status_code for _ in range(101)]
        assert codes == [200] * 100 + [429]
        limited = client.get("/api/ping")
    assert limited.headers["content-type"] == "application/problem+json"
    assert limited.json()["status"] == 429
    assert limited.headers["ratelimit-policy"] == '"/api/**";q=100;w=60'


def test_streaming_response_arrives_intact(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as client, client.stream("GET", "/api/stream") as response:
        assert response.status_code == 200
        assert response.headers["x-ratelimit-remaining"] == "99"
        assert response.headers.get("content-length") is None  # still streamed, not buffered
        body = b"".join(response.iter_bytes())
    assert body == CHUNK * CHUNKS


def test_concurrent_requests_over_http(base: str) -> None:
    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=base, timeout=20, limits=limits) as client:
            replies = await asyncio.gather(*(client.get("/api/ping") for _ in range(150)))
        return [r.status_code for r in replies]

    codes = asyncio.run(burst())
    assert (codes.count(200), codes.count(429)) == (100, 50)


def test_websocket_connect_denied_over_http(base: str) -> None:
    url = base.replace("http://", "ws://") + "/ws"

    async def scenario() -> int:
        async with websockets.connect(url) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            async with websockets.connect(url):
                pass
        return info.value.response.status_code

    assert asyncio.run(scenario()) == 429
