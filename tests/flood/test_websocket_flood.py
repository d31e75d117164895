"""WebSocket message limits hold while the app is flooded: 1,000 HTTP connections keep the event loop
behind (wrk on ``/a``) while 50 WebSocket connections from the same client send 600 messages against a
``100/hour`` message limit; exactly 100 reach the handler, on every remote store."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
import websockets

from tests.flood.load import app_server, clear_of_window_edge, flood, raise_fd_limit
from tests.servers import have

LIMIT = 100
SOCKETS, MESSAGES = 50, 12  # 600 messages against 100


async def _chat(port: int) -> dict[str, int]:
    """Every socket sends its messages, each after the answer to the last (an echo or a rate_limit
    notice): what the client saw, by kind."""
    seen = {"echo": 0, "rate_limit": 0, "other": 0}

    async def one(n: int) -> None:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws", open_timeout=30, close_timeout=5) as ws:
            for i in range(MESSAGES):
                text = f"m{n}-{i}"
                await ws.send(text)
                answer = await asyncio.wait_for(ws.recv(), 30)
                if answer == text:
                    seen["echo"] += 1
                elif isinstance(answer, str) and json.loads(answer).get("type") == "rate_limit":
                    seen["rate_limit"] += 1
                else:
                    seen["other"] += 1

    await asyncio.gather(*(one(n) for n in range(SOCKETS)))
    return seen


@pytest.mark.parametrize("store", ["redis_standalone", "redis_cluster", "memcached_server"])
def test_websocket_messages_are_exact_under_a_flood(request: pytest.FixtureRequest, store: str) -> None:
    if not have("wrk"):
        pytest.fail("wrk is not installed: run scripts/install-system-deps.sh (make setup does)")
    raise_fd_limit()
    url = request.getfixturevalue(store).url
    clear_of_window_edge(3600, 30)
    with app_server(url, "middleware", f"{LIMIT}/hour", f"wsflood{uuid.uuid4().hex[:8]}") as app:
        seen: dict[str, int] = {}
        errors: list[BaseException] = []

        def chat() -> None:
            try:
                seen.update(asyncio.run(_chat(app.port)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        chatting = threading.Thread(target=chat)
        before = app.counts()["admitted"]["/ws"]
        result = flood(app, 1000, 4.0, during=chatting.run)
        after = app.counts()["admitted"]["/ws"]
        log = app.log()
    assert not errors, errors
    admitted = after - before
    described = (f"ws admitted {admitted}, client saw {seen}; http {result.statuses}, without store {result.without_store}"
                 f"\napp log:\n{log}")
    assert admitted == LIMIT, described
    assert seen == {"echo": LIMIT, "rate_limit": SOCKETS * MESSAGES - LIMIT, "other": 0}, described
    assert 500 not in result.statuses, described
