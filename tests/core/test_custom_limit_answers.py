"""A custom ``on_limit`` answer (the app's own 429) still carries Retry-After and the rate-limit
headers, each once, and a Retry-After it sets itself wins."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.responses import PlainTextResponse

from ratewarden import Decision, Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.policy import PolicyMiddleware
from tests.core.asgi import request
from tests.policy.apps import build_app


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
