"""ratewarden.sanic.RateLimiter on a real Sanic server (a loopback socket, raw HTTP/1.1 requests):
its answers are the ASGI middleware's for the same rules, byte for byte, on a frozen clock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from sanic import Sanic, response
from sanic.request import Request

from ratewarden import ConfigurationError, Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.enforcement.answers import UNAVAILABLE_BODY
from ratewarden.errors import StoreError
from ratewarden.keys import ClientIP, header
from ratewarden.limits import Limit
from ratewarden.sanic import CONTEXT_ATTR, RateLimiter
from ratewarden.types import Scope
from tests.vectors.runner import FakeClock

from .server import new_app, send, serving

RATE_HEADERS = ("ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
                "retry-after")


def frozen_limiter(**options: Any) -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)), **options)


class DownStore(MemoryStore):
    """Every check fails, as an unreachable store's would."""

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Any:
        raise StoreError("down", reason="unreachable")

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Any:
        raise StoreError("down", reason="unreachable")


def ok_app(methods: Sequence[str] = ("GET", "HEAD", "POST")) -> Sanic:  # type: ignore[type-arg]
    app = new_app()

    async def items(request: Request) -> response.HTTPResponse:
        return response.text("ok")

    app.route("/api/items", methods=list(methods))(items)
    return app


def rate_headers(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, v) for n, v in headers if n in RATE_HEADERS]


async def asgi_answers(rules: list[Rule], sends: int, method: str = "GET") -> list[httpx.Response]:
    """What the ASGI middleware answers for the same rules, on its own frozen store."""

    async def ok(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    app = RateLimitMiddleware(ok, frozen_limiter(), rules)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [await client.request(method, "/api/items") for _ in range(sends)]


async def sanic_answers(
    rules: list[Rule], sends: int, method: str = "GET", limiter: Limiter | None = None, **options: Any
) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    app = ok_app()
    RateLimiter(app, limiter or frozen_limiter(), rules, **options)
    async with serving(app) as port:
        return [await send(port, method, "/api/items") for _ in range(sends)]


@pytest.mark.parametrize("rate", ["2/min", "2/s; 100/min"])
async def test_allowed_and_refused_answers_are_the_asgi_middlewares(rate: str) -> None:
    rules = [Rule("/api/**", rate, name="api")]
    expected = await asgi_answers(rules, 3)
    got = await sanic_answers(rules, 3)
    assert [status for status, _, _ in got] == [r.status_code for r in expected] == [200, 200, 429]
    for (_, headers, body), want in zip(got, expected, strict=True):
        assert rate_headers(headers) == [(n, v) for n, v in want.headers.items() if n in RATE_HEADERS]
        if want.status_code == 429:
            assert body == want.content
            assert dict(headers)["content-type"] == want.headers["content-type"] == "application/problem+json"
            assert dict(headers)["content-length"] == want.headers["content-length"]


async def test_head_is_charged_to_a_get_limit() -> None:
    got = await sanic_answers([Rule("/api/**", "2/min", methods="GET", name="api")], 3, "HEAD")
    assert [status for status, _, _ in got] == [200, 200, 429]
    assert dict(got[-1][1])["retry-after"] == "60"


async def test_a_lower_case_method_is_charged_to_its_limit() -> None:
    # Sanic routes methods as sent (its router answers 405 to "post"); the limit still applies.
    got = await sanic_answers([Rule("/api/**", "2/min", methods="POST", name="api")], 3, "post")
    assert [status for status, _, _ in got] == [405, 405, 429]
    assert dict(got[0][1])["ratelimit"] == '"api";r=1;t=60'


async def test_an_unrouted_path_is_charged_to_the_app_wide_rules() -> None:
    app = ok_app()
    RateLimiter(app, frozen_limiter(), [Rule("/api/**", "1/min", name="api")])
    async with serving(app) as port:
        assert (await send(port, "GET", "/api/nothing-here"))[0] == 404
        assert (await send(port, "GET", "/api/items"))[0] == 429


def failing_key(scope: Scope) -> str:
    raise KeyError("no tenant")


async def test_a_key_function_that_raises_charges_the_client_address_instead() -> None:
    got = await sanic_answers([Rule("/api/**", "2/min", key=failing_key, name="api")], 3)
    assert [status for status, _, _ in got] == [200, 200, 429]


async def test_a_key_function_that_raises_under_fail_closed_is_the_503() -> None:
    rules = [Rule("/api/**", "2/min", key=failing_key, name="api")]
    got = await sanic_answers(rules, 1, limiter=frozen_limiter(on_error="closed"))
    status, headers, body = got[0]
    assert (status, body) == (503, UNAVAILABLE_BODY)
    assert dict(headers)["retry-after"] == "1" and dict(headers)["content-type"] == "application/problem+json"


async def test_a_failed_store_under_fail_closed_is_the_503() -> None:
    limiter = Limiter(DownStore(), on_error="closed")
    status, headers, body = (await sanic_answers([Rule("/api/**", "2/min")], 1, limiter=limiter))[0]
    assert (status, body, dict(headers)["retry-after"]) == (503, UNAVAILABLE_BODY, "1")


async def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy() -> None:
    app = ok_app()
    RateLimiter(app, frozen_limiter(), [Rule("/api/**", "2/min", name="api")])
    async with serving(app) as port:
        statuses = [(await send(port, "GET", "/api/items", {"X-Forwarded-For": f"198.51.100.{i}"}))[0] for i in range(3)]
    assert statuses == [200, 200, 429]  # every forged address is the one peer, 127.0.0.1

    app = ok_app()
    behind_proxy = ClientIP(trusted_proxies=["127.0.0.1/32"])
    RateLimiter(app, frozen_limiter(), [Rule("/api/**", "2/min", key=behind_proxy, name="api")])
    async with serving(app) as port:
        statuses = [(await send(port, "GET", "/api/items", {"X-Forwarded-For": f"198.51.100.{i}"}))[0] for i in range(3)]
        assert statuses == [200, 200, 200]  # the proxy's header names three clients
        same = [(await send(port, "GET", "/api/items", {"X-Forwarded-For": "198.51.100.7"}))[0] for _ in range(3)]
    assert same == [200, 200, 429]


async def test_any_header_bytes_are_read_never_a_500() -> None:
    app = ok_app()
    RateLimiter(app, frozen_limiter(), [Rule("/api/**", "1/min", key=header("X-Key"), name="api")])
    async with serving(app) as port:
        sent = [("X-\xff", "1"), ("X-Key", "\xff\xfe"), ("X-Key", "\xff\xfe"), ("X-Key", "\xc3\xa9")]
        got = [(await send(port, "GET", "/api/items", {name: value}))[0] for name, value in sent]
    assert got == [200, 200, 429, 200]  # the same raw key twice is one client


async def test_route_limits_count_per_route_with_their_own_keys_and_names() -> None:
    app = new_app()
    limiter = RateLimiter(app, frozen_limiter())

    @app.get("/a")
    @limiter.limit("1/min", key=header("X-API-Key"))
    @limiter.limit("5/min", name="a-burst")
    async def a(request: Request) -> response.HTTPResponse:
        decision = getattr(request.ctx, CONTEXT_ATTR).decision
        return response.json({"remaining": decision.remaining})

    @app.get("/b")
    async def b(request: Request) -> response.HTTPResponse:
        return response.text("unlimited")

    async with serving(app) as port:
        first = await send(port, "GET", "/a", {"X-API-Key": "k1"})
        other_key = await send(port, "GET", "/a", {"X-API-Key": "k2"})
        again = await send(port, "GET", "/a", {"X-API-Key": "k1"})
        free = [(await send(port, "GET", "/b"))[0] for _ in range(3)]
    assert (first[0], other_key[0], again[0], free) == (200, 200, 429, [200, 200, 200])
    assert json.loads(first[2]) == {"remaining": 0}
    assert dict(first[1])["ratelimit-policy"] == f'"{app.name}.a";q=1;w=60, "a-burst";q=5;w=60'
    assert json.loads(again[2])["policy"] == f"{app.name}.a"


async def test_an_async_key_function_is_awaited() -> None:
    async def tenant(scope: Scope) -> str:
        return dict(scope["headers"]).get(b"x-tenant", b"").decode()

    app = ok_app()
    RateLimiter(app, frozen_limiter(), [Rule("/api/**", "1/min", key=tenant, name="api")])
    async with serving(app) as port:
        got = [(await send(port, "GET", "/api/items", {"X-Tenant": t}))[0] for t in ("a", "b", "a")]
    assert got == [200, 200, 429]


@pytest.mark.parametrize(("mode", "on_429"), [("off", ["retry-after"]), ("on_limit", list(RATE_HEADERS))])
async def test_header_modes_leave_the_allowed_answer_without_rate_headers(mode: str, on_429: list[str]) -> None:
    got = await sanic_answers([Rule("/api/**", "1/min", name="api")], 2, headers=mode)
    assert [n for n, _ in rate_headers(got[0][1])] == []
    assert [n for n, _ in rate_headers(got[1][1])] == on_429


def test_bad_declarations_fail_when_made() -> None:
    app = ok_app()
    limiter = RateLimiter(app, frozen_limiter())
    with pytest.raises(ConfigurationError, match="init_app was already called"):
        limiter.init_app(app)
    with pytest.raises(ConfigurationError):
        limiter.limit("ten per minute")
    with pytest.raises(ConfigurationError):
        limiter.limit("1/min", methods="FETCH")
    with pytest.raises(ConfigurationError, match="headers must be"):
        RateLimiter(None, frozen_limiter(), headers="sometimes")  # type: ignore[arg-type]
