"""``RateLimiter``: the Sanic extension. App-wide ``rules`` (a ``RuleSet``, as the ASGI middleware
takes them) and per-route ``@limiter.limit`` limits are charged once per request, all or nothing,
by a request middleware (``enforcement.check.check_rules``); a response middleware adds the
rate-limit headers to allowed responses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from sanic import Sanic
from sanic.request import Request
from sanic.response import BaseHTTPResponse, HTTPResponse

from ..algorithms import AlgorithmName
from ..context import context_for
from ..enforcement.answers import HeaderOptions
from ..enforcement.check import LimitUnavailable, check_rules
from ..enforcement.outcome import REFUSE, failed, outcome_of
from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle
from ..keys import KeyFunc, client_ip
from ..limiter import Limiter
from ..limits import DEFAULT_ALGORITHM
from ..route_limits import Declared, RateSpec, RouteLimits
from ..rules import CostFunc, Rule, RuleSet, policy_of
from ..stores.memory import MemoryStore
from .responses import add_headers, outcome_response
from .scope import scope_of

__all__ = ["CONTEXT_ATTR", "RateLimiter"]

CONTEXT_ATTR = "ratewarden"
"""``request.ctx.ratewarden``: the request's ``RequestContext`` (its ``decision``), once checked."""
_HEADERS_ATTR = "ratewarden_headers"
_FIRST = 1_000_000  # the request middleware's priority: limited before the app's own middleware runs

_T = TypeVar("_T")


class RateLimiter:
    """Rate limits for a Sanic app: ``rules`` for every request (matched by method and path, as
    ``RateLimitMiddleware`` matches them) and ``@limiter.limit`` on route handlers (each route with
    its own counter). Every callable given (``key``, ``cost``) takes the request's ASGI-shaped scope
    (``scope_of``: ``scope["sanic.request"]`` is the Sanic request), so ratewarden's key functions
    work as they are; async ones too.

    Args:
        app: The app; ``None``: call ``init_app(app)`` later.
        limiter: Checks the limits on its store; ``None``: a ``Limiter`` on a ``MemoryStore``.
        rules: Limits for every request: a list of ``Rule``, or a ``RuleSet``.
        key: Who a ``@limit`` without its own ``key`` charges (default: the client IP; behind a proxy,
            ``ClientIP(trusted_proxies=...)``).
        algorithm: The algorithm of ``@limit`` limits that name none (default ``"fixed_window"``).
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` or ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
    """

    def __init__(
        self,
        app: Sanic[Any, Any] | None = None,
        limiter: Limiter | None = None,
        rules: Sequence[Rule] | RuleSet = (),
        *,
        key: KeyFunc = client_ip,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
    ) -> None:
        self.answers = HeaderOptions(headers, header_style)
        self.limiter = limiter if limiter is not None else Limiter(MemoryStore())
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(rules, self.limiter.prefix)
        Declared("1/s", key=key)  # a key it cannot call fails here, not per request
        self.routes: RouteLimits[Declared] = RouteLimits(key, algorithm, self.limiter.prefix)
        self.headers = headers
        self.header_style = header_style
        self._apps: set[str] = set()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Sanic[Any, Any]) -> None:
        """Limit ``app``: add the request middleware (before the app's own) and the response one.

        Args:
            app: The Sanic app.
        """
        if app.name in self._apps:
            raise ConfigurationError(f"RateLimiter: init_app was already called for the app {app.name!r}")
        self._apps.add(app.name)
        app.middleware(self._check, "request", priority=_FIRST)
        app.middleware(self._add_headers, "response")

    def limit(
        self,
        rate: RateSpec,
        *,
        key: KeyFunc | None = None,
        cost: float | CostFunc = 1,
        methods: str | Iterable[str] | None = None,
        algorithm: AlgorithmName | None = None,
        name: str | None = None,
    ) -> Callable[[_T], _T]:
        """Limit a route handler (below ``@app.get(...)``, or above it); returns it unchanged.

        Args:
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list.
            key: Who is charged: a key function of the scope; ``None``: the extension's ``key``.
            cost: What one request costs: a number, or a function of the scope.
            methods: The HTTP methods it applies to (``"POST"`` or several; ``"GET"`` includes ``HEAD``);
                ``None``: all.
            algorithm: The algorithm; ``None``: the extension's ``algorithm``.
            name: The counter's name (in storage keys and headers); ``None``: the route's name.
        """
        declared = Declared(rate, key=key, cost=cost, methods=methods, algorithm=algorithm, name=name)

        def decorate(handler: _T) -> _T:
            if not callable(handler):
                raise TypeError(f"RateLimiter.limit decorates route handlers, got {handler!r}")
            self.routes.add(handler, declared)
            return handler

        return decorate

    async def _check(self, request: Request) -> HTTPResponse | None:
        limiter = self.limiter
        if not limiter.enabled:
            return None
        method, path = request.method, request.path
        matched = self.rules.match(method, path)
        route = request.route
        own = self.routes.of(route.name, route.handler) if route is not None else None
        if own is not None:
            matched += own.match(method, path)
        if not matched:
            return None
        scope = scope_of(request)
        try:
            decision = await check_rules(limiter, matched, scope)
        except LimitUnavailable as exc:
            return outcome_response(failed(exc))
        if decision is None:
            return None
        context = context_for(scope)
        context.decision = decision
        setattr(request.ctx, CONTEXT_ATTR, context)
        outcome = outcome_of(decision, self.answers, policy_of(matched))
        if outcome.verdict == REFUSE:
            return outcome_response(outcome)
        if outcome.headers:
            setattr(request.ctx, _HEADERS_ATTR, outcome.headers)
        return None

    async def _add_headers(self, request: Request, response: BaseHTTPResponse) -> None:
        headers = getattr(request.ctx, _HEADERS_ATTR, None)
        if headers:
            add_headers(response, headers)

