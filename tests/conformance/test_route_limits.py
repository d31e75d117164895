"""One limit declared on a route, in each framework's idiom (Flask's ``shared_limit``, Django's
``@limit``, FastAPI's ``RateLimit``, Starlette's ``@limit``, Sanic's ``@limiter.limit``, Litestar's
``opt``), is the core's ``route_limits.Declared``: every door counts it under the storage key the
core compiles for it and names it alike to clients."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from ratewarden import Limit, Limiter, MemoryStore
from ratewarden.rates import parse_rates
from ratewarden.route_limits import Declared

from .doors import frozen

CLIENT = "203.0.113.7"
PREFIX = "one-registry"
RATE, NAME = "2/min", "orders"

Door = Callable[[Limiter], Awaitable[list[httpx.Response]]]


async def _asgi(app: Any) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app, client=(CLIENT, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [await client.get("/orders") for _ in range(3)]


def _wsgi(app: Any) -> list[httpx.Response]:
    transport = httpx.WSGITransport(app=app, remote_addr=CLIENT)
    with httpx.Client(transport=transport, base_url="http://testserver") as client:
        return [client.get("/orders") for _ in range(3)]


async def flask_door(limiter: Limiter) -> list[httpx.Response]:
    from flask import Flask

    from ratewarden.flask import RateLimiter

    app = Flask("one_registry")
    extension = RateLimiter(app, limiter=limiter)

    @app.get("/orders")
    @extension.shared_limit(RATE, scope=NAME)
    def orders() -> str:
        return "ok"

    return _wsgi(app)


async def django_door(limiter: Limiter) -> list[httpx.Response]:
    import django
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler
    from django.http import HttpRequest, HttpResponse
    from django.test.utils import override_settings
    from django.urls import path

    from ratewarden.django import limit

    if not settings.configured:  # as tests/django/conftest.py configures it, when it has not
        from tests.django import settings as test_settings

        settings.configure(**{n: getattr(test_settings, n) for n in dir(test_settings) if n.isupper()})
        django.setup()

    @limit(RATE, name=NAME, limiter=limiter)
    def orders(request: HttpRequest) -> HttpResponse:
        return HttpResponse(b"ok", content_type="text/plain")

    urls = types.ModuleType("one_registry_urls")
    urls.urlpatterns = [path("orders", orders)]  # type: ignore[attr-defined]
    with override_settings(ROOT_URLCONF=urls, MIDDLEWARE=[], RATEWARDEN={}):
        return await asyncio.to_thread(_wsgi, WSGIHandler())  # a sync view, off the event loop


async def fastapi_door(limiter: Limiter) -> list[httpx.Response]:
    from fastapi import Depends, FastAPI

    from ratewarden.fastapi import RateLimit

    app = FastAPI()

    @app.get("/orders", dependencies=[Depends(RateLimit(RATE, limiter=limiter, name=NAME))])
    async def orders() -> str:
        return "ok"

    return await _asgi(app)


async def starlette_door(limiter: Limiter) -> list[httpx.Response]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from ratewarden.starlette import limit

    @limit(RATE, limiter=limiter, name=NAME)
    async def orders(request: Request) -> Response:
        return PlainTextResponse("ok")

    return await _asgi(Starlette(routes=[Route("/orders", orders)]))


async def sanic_door(limiter: Limiter) -> list[httpx.Response]:
    from sanic import response

    from ratewarden.sanic import RateLimiter
    from tests.sanic.server import new_app, started

    app = new_app()
    extension = RateLimiter(app, limiter)

    @app.get("/orders")
    @extension.limit(RATE, name=NAME)
    async def orders(request: Any) -> Any:
        return response.text("ok")

    async with started(app):
        return await _asgi(app)


async def litestar_door(limiter: Limiter) -> list[httpx.Response]:
    from litestar import Litestar, get

    from ratewarden.litestar import RateLimitPlugin, RouteLimit

    @get("/orders", opt={"rate_limit": RouteLimit(RATE, name=NAME)})
    async def orders() -> str:
        return "ok"

    return await _asgi(Litestar([orders], plugins=[RateLimitPlugin(limiter)], openapi_config=None))


DOORS: dict[str, Door] = {
    "flask": flask_door, "django": django_door, "fastapi": fastapi_door, "starlette": starlette_door,
    "sanic": sanic_door, "litestar": litestar_door,
}


@pytest.mark.parametrize("door", list(DOORS))
async def test_one_declared_limit_is_counted_under_the_cores_storage_key_on_every_door(door: str) -> None:
    store = MemoryStore(clock=frozen)
    answers = await DOORS[door](Limiter(store, prefix=PREFIX))
    assert [r.status_code for r in answers] == [200, 200, 429]
    compiled = Declared(RATE, name=NAME).compiled("any route", PREFIX)
    assert compiled.rule.name == NAME and answers[2].headers["ratelimit-policy"] == compiled.policy.decode()
    keys = compiled.storage_keys(CLIENT)
    limit = Limit(parse_rates(RATE)[0], "fixed_window")
    assert [d.remaining for d in store.peek_blocking(keys, [limit])] == [0]  # both allowed requests, there
