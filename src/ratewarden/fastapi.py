"""FastAPI dependency: ``Depends(RateLimit("10/s", limiter=limiter))``.

Limits are kept per route template and method (``GET /items/{id}``), never per concrete path or
function name; pass ``name=`` to share one limit between routes. Rate-limit headers are added to
the response automatically; a denied request raises ``RateLimitExceeded`` (an ``HTTPException``
with status 429, ``Retry-After`` and rate-limit headers). Call ``install(app)`` to render it as
``application/problem+json`` instead of FastAPI's default ``{"detail": ...}`` JSON, and to keep the
headers on endpoints that return a ``Response`` object themselves (FastAPI drops a dependency's
response headers in that case; the small ASGI step ``install`` adds puts them back).
"""

# No ``from __future__ import annotations`` here: FastAPI reads the dependency's signature, and
# FastAPI before 0.115 cannot resolve string annotations on a callable instance's ``__call__``
# (``response: Response`` became a required query parameter: every request a 422).
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.responses import JSONResponse

from .decision import Decision
from .enforcement import LimitUnavailable, check_rules
from .headers import HeaderMode, HeaderStyle, rate_limit_headers
from .keys import KeyFunc, client_ip
from .limiter import Limiter
from .limits import DEFAULT_ALGORITHM
from .rates import Rate
from .responses import limited_headers, too_many_requests_problem
from .rules import CompiledRule, CostFunc, Rule

__all__ = ["RateLimit", "RateLimitExceeded", "install"]


class RateLimitExceeded(HTTPException):
    """Raised by ``RateLimit`` when a request is over its limit."""

    def __init__(self, decision: Decision, headers: dict[str, str]) -> None:
        self.decision = decision
        self.problem = too_many_requests_problem(decision)
        super().__init__(status_code=429, detail=self.problem["detail"], headers=headers)


class RateLimit:
    """A FastAPI dependency that charges each request to ``key`` under ``rate``."""

    def __init__(
        self,
        rate: str | Rate | Iterable[str | Rate],
        *,
        limiter: Limiter,
        key: KeyFunc = client_ip,
        algorithm: str = DEFAULT_ALGORITHM,
        cost: float | CostFunc = 1,
        name: str | None = None,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
    ) -> None:
        self.limiter = limiter
        self.template = Rule("/**", rate, key=key, algorithm=algorithm, cost=cost, name=name or "route")
        self.name = name
        self.headers = headers
        self.header_style = header_style
        self._compiled: dict[str, tuple[CompiledRule]] = {}
        self._by_route: dict[tuple[int, str], tuple[object, tuple[CompiledRule]]] = {}
        if name is not None:
            self._compiled[""] = (CompiledRule(self.template, limiter.prefix),)

    def _rules_for(self, scope: Any) -> tuple[CompiledRule]:
        if self.name is not None:
            return self._compiled[""]
        route = scope.get("route")
        method = scope.get("method", "GET")
        cached = self._by_route.get((id(route), method))
        if cached is not None and cached[0] is route:
            return cached[1]
        template = getattr(route, "path_format", None) or getattr(route, "path", None) or "<unrouted>"
        scope_name = f"{method} {template}"
        found = self._compiled.get(scope_name)
        if found is None:
            t = self.template
            rule = Rule("/**", t.rate, key=t.key, algorithm=t.algorithm, cost=t.cost, name=scope_name)
            found = (CompiledRule(rule, self.limiter.prefix),)
            if len(self._compiled) < 10_000:
                self._compiled[scope_name] = found
        if route is not None and len(self._by_route) < 10_000:
            self._by_route[(id(route), method)] = (route, found)
        return found

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        limiter = self.limiter
        if not limiter.enabled:
            return None
        scope = request.scope
        try:
            decision = await check_rules(limiter, self._rules_for(scope), scope)
        except LimitUnavailable:
            raise HTTPException(503, "The rate limiter is unavailable; try again shortly.", {"Retry-After": "1"}) from None
        if decision is None:
            return None
        if not decision.allowed:
            raw = limited_headers(decision, self.header_style, self.headers != "off")
            raise RateLimitExceeded(decision, {k.decode("latin-1"): v.decode("latin-1") for k, v in raw})
        if self.headers == "always":
            sink = scope.get(_SINK)
            target = sink if sink is not None else response.headers.raw
            target.extend(rate_limit_headers(decision, self.header_style))
        return decision


async def _problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RateLimitExceeded)
    return JSONResponse(exc.problem, 429, headers=exc.headers, media_type="application/problem+json")


_SINK = "ratewarden.headers"


class _HeaderSink:
    """Appends the headers the dependency collected in the scope when the response starts, so
    they survive endpoints that return their own ``Response``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        collected: list[tuple[bytes, bytes]] = []
        scope[_SINK] = collected

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start" and collected:
                message["headers"] = [*message.get("headers", ()), *collected]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    """Render ``RateLimitExceeded`` as RFC 9457 ``application/problem+json`` and keep rate-limit
    headers on endpoints that return a ``Response`` themselves."""
    app.add_exception_handler(RateLimitExceeded, _problem_handler)
    app.add_middleware(_HeaderSink)
