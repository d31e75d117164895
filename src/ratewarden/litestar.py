"""Litestar integration: ``RateLimitPlugin``, app-wide ``rules`` and per-route limits from a route
handler's ``opt`` (``opt={"rate_limit": "5/minute"}``). It only translates: each route handler gets
the core's pure ASGI ``RateLimitMiddleware`` with the app's rules and its own, which checks and
sends every answer (the 429, 503 and 400, the rate-limit headers), as on every other door."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, cast

try:
    import litestar  # noqa: F401
except ImportError:  # pragma: no cover - the litestar extra is not installed
    raise ImportError("ratewarden.litestar needs Litestar: pip install 'ratewarden[litestar]'") from None

from litestar.config.app import AppConfig
from litestar.plugins.base import InitPluginProtocol, ReceiveRoutePlugin
from litestar.routes import BaseRoute
from litestar.types import Middleware

from .algorithms import AlgorithmName
from .asgi.middleware import RateLimitMiddleware
from .headers import HeaderMode, HeaderStyle
from .keys import KeyFunc, client_ip
from .limiter import Limiter
from .limits import DEFAULT_ALGORITHM
from .route_limits import Declared, RouteLimits
from .rules import Rule
from .stores.memory import MemoryStore
from .types import ASGIApp, Receive, Scope, Send

__all__ = ["RateLimitPlugin", "RouteLimit"]

RouteLimit = Declared
"""A route's limit with its own ``key``, ``cost``, ``methods``, ``algorithm`` or ``name``, as an
``opt`` value: ``opt={"rate_limit": RouteLimit("10/min", key=header("X-API-Key"))}``."""


class RateLimitPlugin(InitPluginProtocol, ReceiveRoutePlugin):
    """Rate limits for a Litestar app: ``rules`` for every routed request (matched by method and
    path, as ``RateLimitMiddleware`` matches them) and each route handler's ``opt[opt_key]`` (a
    rate, several, or a ``RouteLimit``), charged together, all or nothing.

    Args:
        limiter: Checks the limits on its store; ``None``: a ``Limiter`` on a ``MemoryStore``.
        rules: Limits for every request: a list of ``Rule``.
        opt_key: The route option that declares a route's limit.
        key: Who a route's limit without its own ``key`` charges (default: the client IP).
        algorithm: The algorithm of a route's limit that names none (default ``"fixed_window"``).
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` or ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
    """

    def __init__(
        self,
        limiter: Limiter | None = None,
        rules: Sequence[Rule] = (),
        *,
        opt_key: str = "rate_limit",
        key: KeyFunc = client_ip,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
    ) -> None:
        self.limiter = limiter if limiter is not None else Limiter(MemoryStore())
        # The core checks the options and rules here: a bad one fails when the app is built.
        core = RateLimitMiddleware(_unused, self.limiter, rules, headers=headers, header_style=header_style)
        self.rules = core.rules.rules
        self.opt_key = opt_key
        Declared("1/s", key=key)  # a key it cannot call fails here, not per request
        self.routes: RouteLimits[Declared] = RouteLimits(key, algorithm, self.limiter.prefix)
        self.headers = headers
        self.header_style = header_style

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        """Add the limits as the app's first middleware, and the store's check to its start-up.

        Args:
            app_config: The app's configuration, as Litestar hands it to a plugin.
        """
        app_config.middleware.insert(0, cast("Middleware", self.middleware))
        app_config.on_startup.append(self._check_store)
        return app_config

    def receive_route(self, route: BaseRoute) -> None:
        """Declare the limit in each handler's ``opt``: a bad rate or key fails when the app is built.

        Args:
            route: A route Litestar registers.
        """
        for handler in getattr(route, "route_handlers", None) or [getattr(route, "route_handler", None)]:
            spec = handler.opt.get(self.opt_key) if handler is not None else None
            if spec is not None and handler not in self.routes.declared:  # one handler, several paths
                self.routes.add(handler, spec if isinstance(spec, Declared) else Declared(spec))

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """Litestar's middleware factory.

        Args:
            app: One route handler's ASGI app.
        """
        return _RouteDoor(self, app)

    def core_for(self, handler: Any, app: ASGIApp) -> RateLimitMiddleware:
        """The core's middleware for ``handler``: the app's rules, then the route's own.

        Args:
            handler: The route handler (``None``: the app's rules alone).
            app: Its ASGI app.
        """
        own = self.routes.rules(_name(handler), handler, "") if handler is not None else []
        rules = [*self.rules, *own]
        return RateLimitMiddleware(app, self.limiter, rules, headers=self.headers, header_style=self.header_style)

    async def _check_store(self) -> None:
        if self.limiter.enabled:
            await self.limiter.check_store()


class _RouteDoor:
    """Pure ASGI, before one route handler: hands each request to the core's middleware built for
    the handler Litestar routed it to (``scope["route_handler"]``)."""

    __slots__ = ("app", "cores", "plugin")

    def __init__(self, plugin: RateLimitPlugin, app: ASGIApp) -> None:
        self.plugin = plugin
        self.app = app
        self.cores: dict[Any, RateLimitMiddleware] = {}

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        handler = scope.get("route_handler")
        core = self.cores.get(handler)
        if core is None:
            core = self.cores[handler] = self.plugin.core_for(handler, self.app)
        return core.handle(scope, receive, send)


async def _unused(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of the core built only to check the plugin's options: never called."""


def _name(handler: Any) -> str:
    """A route's counter: the handler's ``name=``, else its function's module-qualified name."""
    fn = handler.fn
    return handler.name or f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', handler.handler_name)}"
