"""The ``limits`` package used directly (its asyncio API), through a few lines of glue.

This is what a user without a framework integration writes: a pure ASGI middleware or a FastAPI
dependency that calls ``await strategy.hit(item, key)`` and answers 429 when it returns False.
limits sends no rate-limit headers and has no path rules, so those scenarios are skipped.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, WebSocket
from fastapi.params import Depends
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio import strategies
from limits.aio.storage import Storage
from limits.storage import storage_from_string

from ...types import Receive, Scope, Send
from ..apps import ASGIApp, build_app
from .base import Adapter, Unsupported

_STRATEGIES: dict[str, Any] = {
    "fixed_window": strategies.FixedWindowRateLimiter,
    "sliding_window": strategies.SlidingWindowCounterRateLimiter,
    "sliding_log": strategies.MovingWindowRateLimiter,
}
_BODY = b'{"detail":"Too Many Requests"}'
_429_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]


def _key(scope: Scope) -> str:
    """``X-Client-ID`` when sent, else the peer address (as :func:`client_identity`)."""
    for name, value in scope["headers"]:
        if name == b"x-client-id" and value:
            return str(value.decode("latin-1"))
    client = scope.get("client")
    return str(client[0]) if client else "anonymous"


class _Middleware:
    """Limit every HTTP request except ``exempt`` paths; one ``hit`` per request."""

    def __init__(self, app: ASGIApp, limiter: Any, item: RateLimitItem, exempt: tuple[str, ...]) -> None:
        self.app, self.limiter, self.item, self.exempt = app, limiter, item, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if await self.limiter.hit(self.item, _key(scope)):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 429, "headers": _429_HEADERS})
        await send({"type": "http.response.body", "body": _BODY})


class LimitsAdapter(Adapter):
    name = "limits"

    def _storage(self) -> Storage:
        kind, url = self.store.kind, self.store.url
        if kind == "memory":
            storage = storage_from_string("async+memory://")
        elif kind in ("redis", "redis-cluster"):
            # redis-py (already a dependency) rather than limits' default coredis client.
            storage = storage_from_string("async+" + url, implementation="redispy")
        elif kind == "memcached":
            host, port = self.store.host_port
            storage = storage_from_string(f"async+memcached://{host}:{port}")
        elif kind == "shm":
            raise Unsupported("limits has no shared-memory storage (its memory storage counts per process)")
        else:
            raise Unsupported(f"store {kind!r}")
        assert isinstance(storage, Storage)
        return storage

    def build(self) -> ASGIApp:
        sc = self.scenario
        if sc.headers not in ("", "none"):
            raise Unsupported("limits sends no rate-limit headers (it only counts)")
        if sc.rules:
            raise Unsupported("limits has no path-rule registry")
        cls = self.strategy(_STRATEGIES)
        self.storage = self._storage()
        limiter = cls(self.storage)
        item = RateLimitItemPerSecond(sc.limit, sc.window_s)
        if sc.integration == "websocket":
            async def check(websocket: WebSocket) -> bool:
                return bool(await limiter.hit(item, "ws", _key(websocket.scope)))

            return build_app(ws_check=check)
        if sc.tiers:
            items = {t.name: RateLimitItemPerSecond(t.limit, sc.window_s) for t in sc.tiers}

            async def tiered(request: Request) -> None:
                tier = request.headers.get("x-api-tier", "basic")
                if not await limiter.hit(items[tier], tier, _key(request.scope)):
                    raise HTTPException(429, "Too Many Requests")

            return build_app(dependencies=[Depends(tiered)])
        if sc.integration == "middleware":
            app = build_app()
            app.add_middleware(_Middleware, limiter=limiter, item=item, exempt=("/unthrottled",))
            return app

        async def dependency(request: Request) -> None:
            if not await limiter.hit(item, _key(request.scope)):
                raise HTTPException(429, "Too Many Requests")

        return build_app(dependencies=[Depends(dependency)])

    async def reset(self) -> None:
        if self.store.kind == "memory":  # remote stores are flushed by the harness
            await self.storage.reset()

    async def stop(self) -> None:
        """Close the storage's redis-py client: limits has no close of its own, and an unclosed
        client keeps its connections (one per cluster node) open until it is collected."""
        if self.store.kind in ("redis", "redis-cluster"):
            storage: Any = self.storage
            await storage.bridge.storage.aclose()
