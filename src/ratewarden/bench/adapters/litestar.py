"""The Litestar pair, measured against a bare Litestar app (``results.baseline_of``): Litestar's own
``RateLimitConfig`` (``litestar.middleware.rate_limit``, the limiter a Litestar user has today) and
``ratewarden.litestar.RateLimitPlugin``. The app has the routes of ``apps.build_app`` that the HTTP
scenarios send to; each adapter keeps its library's defaults (rate-limit headers on)."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request, get, post
from litestar.datastructures import State
from litestar.middleware.rate_limit import DURATION_VALUES, DurationUnit, RateLimitConfig
from litestar.stores.base import Store
from litestar.stores.memory import MemoryStore
from litestar.stores.redis import RedisStore
from litestar.types import Middleware

from ratewarden import Limiter
from ratewarden.litestar import RateLimitPlugin, RouteLimit

from ...algorithms import algorithm_name
from ..apps import ASGIApp, HandlerRuns, client_identity, heavy_work
from .base import Adapter, Unsupported
from .ratewarden import _HEADERS, _KEY, RatewardenAdapter

__all__ = ["LitestarAdapter", "LitestarBareAdapter", "RatewardenLitestarAdapter", "litestar_app"]

OK = {"status": "ok"}


def litestar_app(limited: dict[str, Any] | None = None, **app: Any) -> Litestar:
    """The benchmark routes on Litestar: ``limited`` (``opt``, ``middleware``) applies to the limited
    routes, ``app`` to the app; ``app.state.bench_handler_runs`` counts the limited handlers' runs."""
    runs = HandlerRuns()
    route = limited or {}

    @get("/test", **route)
    async def test() -> dict[str, str]:
        runs.n += 1
        return OK

    @get("/heavy", **route)
    async def heavy() -> dict[str, Any]:
        runs.n += 1
        return {"status": "ok", "sum": int(heavy_work())}

    @post("/json", status_code=200, **route)
    async def json_body(request: Request[Any, Any, Any]) -> dict[str, Any]:
        runs.n += 1
        data = await request.json()
        return {"status": "ok", "items": len(data.get("items", ()))}

    @get("/items/{item_id:int}/{sub:str}", **route)
    async def items(request: Request[Any, Any, Any]) -> dict[str, Any]:
        runs.n += 1
        p = request.path_params
        return {"status": "ok", "item_id": p["item_id"], "sub": p["sub"]}

    @get("/search", **route)
    async def search(request: Request[Any, Any, Any]) -> dict[str, Any]:
        runs.n += 1
        q = request.query_params
        return {"status": "ok", "n": len(q), "page": int(q.get("page", "1"))}

    @get("/unthrottled", opt={"exempt": True})
    async def unthrottled() -> dict[str, str]:
        return OK

    handlers = [test, heavy, json_body, items, search, unthrottled]
    return Litestar(handlers, state=State({"bench_handler_runs": runs}), openapi_config=None, **app)


def _http_only(adapter: Adapter) -> None:
    sc = adapter.scenario
    if sc.integration == "websocket" or sc.tiers or sc.rules:
        raise Unsupported("the Litestar pair runs the HTTP scenarios (no WebSocket, tiers or path-rule variants)")
    if sc.path.split("?", 1)[0].startswith(("/form", "/api/")):
        raise Unsupported(f"the Litestar app has no route {sc.path}")


class LitestarBareAdapter(Adapter):
    """The baseline of the pair: the same Litestar app, no limiter."""

    name = "litestar-bare"

    def build(self) -> ASGIApp:
        _http_only(self)
        return litestar_app()  # type: ignore[return-value]


class LitestarAdapter(Adapter):
    """``RateLimitConfig``: its own fixed window (from a key's first request), a history of
    timestamps per key in a Litestar store (memory, or Redis), app-wide or on the limited routes."""

    name = "litestar"

    def build(self) -> ASGIApp:
        _http_only(self)
        sc = self.scenario
        units = {seconds: unit for unit, seconds in DURATION_VALUES.items()}
        if sc.window_s not in units or sc.algorithm != "fixed_window":
            raise Unsupported(f"RateLimitConfig has one algorithm (its fixed window) of a second, minute, hour "
                              f"or day, not {sc.algorithm} over {sc.window_s}s")
        if sc.headers == "throttled":
            raise Unsupported("RateLimitConfig sends its headers on every response or never")
        self.litestar_store = self._store()
        unit: DurationUnit = units[sc.window_s]
        config = RateLimitConfig(
            (unit, sc.limit), exclude_opt_key="exempt", identifier_for_request=_identity,
            set_rate_limit_headers=sc.headers != "none",
        )
        middleware: list[Middleware] = [config.middleware]
        stores = {"rate_limit": self.litestar_store}
        if sc.integration == "middleware":
            return litestar_app(middleware=middleware, stores=stores)  # type: ignore[return-value]
        return litestar_app({"middleware": middleware}, stores=stores)  # type: ignore[return-value]

    def _store(self) -> Store:
        if self.store.kind == "memory":
            return MemoryStore()
        if self.store.kind == "redis":
            return RedisStore.with_client(self.store.url)
        raise Unsupported(f"RateLimitConfig runs here on Litestar's memory and Redis stores, not {self.store.kind}")

    async def reset(self) -> None:
        await self.litestar_store.delete_all()

    async def stop(self) -> None:
        if isinstance(self.litestar_store, RedisStore):
            await self.litestar_store.__aexit__(None, None, None)


def _identity(request: Request[Any, Any, Any]) -> str:
    return client_identity(request.headers, request.client.host if request.client else None)


class RatewardenLitestarAdapter(RatewardenAdapter):
    """``RateLimitPlugin``: ``rules`` as the ASGI middleware's (middleware scenarios), or each limited
    route's ``opt`` (dependency scenarios); ratewarden's stores, reset and stop."""

    name = "ratewarden-litestar"

    def build(self) -> ASGIApp:
        _http_only(self)
        sc = self.scenario
        self.limiter = limiter = Limiter(self._store())
        headers: Any = _HEADERS[sc.headers]
        if sc.integration == "middleware":
            plugin = RateLimitPlugin(limiter, self._rules(), headers=headers)
            return litestar_app(plugins=[plugin])  # type: ignore[return-value]
        limit = RouteLimit(sc.rate, key=_KEY, algorithm=algorithm_name(sc.algorithm))
        plugin = RateLimitPlugin(limiter, headers=headers)
        return litestar_app({"opt": {"rate_limit": limit}}, plugins=[plugin])  # type: ignore[return-value]
