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
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from .algorithms import AlgorithmName
from .asgi.edge import SINK_KEY as _SINK
from .asgi.edge import EdgeAnswer, EdgeLayer
from .context import context_of
from .decision import Decision
from .enforcement import LimitUnavailable, check_rules
from .errors import ConfigurationError, RatewardenError
from .headers import HeaderMode, HeaderStyle, rate_limit_headers
from .keys import KeyFunc, client_ip
from .limiter import Limiter
from .limits import DEFAULT_ALGORITHM
from .rates import Rate
from .responses import (
    LimitHandler,
    adding_missing_headers,
    limited_headers,
    too_many_requests_body,
    too_many_requests_problem,
)
from .rules import CompiledRule, CostFunc, Rule
from .types import ASGIApp, Receive, Scope, Send

__all__ = ["RateLimit", "RateLimitExceeded", "install"]


class RateLimitExceeded(HTTPException, RatewardenError):
    """Raised by ``RateLimit`` when a request is over its limit.

    Args:
        decision: The denying decision.
        headers: The 429's headers (``Retry-After``, rate-limit headers).
    """

    def __init__(self, decision: Decision, headers: dict[str, str]) -> None:
        self.decision = decision
        self.problem = too_many_requests_problem(decision)
        super().__init__(status_code=429, detail=self.problem["detail"], headers=headers)


class RateLimit:
    """A FastAPI dependency that charges each request to ``key`` under ``rate``.

    Args:
        rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
            every one must allow.
        limiter: Checks the limit on its store.
        key: Who is charged: a key function of the scope (default: the client IP).
        algorithm: The algorithm's name (default ``"fixed_window"``).
        cost: What one request costs: a number, or a function of the scope.
        name: One limit shared by every route using this dependency; the default ``None`` counts per route
            template and method.
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` (429 answers only) or
            ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` (draft-10
            ``RateLimit``/``RateLimit-Policy``) or ``"legacy"`` (``X-RateLimit-*``).
    """

    def __init__(
        self,
        rate: str | Rate | Iterable[str | Rate],
        *,
        limiter: Limiter,
        key: KeyFunc = client_ip,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
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
        return self.rules_for_route(route, route_context(scope, route), scope.get("method", "GET"))

    def rules_for_route(self, route: object, context: object, method: str) -> tuple[CompiledRule]:
        """The rules this dependency charges on ``route`` for ``method``: per route template and
        method (``GET /items/{id}``; the full path when the route comes from an included router,
        given by FastAPI's ``context``), or the one shared limit when ``name`` was given.

        Args:
            route: The route.
            context: FastAPI's context for it (gives the full path of included routers).
            method: The HTTP method.
        """
        if self.name is not None:
            return self._compiled[""]
        owner = context if context is not None else route
        cached = self._by_route.get((id(owner), method))
        if cached is not None and cached[0] is owner:
            return cached[1]
        template = (
            getattr(context, "path_format", None)
            or getattr(route, "path_format", None)
            or getattr(route, "path", None)
            or "<unrouted>"
        )
        scope_name = f"{method} {template}"
        found = self._compiled.get(scope_name)
        if found is None:
            t = self.template
            rule = Rule("/**", t.rate, key=t.key, algorithm=t.algorithm, cost=t.cost, name=scope_name)
            found = (CompiledRule(rule, self.limiter.prefix),)
            if len(self._compiled) < 10_000:
                self._compiled[scope_name] = found
        if owner is not None and len(self._by_route) < 10_000:
            self._by_route[(id(owner), method)] = (owner, found)
        return found

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        limiter = self.limiter
        if not limiter.enabled:
            return None
        scope = request.scope
        context = context_of(scope)
        if context is not None:
            edge = context.edge
            if edge is not None and edge.covers(self, scope.get("route")):
                found: Decision | None = edge.decision  # the edge layer install() adds has charged this request
                return found
        try:
            decision = await check_rules(limiter, self._rules_for(scope), scope)
        except LimitUnavailable:
            raise HTTPException(503, "The rate limiter is unavailable; try again shortly.", {"Retry-After": "1"}) from None
        if decision is None:
            return None
        if not decision.allowed:
            raw = limited_headers(decision, self.header_style, self.headers != "off")
            sink = scope.get(_SINK)
            if sink is not None:  # under install(): the 429 keeps these, whichever handler answers
                sink[:] = raw
            raise RateLimitExceeded(decision, {k.decode("latin-1"): v.decode("latin-1") for k, v in raw})
        if self.headers == "always":
            sink = scope.get(_SINK)
            target = sink if sink is not None else response.headers.raw
            target.extend(rate_limit_headers(decision, self.header_style))
        return decision




def route_context(scope: Any, route: object) -> object:
    """FastAPI's per-inclusion context of ``route`` (which knows the full, prefixed path of a
    route from an included router), when this FastAPI version has one."""
    context = scope.get("fastapi", {}).get("effective_route_context") if "fastapi" in scope else None
    if context is not None and getattr(context, "original_route", None) is route:
        return context
    return None


async def _problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RateLimitExceeded)
    # The same bytes as the middleware's and the edge's 429 (one problem+json encoder).
    body = too_many_requests_body(exc.decision)
    return Response(body, 429, headers=exc.headers, media_type="application/problem+json")


class _LimitAnswer(Response):
    """What ``on_limit`` returned (any ASGI app) as the ``Response`` an exception handler returns,
    sent with the 429's headers it does not set itself. Nothing of ``Response`` but the type is
    used: Starlette only calls it."""

    def __init__(self, app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> None:  # no body of its own
        self.app = app
        self.extra = headers
        self.status_code = 429

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, adding_missing_headers(send, self.extra))


class _OnLimitHandler:
    """The ``RateLimitExceeded`` handler ``install(app, on_limit=...)`` registers: ``on_limit``
    answers a denial the dependency raises, with the contract it has at the edge (and in
    ``RateLimitMiddleware``): it gets the scope and the decision and returns an ASGI app."""

    def __init__(self, on_limit: LimitHandler) -> None:
        self.on_limit = on_limit

    async def __call__(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RateLimitExceeded)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()]
        return _LimitAnswer(await self.answer(request.scope, exc.decision), headers)

    async def answer(self, scope: Scope, decision: Decision) -> ASGIApp:
        """``on_limit``'s ASGI app for this denial."""
        response = self.on_limit(scope, decision)
        if inspect.isawaitable(response):
            return await response
        return response

    async def at_edge(
        self, scope: Scope, receive: Receive, decision: Decision, headers: list[tuple[bytes, bytes]]
    ) -> ASGIApp:
        """The edge's answer (the edge adds the headers)."""
        return await self.answer(scope, decision)


Handler = Callable[[Request, Exception], "Response | Awaitable[Response]"]


def limit_handler(app: FastAPI) -> Handler | None:
    """The exception handler FastAPI calls for a ``RateLimitExceeded``, as its exception middleware
    picks it: a handler for status 429 first, then one for the class or the nearest base class
    (``None`` when there is none).

    Args:
        app: The FastAPI app.
    """
    handlers: dict[Any, Handler] = getattr(app, "exception_handlers", None) or {}
    found = handlers.get(429)
    if found is not None:
        return found
    for cls in RateLimitExceeded.__mro__:
        if cls is Exception:  # a handler for Exception is the server-error handler, not this one
            break
        if cls in handlers:
            return handlers[cls]
    return None


def _is_async(handler: object) -> bool:
    """Whether ``handler`` returns an awaitable (as Starlette tells: sync handlers run in a thread)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))  # noqa: B004


def _calling(handler: Handler) -> EdgeAnswer:
    """The edge's answer through the app's own exception handler: called as FastAPI calls it, with
    the request and a ``RateLimitExceeded`` carrying the decision and the 429's headers."""

    async def answer(
        scope: Scope, receive: Receive, decision: Decision, headers: list[tuple[bytes, bytes]]
    ) -> ASGIApp | None:
        exc = RateLimitExceeded(decision, {k.decode("latin-1"): v.decode("latin-1") for k, v in headers})
        request = Request(scope, receive)
        if _is_async(handler):
            response = await cast("Awaitable[Response | None]", handler(request, exc))
        else:
            response = cast("Response | None", await run_in_threadpool(handler, request, exc))
        return response

    return answer


def edge_answer(app: FastAPI) -> EdgeAnswer | None:
    """How the edge answers a denial on ``app``: as FastAPI would answer the ``RateLimitExceeded``
    (``None``: the default problem+json 429, sent straight from the edge).

    Args:
        app: The FastAPI app.
    """
    handler = limit_handler(app)
    if handler is None or handler is _problem_handler:
        return None
    if isinstance(handler, _OnLimitHandler):
        return handler.at_edge
    return _calling(handler)


def _edge(app: ASGIApp, fastapi_app: FastAPI, lift: bool = True) -> EdgeLayer:
    """The edge layer ``install`` adds. Built with the middleware stack, when FastAPI reads its
    exception handlers too: the layer answers denials with the handler FastAPI would call, also one
    registered after ``install``."""
    from .edge import edge_layer

    layer = edge_layer(app, fastapi_app, lift)
    layer.on_limit = edge_answer(fastapi_app)
    return layer


def install(app: FastAPI, *, lift: bool = True, on_limit: LimitHandler | None = None) -> None:
    """Set ``app`` up for its ``RateLimit`` dependencies.

    * Edge enforcement: the limits declared with ``Depends(RateLimit(...))`` (on routes, routers
      or the app) are checked in an ASGI layer before routing; a denied request is answered there
      and an allowed one is charged once (see ``ratewarden.edge``).
    * A denied request gets the app's own answer if it has one: ``on_limit``, else an exception
      handler for ``RateLimitExceeded`` (or status 429), registered before or after ``install``
      (the edge calls it as FastAPI would); else RFC 9457 ``application/problem+json``. The edge and
      a dependency checking for itself answer alike, with ``Retry-After`` and the rate-limit headers
      added when the answer does not set them. ``install`` never replaces a handler.
    * Rate-limit headers stay on endpoints that return a ``Response`` themselves.
    * The OpenAPI schema documents the 429 answer and the rate-limit headers of limited routes.

    Overrides keep FastAPI's behaviour: while ``app.dependency_overrides`` replaces a route's
    ``RateLimit``, the edge leaves that route's limits alone and FastAPI calls the override (lifted
    dependencies are put back).

    Args:
        app: The FastAPI app.
        lift: Take the ``RateLimit`` dependencies whose value is unused (those in
            ``dependencies=[...]`` lists) out of FastAPI's dependency solving once the edge has placed
            their route, which saves what FastAPI spends running a dependency (about 10 µs) on every
            allowed request. ``False`` keeps every dependency in FastAPI's solving (each returns the
            edge's decision without charging again).
        on_limit: Replaces the problem+json 429, as in ``RateLimitMiddleware``: gets the scope and
            the decision and returns an ASGI app (e.g. a Starlette ``Response``), awaitable or not.
            Registered as the ``RateLimitExceeded`` handler; a handler for ``RateLimitExceeded`` or
            status 429 registered later replaces it, as any later registration does in FastAPI.

    Raises:
        ConfigurationError: ``on_limit`` is given and the app already has a handler for
            ``RateLimitExceeded`` (or status 429): one of them would be ignored.
    """
    from .openapi import document_limits

    handlers = app.exception_handlers
    existing = limit_handler(app) if (429 in handlers or RateLimitExceeded in handlers) else None
    ours = existing is _problem_handler or isinstance(existing, _OnLimitHandler)  # install() called again
    if on_limit is not None:
        if existing is not None and not ours:
            raise ConfigurationError(
                f"install(app, on_limit=...): the app already has an exception handler for "
                f"{'status 429' if 429 in handlers else 'RateLimitExceeded'} ({existing!r}), which would "
                f"answer some denied requests and on_limit the others; keep one of them"
            )
        app.add_exception_handler(RateLimitExceeded, _OnLimitHandler(on_limit))
    elif RateLimitExceeded not in handlers:
        app.add_exception_handler(RateLimitExceeded, _problem_handler)
    app.add_middleware(_edge, fastapi_app=app, lift=lift)
    document_limits(app)
