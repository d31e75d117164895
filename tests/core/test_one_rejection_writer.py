"""One rejection writer (issue 22): the middleware, the edge and the policy middleware send the
same default 429 for the same decision; the policy middleware's body adds its documented fields
(``remaining``, and ``group`` when one is shown)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.decision import Decision
from ratewarden.enforcement.answers import rejection
from ratewarden.fastapi import RateLimit, install
from ratewarden.policy import PolicyMiddleware
from tests.core.asgi import Reply, request
from tests.policy.apps import build_app
from tests.vectors.runner import FakeClock

# The default 429 for a 1/min limit named "api", denied at the start of its window (byte for byte).
BODY = (
    b'{"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": "Rate limit of 1 per 60s'
    b' exceeded; retry after 60s.", "policy": "api", "limit": 1, "retry_after": 60}'
)
RATE_HEADERS = [
    (b"ratelimit-policy", b'"api";q=1;w=60'),
    (b"ratelimit", b'"api";r=0;t=60'),
    (b"x-ratelimit-limit", b"1"),
    (b"x-ratelimit-remaining", b"0"),
    (b"x-ratelimit-reset", b"60"),
    (b"retry-after", b"60"),
]


def _limiter() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


async def _second(app: Any, path: str = "/api/x") -> Reply:
    assert (await request(app, path)).status == 200
    return await request(app, path)


def _headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/problem+json"), (b"content-length", b"%d" % len(body)), *RATE_HEADERS]


async def test_middleware_edge_and_policy_middleware_send_the_same_default_429() -> None:
    middleware = RateLimitMiddleware(build_app(), _limiter(), [Rule("/api/**", "1/min", name="api")])
    policy = PolicyMiddleware(build_app(), _limiter(), [Rule("/api/**", "1/min", name="api")])
    api = FastAPI()

    @api.get("/api/x", dependencies=[Depends(RateLimit("1/min", limiter=_limiter(), name="api"))])
    async def endpoint() -> str:
        return "ok"

    install(api)
    replies = {"middleware": await _second(middleware), "edge": await _second(api), "policy": await _second(policy)}
    for name in ("middleware", "edge"):
        reply = replies[name]
        assert (reply.status, reply.body, reply.raw_headers) == (429, BODY, _headers(BODY)), name
    reply = replies["policy"]
    expected = {**json.loads(BODY), "remaining": 0}  # the policy middleware's extra field
    assert reply.status == 429 and json.loads(reply.body) == expected
    assert list(json.loads(reply.body)) == ["type", "title", "status", "detail", "policy", "limit", "remaining",
                                            "retry_after"]
    assert reply.raw_headers == _headers(reply.body)


def test_the_policy_body_is_the_default_with_remaining_and_group() -> None:
    denied = Decision(False, 1, 0, 60.0, 60.0, 60.0, "api")
    assert rejection(denied, "both", True, b'"api";q=1;w=60') == (BODY, _headers(BODY))
    body, headers = rejection(denied, "both", True, None, "gold")
    detail = "Rate limit of 1 per 60s exceeded; retry after 60s (group 'gold')."
    assert json.loads(body) == {**json.loads(BODY), "detail": detail, "remaining": 0, "group": "gold"}
    assert headers == _headers(body)


async def test_a_refused_websocket_handshake_gets_the_default_body_without_rate_limit_headers() -> None:
    app = RateLimitMiddleware(build_app(), _limiter(), [Rule("/ws", "1/min", name="api", websocket=True)])
    scope = {"type": "websocket", "path": "/ws", "headers": [], "client": ("203.0.113.7", 1),
             "extensions": {"websocket.http.response": {}}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def refuse() -> None:
        await app(dict(scope), receive, send)

    await refuse()  # the first connection reaches the app
    sent.clear()
    await refuse()
    assert sent == [
        {"type": "websocket.http.response.start", "status": 429, "headers": [
            (b"content-type", b"application/problem+json"), (b"content-length", b"%d" % len(BODY)),
            (b"retry-after", b"60"),
        ]},
        {"type": "websocket.http.response.body", "body": BODY},
    ]
