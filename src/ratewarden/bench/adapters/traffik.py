"""traffik 1.2.x, configured as its own benchmark suite does (32 in-memory shards, ``persistent=False``)."""

from __future__ import annotations

import itertools
import re
from typing import Any

from fastapi import Request, WebSocket
from fastapi.params import Depends
from starlette.requests import HTTPConnection
from traffik import HTTPThrottle, ThrottleRegistry, WebSocketThrottle, is_throttled
from traffik import strategies as ts
from traffik.backends.base import ThrottleBackend
from traffik.middleware import MiddlewareThrottle, ThrottleMiddleware
from traffik.registry import Bypass

from ..apps import ASGIApp, build_app, client_identity
from .base import Adapter, Unsupported

_STRATEGIES: dict[str, Any] = {
    "fixed_window": ts.FixedWindow,
    "sliding_window": ts.SlidingWindowCounter,
    "sliding_log": ts.SlidingWindowLog,
    "token_bucket": ts.TokenBucket,
    "token_bucket_debt": ts.TokenBucketWithDebt,
    "leaky_bucket": ts.LeakyBucket,
    "gcra": ts.GCRA,
}
_uids = itertools.count()


async def _identifier(connection: HTTPConnection) -> str:
    return client_identity(connection.headers, connection.client.host if connection.client else None)


async def _quiet(*args: Any) -> None:
    """WebSocket throttled handler that sends nothing: the app answers with its own single frame."""


class TraffikAdapter(Adapter):
    name = "traffik"

    def _backend(self) -> ThrottleBackend[Any, Any]:
        kind = self.store.kind
        if kind == "memory":
            from traffik.backends.inmemory import InMemoryBackend

            return InMemoryBackend(namespace="bench", number_of_shards=32, persistent=False)
        if kind == "shm":
            # Experimental in traffik 1.2: it expects start() in a parent that then forks its workers;
            # each worker that starts it on its own (uvicorn --workers spawns) makes its own segment.
            from traffik.backends.multiprocess import MultiProcessInMemoryBackend

            return MultiProcessInMemoryBackend(namespace="bench", shared_memory_name=self.store.table_name,
                                               persistent=False)
        if kind == "redis":
            from traffik.backends.redis.aioredis import RedisBackend

            return RedisBackend(self.store.url, namespace="bench", persistent=False)
        if kind == "redis-cluster":
            from traffik.backends.redis.aioredis import RedisBackend

            # A list of nodes makes traffik build a RedisCluster client. Its clear() fails on a cluster
            # (a 0-key SCAN script), so the state is kept (persistent) and the harness flushes the primaries.
            return RedisBackend([self.store.host_port], namespace="bench", persistent=True)
        if kind == "memcached":
            try:
                from traffik.backends.memcached.aiomcache import MemcachedBackend
            except ImportError as exc:
                raise Unsupported(f"traffik's Memcached backend needs aiomcache ({exc})") from None
            host, port = self.store.host_port
            return MemcachedBackend(host=host, port=port, namespace="bench", persistent=False, track_keys=True)
        raise Unsupported(f"store {kind!r}")

    def _throttle(self, rate: str, ws: bool = False, **kw: Any) -> Any:
        sc = self.scenario
        strategy = _STRATEGIES[sc.algorithm]()
        cls = WebSocketThrottle if ws else HTTPThrottle
        return cls(uid=f"bench-{next(_uids)}", rate=rate, identifier=_identifier, strategy=strategy,
                   backend=self.backend, registry=self.registry, **kw)

    def build(self) -> ASGIApp:
        sc = self.scenario
        if sc.headers not in ("", "none"):
            raise Unsupported("traffik never sends rate-limit headers by itself (handlers must call set_headers)")
        self.backend = self._backend()
        self.registry = ThrottleRegistry()
        if sc.integration == "websocket":
            throttle = self._throttle(sc.rate, ws=True, handle_throttled=_quiet)

            async def check(websocket: WebSocket) -> bool:
                await throttle.hit(websocket, context={"scope": "message"})
                return not is_throttled(websocket)

            return build_app(ws_check=check)
        if sc.tiers:
            tiers = {t.name: self._throttle(f"{t.limit}/{sc.window_s}s") for t in sc.tiers}

            async def tiered(request: Request) -> None:
                await tiers[request.headers.get("x-api-tier", "basic")](request)

            return build_app(dependencies=[Depends(tiered)])
        if sc.integration == "middleware":
            entries = self._middleware_entries()
            app = build_app()
            app.add_middleware(ThrottleMiddleware, middleware_throttles=entries, backend=self.backend)
            return app
        throttle = self._throttle(sc.rate)
        return build_app(dependencies=[Depends(throttle)])

    def _middleware_entries(self) -> list[MiddlewareThrottle[Any]]:
        sc = self.scenario
        rate = sc.rate
        variant = sc.rules or "single"
        if not sc.rules:
            # Limit everything except the exempt path, like the other libraries' middleware setups.
            t = self._throttle(rate)
            return [MiddlewareThrottle(t, path=p, methods={"GET", "POST"})
                    for p in ("/test", "/heavy", "/json", "/items/**", "/search", "/form", "/tiered")]
        pattern: Any = {
            "none": None,
            "single": "/api/v1/items/7",
            "wildcard": "/api/v1/items/*",
            "deep": "/api/**",
            "bypass": "/api/**",
            "many": "/api/v1/items/*",
            "regex": re.compile(r"^/api/v1/items/\d+$"),
        }[variant]
        rules: list[Any] | None = [Bypass(path="/health")] if variant == "bypass" else None
        entries = [MiddlewareThrottle(self._throttle(rate, rules=rules), path=pattern)]
        if variant == "many":
            for p in ("/users/*", "/orders/**", "/admin/**", "/auth/login", "/auth/*", "/search",
                      "/files/**", "/v2/**", "/reports/*"):
                entries.insert(0, MiddlewareThrottle(self._throttle(rate), path=p))
        return entries

    async def start(self) -> None:
        await self.backend.initialize()

    async def reset(self) -> None:
        if self.store.kind != "redis-cluster":
            await self.backend.reset()

    async def stop(self) -> None:
        await self.backend.close()
