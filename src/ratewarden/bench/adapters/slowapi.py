"""slowapi (on the ``limits`` package), configured as the old traffik-vs-SlowAPI suite did."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.middleware import SlowAPIASGIMiddleware

from ..apps import ASGIApp, Endpoint, build_app, client_identity
from .base import Adapter, Unsupported

_STRATEGIES = {
    "fixed_window": "fixed-window",
    "sliding_window": "sliding-window-counter",
    "sliding_log": "moving-window",
}


def _key(request: Request) -> str:
    return client_identity(request.headers, request.client.host if request.client else None)


class SlowapiAdapter(Adapter):
    name = "slowapi"

    def _uri(self) -> str:
        kind = self.store.kind
        if kind == "memory":
            return "memory://"
        if kind in ("redis", "redis-cluster"):
            return self.store.url  # limits reads redis:// and redis+cluster:// itself
        if kind == "memcached":
            host, port = self.store.host_port
            return f"memcached://{host}:{port}"
        if kind == "shm":
            raise Unsupported("slowapi has no shared-memory storage (its memory storage counts per process)")
        raise Unsupported(f"store {kind!r}")

    def build(self) -> ASGIApp:
        sc = self.scenario
        if sc.integration == "websocket":
            raise Unsupported("slowapi has no WebSocket message limiting")
        if sc.rules:
            raise Unsupported("slowapi has no path-rule registry (limits are per decorated route)")
        strategy = self.strategy(_STRATEGIES)
        rate = f"{sc.limit} per {sc.window_s} second"
        middleware = sc.integration == "middleware"
        self.limiter = limiter = Limiter(
            key_func=_key,
            storage_uri=self._uri(),
            strategy=strategy,
            headers_enabled=sc.headers in ("always", "throttled"),
            default_limits=[rate] if middleware else [],
        )
        wrap: Any
        if sc.tiers:
            limits = {t.name: f"{t.limit} per {sc.window_s} second" for t in sc.tiers}
            tiers = {f"{t.name}": t.name for t in sc.tiers}

            def tier_key(request: Request) -> str:
                return tiers.get(request.headers.get("x-api-tier", "basic"), "basic") + ":" + _key(request)

            def tier_limit(key: str) -> str:
                return limits[key.split(":", 1)[0]]

            def wrap(f: Endpoint) -> Endpoint:
                return limiter.limit(tier_limit, key_func=tier_key)(f)  # type: ignore[no-any-return]
        elif middleware:
            wrap = None
        else:
            def wrap(f: Endpoint) -> Endpoint:
                return limiter.limit(rate)(f)  # type: ignore[no-any-return]
        app = build_app(wrap=wrap, exempt=limiter.exempt if middleware else None)
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
        if middleware:
            app.add_middleware(SlowAPIASGIMiddleware)
        return app

    async def reset(self) -> None:
        if self.store.kind != "redis-cluster":  # the harness flushes every primary; limits keeps no local state
            self.limiter.reset()

    async def stop(self) -> None:
        """Close limits' redis-py client (slowapi has no close of its own): otherwise its
        connections stay open until it is collected."""
        if self.store.kind in ("redis", "redis-cluster"):
            storage: Any = self.limiter._storage
            storage.storage.close()
