"""FastAPI dependency: ``Depends(RateLimit("10/s", limiter=limiter))``.

Limits are kept per route template and method (``GET /items/{id}``), never per concrete path or
function name; pass ``name=`` to share one limit between routes. Rate-limit headers are added to
the response automatically; a denied request raises ``RateLimitExceeded`` (an ``HTTPException``
with status 429, ``Retry-After`` and rate-limit headers). Call ``install(app)`` to render it as
``application/problem+json`` instead of FastAPI's default ``{"detail": ...}`` JSON, and to keep the
headers on endpoints that return a ``Response`` object themselves (FastAPI drops a dependency's
response headers in that case; the small ASGI step ``install`` adds puts them back).
"""

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from ..asgi.responses import LimitHandler, adding_missing_headers
from ..decision import Decision
from ..enforcement.answers import problem_headers, too_many_requests_body
from ..errors import ConfigurationError
from ..starlette import answer_response
from ..types import ASGIApp, Receive, Scope, Send
from .dependency import RateLimit, RateLimitExceeded
from .dependency import route_context as route_context  # re-exported: importable from here
from .edge import EdgeAnswer, EdgeLayer
from .openapi import document_limits
from .routes import edge_layer

__all__ = ["RateLimit", "RateLimitExceeded", "install"]


async def _problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RateLimitExceeded)
    # The middleware's and the edge's 429, byte for byte: ``rejection``'s body and header list
    # (content type and length, then the exception's headers: those ``limited_headers`` built).
    body = too_many_requests_body(exc.decision)
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()]
    return answer_response(429, body, problem_headers(body, extra))


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
    layer = edge_layer(app, fastapi_app, lift)
    layer.on_limit = edge_answer(fastapi_app)
    return layer


def install(app: FastAPI, *, lift: bool = True, on_limit: LimitHandler | None = None) -> None:
    """Set ``app`` up for its ``RateLimit`` dependencies.

    * Edge enforcement: the limits declared with ``Depends(RateLimit(...))`` (on routes, routers
      or the app) are checked in an ASGI layer before routing; a denied request is answered there
      and an allowed one is charged once (see ``ratewarden.fastapi.routes``).
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
