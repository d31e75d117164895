"""ratewarden through its public API: ``RateLimitMiddleware`` + ``Rule``, or ``Depends(RateLimit(...))``.

Defaults are kept (rate-limit headers on every response, the store's own options), so the numbers
are what an unconfigured user gets.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request, Response
from fastapi.params import Depends

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.fastapi import RateLimit, install
from ratewarden.keys import header
from ratewarden.stores.base import Store

from ...algorithms import algorithm_name
from ..apps import ASGIApp, build_app
from .base import Adapter, Unsupported

_KEY = header("X-Client-ID")
_HEADERS = {"": "always", "none": "off", "always": "always", "throttled": "on_limit"}
_OTHER_RULE_PATHS = ("/users/*", "/orders/**", "/admin/**", "/auth/login", "/auth/*", "/search", "/files/**",
                     "/v2/**", "/reports/*")


class RatewardenAdapter(Adapter):
    name = "ratewarden"

    def _store(self) -> Store:
        kind = self.store.kind
        if kind == "memory":
            return MemoryStore()
        if kind == "shm":
            from ratewarden.stores.urls import open_store

            return open_store(self.store.url)
        if kind in ("redis", "redis-cluster"):
            from ratewarden.stores.redis import RedisStore

            if self.scenario.workers != 1:
                # The multi-worker rows test whether the limit holds across processes: with more
                # processes than cores, a 25 ms check timeout (then fail-open) would test the scheduler.
                return RedisStore(self.store.url, timeout=1.0)
            return RedisStore(self.store.url)
        if kind == "memcached":
            from ratewarden.stores.memcached import MemcachedStore

            host, port = self.store.host_port
            return MemcachedStore(f"memcached://{host}:{port}")
        raise Unsupported(f"store {kind!r}")

    def build(self) -> ASGIApp:
        sc = self.scenario
        self.limiter = limiter = Limiter(self._store())
        algo = algorithm_name(sc.algorithm)
        headers: Any = _HEADERS[sc.headers]
        if sc.integration == "websocket":
            app = build_app()
            rule = Rule("/ws", message_rate=sc.rate, key=_KEY, algorithm=algo, name="ws")
            app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[rule])
            return app
        if sc.tiers:
            tiers = {t.name: RateLimit(f"{t.limit}/{sc.window_s}s", limiter=limiter, key=_KEY, algorithm=algo,
                                       name=f"tier-{t.name}") for t in sc.tiers}

            async def tiered(request: Request, response: Response) -> None:
                await tiers[request.headers.get("x-api-tier", "basic")](request, response)

            app = build_app(dependencies=[Depends(tiered)])
            install(app)
            return app
        if sc.integration == "middleware":
            app = build_app()
            app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=self._rules(), headers=headers)
            return app
        dep = RateLimit(sc.rate, limiter=limiter, key=_KEY, algorithm=algo, headers=headers)
        app = build_app(dependencies=[Depends(dep)])
        install(app)
        return app

    def _rules(self) -> list[Rule]:
        sc = self.scenario
        rate, algo = sc.rate, algorithm_name(sc.algorithm)
        if not sc.rules:
            return [Rule("/unthrottled", bypass=True), Rule("/**", rate, key=_KEY, algorithm=algo)]
        pattern: Any = {
            "none": "/**",
            "single": "/api/v1/items/7",
            "wildcard": "/api/v1/items/*",
            "deep": "/api/**",
            "bypass": "/api/**",
            "many": "/api/v1/items/*",
            "regex": re.compile(r"/api/v1/items/\d+"),
        }[sc.rules]
        rules = [Rule(pattern, rate, key=_KEY, algorithm=algo)]
        if sc.rules == "bypass":
            rules.insert(0, Rule("/health", bypass=True))
        if sc.rules == "many":
            rules = [Rule(p, rate, key=_KEY, algorithm=algo) for p in _OTHER_RULE_PATHS] + rules
        return rules

    async def reset(self) -> None:
        await self.limiter.clear()

    async def stop(self) -> None:
        await self.limiter.close()

    def without_store(self) -> dict[str, int] | None:
        """``Limiter.without_store()`` (timeouts, unreachable store, insurance limiter answers,
        local over-limit cache), where this version of ratewarden has it."""
        method = getattr(self.limiter, "without_store", None)
        if method is None:
            return None
        return {str(k): int(v) for k, v in dict(method()).items()}
