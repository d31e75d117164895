"""RateLimitPlugin's own idioms, in process (httpx on the Litestar app): the route option and its
configurable key, options on a router or the app, one handler on several paths, and every mistake
refused when the app is built."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from litestar import Litestar, Router, get

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.errors import ConfigurationError
from ratewarden.litestar import RateLimitPlugin, RouteLimit

from .app import frozen


def plugin(**options: Any) -> RateLimitPlugin:
    return RateLimitPlugin(Limiter(MemoryStore(clock=frozen)), **options)


async def statuses(app: Litestar, *paths: str) -> list[tuple[int, str | None]]:
    """Each GET's status and ``RateLimit-Policy``."""
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        answers = [await client.get(path) for path in paths]
    return [(r.status_code, r.headers.get("ratelimit-policy")) for r in answers]


async def test_the_option_key_is_configurable() -> None:
    @get("/a", opt={"throttle": "2/min"})
    async def a() -> str:
        return "a"

    @get("/b", opt={"rate_limit": "1/min"})  # not the plugin's key here: unlimited
    async def b() -> str:
        return "b"

    app = Litestar([a, b], plugins=[plugin(opt_key="throttle")], openapi_config=None)
    got = await statuses(app, "/a", "/a", "/a", "/b", "/b")
    assert [s for s, _ in got] == [200, 200, 429, 200, 200]
    assert got[0][1] == '"2/min";q=2;w=60' and got[3][1] is None


async def test_a_routers_option_gives_each_of_its_handlers_a_counter_of_its_own() -> None:
    @get("/x")
    async def x() -> str:
        return "x"

    @get("/y")
    async def y() -> str:
        return "y"

    router = Router("/v1", route_handlers=[x, y], opt={"rate_limit": RouteLimit("1/min", name=None)})
    app = Litestar([router], plugins=[plugin()], openapi_config=None)
    got = await statuses(app, "/v1/x", "/v1/y", "/v1/x", "/v1/y")
    assert [s for s, _ in got] == [200, 200, 429, 429]


async def test_one_handler_on_two_paths_is_one_limit_charged_once() -> None:
    @get(["/one", "/two"], opt={"rate_limit": "3/min"})
    async def both() -> str:
        return "ok"

    app = Litestar([both], plugins=[plugin()], openapi_config=None)
    got = await statuses(app, "/one", "/two", "/one", "/two")
    assert [s for s, _ in got] == [200, 200, 200, 429]
    assert got[0][1] == '"3/min";q=3;w=60'  # declared once, not once per path


async def test_a_route_limit_of_its_own_key_and_name() -> None:
    @get("/k", opt={"rate_limit": RouteLimit("1/min", key=lambda scope: "everyone", name="shared")})
    async def k() -> str:
        return "k"

    app = Litestar([k], plugins=[plugin()], openapi_config=None)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
    other = httpx.ASGITransport(app=app, client=("10.0.0.2", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as one, \
            httpx.AsyncClient(transport=other, base_url="http://t") as two:
        first, second = await one.get("/k"), await two.get("/k")
    assert (first.status_code, second.status_code) == (200, 429)  # one key for every client
    assert second.json()["policy"] == "shared"


def test_a_bad_rate_in_an_option_fails_when_the_app_is_built() -> None:
    @get("/bad", opt={"rate_limit": "10 per fortnight"})
    async def bad() -> str:
        return "never"

    with pytest.raises(ValueError, match="fortnight"):
        Litestar([bad], plugins=[plugin()], openapi_config=None)


def test_bad_options_fail_when_the_plugin_is_made() -> None:
    with pytest.raises(ConfigurationError, match="header"):
        plugin(headers="sometimes")
    with pytest.raises(ConfigurationError, match="list of Rule"):
        plugin(rules=Rule("/api/**", "1/s"))
    with pytest.raises(TypeError, match="key"):
        plugin(key="client_ip")


async def test_a_refused_request_never_reaches_the_apps_own_middleware() -> None:
    """The plugin's middleware is the app's first: the app's own (authentication, sessions...) and
    the handler run only for an admitted request."""
    reached: list[str] = []

    def counting(app: Any) -> Any:
        async def middleware(scope: Any, receive: Any, send: Any) -> None:
            reached.append(scope["path"])
            await app(scope, receive, send)

        return middleware

    @get("/c", opt={"rate_limit": "1/min"})
    async def c() -> str:
        return "c"

    app = Litestar([c], middleware=[counting], plugins=[plugin()], openapi_config=None)
    assert [s for s, _ in await statuses(app, "/c", "/c")] == [200, 429]
    assert reached == ["/c"]
