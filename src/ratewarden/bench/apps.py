"""The one FastAPI app shape every library is measured on, and the ``/__bench__`` wrapper around it.

Adapters call :func:`build_app` with a per-route wrapper (a decorator, for slowapi), route
dependencies (for dependency mode) and the WebSocket message hook; the routes and their bodies are
identical for every library, so a ratio against the bare app is the limiter's own cost.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.params import Depends

from ..types import ASGIApp, Receive, Scope, Send

__all__ = ["LIMITED_PATHS", "ASGIApp", "BenchApp", "HandlerRuns", "WsCheck", "build_app", "client_identity",
           "handler_runs", "heavy_work"]

Endpoint = Callable[..., Awaitable[Any]]
# Called once per WebSocket message; returns True when the message is allowed.
WsCheck = Callable[[WebSocket], Awaitable[bool]]

LIMITED_PATHS = ("/test", "/heavy", "/json", "/items/{item_id}/{sub}", "/search", "/form", "/tiered",
                 "/api/v1/items/{item_id}")
OK = {"status": "ok"}


def client_identity(headers: Any, client_host: str | None) -> str:
    """``X-Client-ID`` when sent, else the peer address: the identity every adapter keys on."""
    value = headers.get("x-client-id")
    return str(value) if value else (client_host or "anonymous")


def heavy_work(n: int = 100_000) -> float:
    """The CPU-bound handler body (100k ``sqrt`` calls, as ratelimit_bench's heavy route)."""
    total = 0.0
    sqrt = math.sqrt
    for j in range(n):
        total += sqrt(j)
    return total


class HandlerRuns:
    """How many times the limited routes' handlers ran: what the limiter admitted, counted where it
    cannot be missed (a response the load generator never read still ran its handler)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def handler_runs(app: object) -> HandlerRuns | None:
    """The counter :func:`build_app` attached to ``app`` (``app.state.bench_handler_runs``), if any."""
    runs = getattr(getattr(app, "state", None), "bench_handler_runs", None)
    return runs if isinstance(runs, HandlerRuns) else None


def build_app(
    wrap: Callable[[Endpoint], Endpoint] | None = None,
    dependencies: list[Depends] | None = None,
    ws_check: WsCheck | None = None,
    exempt: Callable[[Endpoint], Endpoint] | None = None,
) -> FastAPI:
    """The benchmark app. ``wrap``/``dependencies`` apply to limited routes, ``exempt`` to ``/unthrottled``.

    Over 60 lines on purpose: one route per workload of the reference reports, declared inline so the
    app every library runs on reads in one place."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    w = wrap or (lambda f: f)
    deps = dependencies or []
    runs = app.state.bench_handler_runs = HandlerRuns()  # every limited handler counts its runs

    async def test(request: Request) -> dict[str, str]:
        runs.n += 1
        return OK

    async def heavy(request: Request) -> dict[str, Any]:
        runs.n += 1
        return {"status": "ok", "sum": int(heavy_work())}

    async def json_body(request: Request) -> dict[str, Any]:
        runs.n += 1
        data = await request.json()
        return {"status": "ok", "items": len(data.get("items", ()))}

    async def items(request: Request) -> dict[str, Any]:
        runs.n += 1
        p = request.path_params
        return {"status": "ok", "item_id": int(p["item_id"]), "sub": p["sub"]}

    async def api_items(request: Request) -> dict[str, Any]:
        runs.n += 1
        return {"status": "ok", "item_id": int(request.path_params["item_id"])}

    async def search(request: Request) -> dict[str, Any]:
        runs.n += 1
        q = request.query_params
        return {"status": "ok", "n": len(q), "page": int(q.get("page", "1"))}

    async def form(request: Request) -> dict[str, Any]:
        runs.n += 1
        data = await request.form()
        return {"status": "ok", "fields": len(data)}

    async def tiered(request: Request) -> dict[str, str]:
        runs.n += 1
        return OK

    async def unthrottled(request: Request) -> dict[str, str]:
        return OK

    app.add_api_route("/test", w(test), methods=["GET"], dependencies=deps)
    app.add_api_route("/heavy", w(heavy), methods=["GET"], dependencies=deps)
    app.add_api_route("/json", w(json_body), methods=["POST"], dependencies=deps)
    app.add_api_route("/items/{item_id}/{sub}", w(items), methods=["GET"], dependencies=deps)
    app.add_api_route("/api/v1/items/{item_id}", w(api_items), methods=["GET"], dependencies=deps)
    app.add_api_route("/search", w(search), methods=["GET"], dependencies=deps)
    app.add_api_route("/form", w(form), methods=["POST"], dependencies=deps)
    app.add_api_route("/tiered", w(tiered), methods=["GET"], dependencies=deps)
    app.add_api_route("/unthrottled", (exempt or (lambda f: f))(unthrottled), methods=["GET"])

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                msg = await websocket.receive_text()
                if ws_check is None or await ws_check(websocket):
                    await websocket.send_text('{"status":"ok","echo":' + str(len(msg)) + "}")
                else:
                    await websocket.send_text('{"type":"rate_limit"}')
        except WebSocketDisconnect:
            return

    app.add_api_websocket_route("/ws", ws)
    return app


class BenchApp:
    """Wraps an adapter's app with ``/__bench__/health``, ``/__bench__/reset``, ``/__bench__/pid``,
    ``/__bench__/stats`` and a lifespan.

    The live driver talks to these over HTTP: reset clears the limiter's store between iterations
    without restarting the server (which would lose the warm-up); ``/__bench__/pid`` names the worker
    process that answered; ``/__bench__/stats`` (never limited) returns that process's counts so far:
    ``{"pid", "admitted", "without_store"}``, the handler runs of the limited routes and, for a
    limiter that counts them, the checks it decided without its store, by reason.
    """

    def __init__(self, app: ASGIApp, start: Callable[[], Awaitable[None]], reset: Callable[[], Awaitable[None]],
                 stop: Callable[[], Awaitable[None]],
                 without_store: Callable[[], dict[str, int] | None] | None = None) -> None:
        self.app = app
        self._start, self._reset, self._stop = start, reset, stop
        self._runs = handler_runs(app)
        self._without_store = without_store

    def stats(self) -> dict[str, Any]:
        """What ``/__bench__/stats`` answers."""
        found = self._without_store() if self._without_store else None
        return {"pid": os.getpid(), "admitted": self._runs.n if self._runs else None, "without_store": found}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind == "http" and scope["path"].startswith("/__bench__/"):
            body = b"ok"
            if scope["path"] == "/__bench__/reset":
                await self._reset()
            elif scope["path"] == "/__bench__/pid":  # which worker answered (multi-worker readiness)
                body = str(os.getpid()).encode()
            elif scope["path"] == "/__bench__/stats":
                body = json.dumps(self.stats()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
