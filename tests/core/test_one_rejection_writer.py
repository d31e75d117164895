"""One rejection writer (issue 22): the middleware, the edge and the policy middleware send the
same default 429 for the same decision; the policy middleware's body adds its documented fields
(``remaining``, and ``group`` when one is shown). The ``@limit`` decorator and the FastAPI
dependency (rendered by ``install``'s handler) send that 429 too, and the fail-closed 503 is one
answer wherever it is written."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.decision import Decision
from ratewarden.enforcement.answers import UNAVAILABLE_BODY, UNAVAILABLE_HEADERS, HeaderOptions, rejection
from ratewarden.fastapi import RateLimit, install
from ratewarden.policy import PolicyMiddleware
from ratewarden.starlette import limit
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
    assert rejection(denied, HeaderOptions(), b'"api";q=1;w=60') == (BODY, _headers(BODY))
    body, headers = rejection(denied, HeaderOptions(), None, "gold")
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


# --- the decorator and the FastAPI dependency -----------------------------------------------------


class _Broken(MemoryStore):
    """A store that fails every check (fail-closed answers 503)."""

    def hit_now(self, *args: Any) -> Decision:
        raise OSError("store down")


def _decorated(limiter: Limiter) -> Starlette:
    @limit("1/min", limiter=limiter, name="api")
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/api/x", endpoint)])


def _fastapi(limiter: Limiter, installed: bool, self_checking: bool = False) -> FastAPI:
    """A route limited by ``RateLimit``: under ``install`` the edge answers, unless ``self_checking``
    (a second limit of the route is overridden, so the edge leaves the route to FastAPI and the
    dependency checks for itself: ``install``'s handler renders its ``RateLimitExceeded``)."""
    app = FastAPI()
    other = RateLimit("100/min", limiter=Limiter(MemoryStore()), name="other")
    limits = [Depends(RateLimit("1/min", limiter=limiter, name="api"))]
    if self_checking:
        limits.append(Depends(other))

    @app.get("/api/x", dependencies=limits)
    async def endpoint() -> str:
        return "ok"

    if installed:
        install(app)
    if self_checking:
        app.dependency_overrides[other] = lambda: None
    return app


def _content_headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    """The reply's headers but its content type and length: the rate-limit headers and Retry-After."""
    return [(k, v) for k, v in reply.raw_headers if k not in (b"content-type", b"content-length")]


async def test_the_decorator_the_dependency_and_the_middleware_send_the_same_429() -> None:
    middleware = RateLimitMiddleware(build_app(), _limiter(), [Rule("/api/**", "1/min", name="api")])
    replies = {
        "middleware": await _second(middleware),
        "decorator": await _second(_decorated(_limiter())),
        "edge": await _second(_fastapi(_limiter(), installed=True)),
        "dependency under install": await _second(_fastapi(_limiter(), installed=True, self_checking=True)),
    }
    for name, reply in replies.items():
        assert (reply.status, reply.body, reply.raw_headers) == (429, BODY, _headers(BODY)), name
    # Without install the dependency's 429 has FastAPI's error body, with the same rate-limit
    # headers and Retry-After, byte for byte.
    bare = await _second(_fastapi(_limiter(), installed=False))
    assert bare.status == 429 and bare.header("content-type") == "application/json"
    assert bare.json() == {"detail": json.loads(BODY)["detail"]}
    assert _content_headers(bare) == RATE_HEADERS == _content_headers(replies["middleware"])


def _closed() -> Limiter:
    return Limiter(_Broken(), on_error="closed")


async def test_the_decorator_the_edge_and_the_middleware_send_the_same_503_when_failing_closed() -> None:
    replies = {
        "middleware": await request(RateLimitMiddleware(build_app(), _closed(), [Rule("/api/**", "1/min")]), "/api/x"),
        "decorator": await request(_decorated(_closed()), "/api/x"),
        "edge": await request(_fastapi(_closed(), installed=True), "/api/x"),
    }
    expected = (503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS))
    for name, reply in replies.items():
        assert (reply.status, reply.body, reply.raw_headers) == expected, name
    assert json.loads(UNAVAILABLE_BODY)["status"] == 503
    # A dependency checking for itself raises the same 503 as an HTTPException (FastAPI renders its
    # error body): the one 503's detail and Retry-After.
    one = _content_headers(replies["middleware"])
    assert one == [(b"retry-after", b"1")]
    for installed in (False, True):
        reply = await request(_fastapi(_closed(), installed, self_checking=installed), "/api/x")
        assert reply.status == 503 and reply.json() == {"detail": json.loads(UNAVAILABLE_BODY)["detail"]}
        assert _content_headers(reply) == one, installed
