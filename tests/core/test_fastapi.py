"""The FastAPI dependency and the Starlette decorator."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore
from ratewarden.fastapi import RateLimit, RateLimitExceeded, install
from ratewarden.keys import header
from ratewarden.starlette import limit
from tests.core.asgi import request
from tests.vectors.runner import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(MemoryStore(clock=clock))


async def statuses(app: Any, paths: list[str], method: str = "GET", **kw: Any) -> list[int]:
    return [(await request(app, p, method=method, **kw)).status for p in paths]


# --- dependency ---------------------------------------------------------------------------------


def fastapi_app(limiter: Limiter, rate: str = "2/min", **options: Any) -> FastAPI:
    app = FastAPI()
    dep = RateLimit(rate, limiter=limiter, **options)

    @app.get("/async", dependencies=[Depends(dep)])
    async def async_endpoint() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/sync", dependencies=[Depends(dep)])
    def sync_endpoint() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/items/{item_id}", dependencies=[Depends(dep)])
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    @app.post("/items/{item_id}", dependencies=[Depends(dep)])
    async def post_item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    @app.get("/free")
    async def free() -> dict[str, bool]:
        return {"free": True}

    return app


@pytest.mark.parametrize("path", ["/async", "/sync"])
async def test_dependency_on_sync_and_async_endpoints(limiter: Limiter, path: str) -> None:
    app = fastapi_app(limiter)
    first = await request(app, path)
    assert first.status == 200 and first.json() == {"ok": True}
    assert first.header("x-ratelimit-limit") == "2"
    assert first.header("x-ratelimit-remaining") == "1"
    assert first.header("ratelimit") == f'"GET-{path}";r=1;t=60'
    assert first.header("ratelimit-policy") == f'"GET-{path}";q=2;w=60'
    assert (await request(app, path)).status == 200
    limited = await request(app, path)
    assert limited.status == 429
    assert limited.header("retry-after") == "60"
    assert limited.header("x-ratelimit-remaining") == "0"
    assert "detail" in limited.json()  # FastAPI's own error shape unless install() is called


async def test_install_renders_problem_json(limiter: Limiter) -> None:
    app = fastapi_app(limiter, "1/min")
    install(app)
    await request(app, "/async")
    limited = await request(app, "/async")
    assert limited.status == 429
    assert limited.header("content-type") == "application/problem+json"
    assert limited.header("retry-after") == "60"
    body = limited.json()
    assert body["status"] == 429 and body["title"] == "Too Many Requests" and body["retry_after"] == 60


async def test_concrete_paths_of_one_template_share_a_limit(limiter: Limiter) -> None:
    app = fastapi_app(limiter)
    assert await statuses(app, ["/items/1", "/items/2", "/items/3"]) == [200, 200, 429]
    # Another method of the same template is another route, with its own limit.
    assert await statuses(app, ["/items/9"], "POST") == [200]
    # The same dependency object on other routes does not share their counters.
    assert await statuses(app, ["/async", "/sync"]) == [200, 200]
    assert await statuses(app, ["/free"] * 3) == [200] * 3


async def test_named_dependency_shares_one_limit_across_routes(limiter: Limiter) -> None:
    app = fastapi_app(limiter, name="shared")
    assert await statuses(app, ["/async", "/sync", "/items/1"]) == [200, 200, 429]


async def test_dependency_keys_and_costs(limiter: Limiter) -> None:
    app = fastapi_app(limiter, "10/min", key=header("X-API-Key"), cost=4)
    a = [("x-api-key", "a")]
    assert await statuses(app, ["/async"] * 3, headers=a) == [200, 200, 429]
    assert await statuses(app, ["/async"], headers=[("x-api-key", "b")]) == [200]


@pytest.mark.parametrize("algorithm", ["sliding_window", "sliding_log", "token_bucket", "leaky_bucket", "gcra"])
async def test_dependency_algorithms(limiter: Limiter, algorithm: str) -> None:
    app = fastapi_app(limiter, "3/min", algorithm=algorithm)
    assert await statuses(app, ["/async"] * 4) == [200, 200, 200, 429]


async def test_dependency_header_modes(limiter: Limiter) -> None:
    app = fastapi_app(limiter, "1/min", headers="off")
    ok = await request(app, "/async")
    assert ok.header("ratelimit") is None and ok.header("x-ratelimit-limit") is None
    limited = await request(app, "/async")
    assert limited.status == 429 and limited.header("retry-after") == "60" and limited.header("ratelimit") is None
    app = fastapi_app(Limiter(MemoryStore()), "1/min", header_style="ietf")
    ok = await request(app, "/async")
    assert ok.header("ratelimit") is not None and ok.header("x-ratelimit-limit") is None


async def test_dependency_returns_the_decision(limiter: Limiter) -> None:
    app = FastAPI()
    dep = RateLimit("5/min", limiter=limiter)

    @app.get("/me")
    async def me(decision: Any = Depends(dep)) -> dict[str, int]:  # noqa: B008
        return {"remaining": decision.remaining}

    assert (await request(app, "/me")).json() == {"remaining": 4}


def test_rate_limit_exceeded_is_an_http_exception() -> None:
    from ratewarden.decision import Decision

    exc = RateLimitExceeded(Decision(False, 5, 0, 3.0, 2.5, 60.0, "p"), {"Retry-After": "3"})
    assert exc.status_code == 429 and exc.problem["retry_after"] == 3


# --- decorator ----------------------------------------------------------------------------------


def starlette_app(limiter: Limiter) -> Starlette:
    @limit("2/min", limiter=limiter)
    async def async_endpoint(request: Request) -> Response:
        return PlainTextResponse("async")

    @limit("2/min", limiter=limiter)
    def sync_endpoint(request: Request) -> Response:
        return JSONResponse({"sync": True})

    @limit("1/min", limiter=limiter, name="shared")
    async def shared_a(request: Request) -> Response:
        return PlainTextResponse("a")

    @limit("1/min", limiter=limiter, name="shared")
    async def shared_b(request: Request) -> Response:
        return PlainTextResponse("b")

    @limit("5/min", limiter=limiter, headers="off", key=header("X-API-Key"))
    async def quiet(request: Request) -> Response:
        return PlainTextResponse("quiet")

    return Starlette(
        routes=[
            Route("/async", async_endpoint),
            Route("/sync", sync_endpoint),
            Route("/a", shared_a),
            Route("/b", shared_b),
            Route("/quiet", quiet),
        ]
    )


@pytest.mark.parametrize(("path", "body"), [("/async", b"async"), ("/sync", b'{"sync":true}')])
async def test_decorator_on_sync_and_async_endpoints(limiter: Limiter, path: str, body: bytes) -> None:
    app = starlette_app(limiter)
    first = await request(app, path)
    assert (first.status, first.body) == (200, body)
    assert first.header("x-ratelimit-remaining") == "1"
    assert first.header("ratelimit-policy") is not None
    assert (await request(app, path)).status == 200
    limited = await request(app, path)
    assert limited.status == 429
    assert limited.header("content-type") == "application/problem+json"
    assert limited.header("retry-after") == "60"
    assert json.loads(limited.body)["status"] == 429


async def test_decorated_endpoints_have_separate_limits_unless_named(limiter: Limiter) -> None:
    app = starlette_app(limiter)
    assert await statuses(app, ["/async", "/async", "/sync", "/sync"]) == [200] * 4
    assert await statuses(app, ["/a", "/b"]) == [200, 429]


async def test_decorator_options(limiter: Limiter) -> None:
    app = starlette_app(limiter)
    ok = await request(app, "/quiet", headers=[("x-api-key", "k")])
    assert ok.status == 200 and ok.header("ratelimit") is None


def _install_app(with_install: bool) -> FastAPI:
    limiter = Limiter(MemoryStore())
    app = FastAPI()

    @app.get("/own", dependencies=[Depends(RateLimit("2/min", limiter=limiter))])
    async def own() -> JSONResponse:
        return JSONResponse({"a": 1})

    @app.get("/plain", dependencies=[Depends(RateLimit("2/min", limiter=limiter))])
    async def plain() -> dict[str, int]:
        return {"a": 1}

    if with_install:
        install(app)
    return app


async def _get_via_httpx(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.get(path)


async def test_install_keeps_headers_on_endpoints_returning_a_response() -> None:
    app = _install_app(with_install=True)
    own = await _get_via_httpx(app, "/own")
    plain = await _get_via_httpx(app, "/plain")
    assert own.headers.get_list("ratelimit") == ['"GET-/own";r=1;t=' + own.headers["ratelimit"].split("t=")[1]]
    assert len(plain.headers.get_list("ratelimit")) == 1  # not duplicated
    assert plain.headers["x-ratelimit-remaining"] == "1"


async def test_without_install_plain_endpoints_still_get_headers() -> None:
    app = _install_app(with_install=False)
    plain = await _get_via_httpx(app, "/plain")
    assert plain.headers["x-ratelimit-remaining"] == "1"


async def test_the_dependency_and_the_middleware_send_the_same_429_body() -> None:
    """One problem+json encoder: the dependency's 429 (rendered by install's handler when the
    dependency checks for itself) is byte for byte the middleware's."""
    from ratewarden.decision import Decision
    from ratewarden.enforcement.answers import HeaderOptions, rejection
    from ratewarden.fastapi import RateLimitExceeded

    decision = Decision(False, 1, 0, 7.0, 7.0, 60.0, "p")
    dependency_app = FastAPI()

    @dependency_app.get("/x")
    async def x() -> dict[str, int]:
        raise RateLimitExceeded(decision, {"retry-after": "7"})

    install(dependency_app)
    reply = await _get_via_httpx(dependency_app, "/x")
    body, _ = rejection(decision, HeaderOptions())
    assert reply.status_code == 429
    assert reply.content == body
    assert reply.headers["content-type"] == "application/problem+json"
