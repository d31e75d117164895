"""The flooded app, configured by environment variables (``uvicorn tests.flood.app:create_app --factory``).

* ``FLOOD_STORE``: the store URL given to ``ratewarden.stores.urls.open_store`` (``memory://``,
  ``shm://<name>``, ``redis://``, ``redis+cluster://``, ``memcached://``; default ``memory://``).
* ``FLOOD_PATH``: how the limit is applied: ``middleware`` (``RateLimitMiddleware`` + ``Rule``),
  ``edge`` (``Depends(RateLimit(...))`` with ``ratewarden.fastapi.install(app)``), ``dependency``
  (the same without ``install``) or ``decorator`` (``ratewarden.starlette.limit``).
* ``FLOOD_RATE``: the limit (default ``100/hour``), fixed window, keyed by the client IP.
* ``FLOOD_PREFIX``: the limiter's key prefix (default ``flood``), so runs sharing a store do not meet.

``GET /a`` and ``GET /b`` are limited separately (each its own count of the same rate). Each handler
counts its runs: that is the admitted count, exact and server-side. With the middleware, the
WebSocket ``/ws`` limits its messages to the same rate (``message_rate``; connections are not
limited) and counts the messages that reach it (``admitted["/ws"]``). ``GET /__count`` (never limited)
returns those counts, every status answered so far, and, when the limiter has
``without_store()``, the checks it decided without the store.
"""

import os
from collections import Counter
from typing import Any

from fastapi import Depends, FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

import ratewarden
from ratewarden import Limiter, RateLimitMiddleware, Rule
from ratewarden.stores.urls import open_store
from ratewarden.types import ASGIApp, Message, Receive, Scope, Send

PATHS = ("middleware", "edge", "dependency", "decorator")
ROUTES = ("/a", "/b")


class Counted:
    """The outermost ASGI layer: counts the statuses of the limited routes (an escaped exception as 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.statuses: Counter[int] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ROUTES:
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.statuses[message["status"]] += 1
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.statuses[500] += 1
            raise


def without_store(limiter: Limiter) -> dict[str, int] | None:
    """``limiter.without_store()`` (checks decided without the store, by reason) where it exists."""
    method = getattr(limiter, "without_store", None)
    if method is None:
        return None
    return {str(k): int(v) for k, v in dict(method()).items()}


def create_app() -> ASGIApp:
    """The app ``FLOOD_*`` describes, wrapped in ``Counted``."""
    url = os.environ.get("FLOOD_STORE", "memory://")
    path = os.environ.get("FLOOD_PATH", "middleware")
    rate = os.environ.get("FLOOD_RATE", "100/hour")
    prefix = os.environ.get("FLOOD_PREFIX", "flood")
    if path not in PATHS:
        raise ValueError(f"FLOOD_PATH must be one of {', '.join(PATHS)}, got {path!r}")
    limiter = Limiter(open_store(url), prefix=prefix)
    admitted: Counter[str] = Counter()
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    counted = Counted(app)

    async def handler(request: Request) -> Response:
        admitted[request.url.path] += 1
        return Response(b"ok", media_type="text/plain")

    if path == "middleware":
        for route in ROUTES:
            app.add_route(route, handler, methods=["GET"])

        async def chat(websocket: WebSocket) -> None:
            await websocket.accept()
            async for text in websocket.iter_text():
                admitted["/ws"] += 1
                await websocket.send_text(text)

        app.add_api_websocket_route("/ws", chat)
        rules = [Rule(route, rate) for route in ROUTES]
        rules.append(Rule("/ws", "1000000/hour", message_rate=rate))
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=rules)
    elif path in ("edge", "dependency"):
        from ratewarden.fastapi import RateLimit, install

        for route in ROUTES:
            app.add_api_route(
                route, handler, methods=["GET"], dependencies=[Depends(RateLimit(rate, limiter=limiter))]
            )
        if path == "edge":
            install(app)
    else:
        from ratewarden.starlette import limit

        for route in ROUTES:
            app.add_route(route, limit(rate, limiter=limiter, name=route)(handler), methods=["GET"])

    async def count(request: Request) -> Response:
        body: dict[str, Any] = {
            "admitted": {route: admitted[route] for route in (*ROUTES, "/ws")},
            "statuses": {str(k): v for k, v in sorted(counted.statuses.items())},
            "store": type(limiter.store).__name__,
            "path": path,
            "rate": rate,
            "compiled": ratewarden.COMPILED,
        }
        found = without_store(limiter)
        if found is not None:
            body["without_store"] = found
        return JSONResponse(body)

    app.add_route("/__count", count, methods=["GET"])
    return counted
