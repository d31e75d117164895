"""Edge enforcement: limits declared with ``Depends(RateLimit(...))`` checked before FastAPI routes.

``ratewarden.fastapi.install(app)`` adds ``EdgeLayer``. For each HTTP request it finds the route
FastAPI will run, using FastAPI's and Starlette's own ``route.matches`` in route order (prefixes,
included routers, mounts, path converters, methods), collects the ``RateLimit`` dependencies of that
route's dependency tree (route, router and app level) and charges them once, before routing and
dependency solving. A denied request gets the same problem+json 429 as ``RateLimitMiddleware`` and
never reaches the router. An allowed one carries an ``EdgeCheck`` in
``scope["state"]["ratewarden.edge"]``, so each dependency returns the decision without charging
again. Requests the layer cannot resolve (and dependencies it did not see) fall back to the
dependency checking the limit itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from starlette.routing import BaseRoute, Host, Match, Mount

from .decision import Decision
from .enforcement import LimitUnavailable, check_rules
from .fastapi import EDGE_STATE_KEY, RateLimit
from .headers import HeaderMode, HeaderStyle, rate_limit_headers
from .limiter import Limiter
from .responses import rejection, send_unavailable
from .rules import CompiledRule, policy_of
from .types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["EdgeCheck", "EdgeLayer", "Resolved", "declared_limits", "resolve"]

_CACHE_LIMIT = 4096
_RECHECK_SECONDS = 1.0

Resolved = tuple[BaseRoute, Any, dict[str, Any]]
"""The route FastAPI will run (``scope["route"]`` there), FastAPI's inclusion context for it (or
``None``), and the path parameters."""


class EdgeCheck:
    """What the edge decided for one request: ``decision`` (``None`` when nothing was decided, e.g.
    a fail-open store error) for the ``covered`` dependencies of ``route``."""

    __slots__ = ("covered", "decision", "route")

    def __init__(self, route: object, covered: frozenset[RateLimit], decision: Decision | None) -> None:
        self.route = route
        self.covered = covered
        self.decision = decision

    def covers(self, dependency: RateLimit, route: object) -> bool:
        return route is self.route and dependency in self.covered


# --- which route FastAPI will run -----------------------------------------------------------------


def resolve(routes: Sequence[BaseRoute], scope: Scope) -> Resolved | None:
    """The route that fully matches ``scope`` first, as FastAPI's router picks it; ``None`` for
    a 404, a 405 (partial match), a slash redirect or a route this module does not know how to
    enter (then the dependencies check their limits themselves)."""
    for route in routes:
        match, child = route.matches(scope)
        if match == Match.FULL:
            return _enter(route, child, scope)
    return None


def _enter(route: BaseRoute, child: Scope, scope: Scope) -> Resolved | None:
    match_in = getattr(route, "_match", None)
    if match_in is not None and hasattr(route, "original_router"):
        # FastAPI >= 0.1xx keeps included routers as one lazy route: ask it which candidate it picks.
        match, child, inner, context = match_in(scope)
        if match != Match.FULL or inner is None:
            return None
        if context is not None and getattr(context, "dependant", None) is not None and inner is context.original_route:
            return inner, context, child.get("path_params") or {}
        return _enter(inner, child, scope)
    if isinstance(route, Mount):
        sub_routes = getattr(route.app, "routes", None)
        if sub_routes is None:
            return None
        sub_scope = dict(scope)
        sub_scope.update(child)
        return resolve(sub_routes, sub_scope)
    return route, None, child.get("path_params") or {}


_lifted: dict[int, tuple[Any, tuple[RateLimit, ...]]] = {}
"""Dependants whose unused ``RateLimit`` dependencies ``lift_declared`` took out of FastAPI's
solving, by ``id``: (the dependant, kept alive so its id stays its own; the dependencies lifted)."""


def declared_limits(dependant: Any) -> list[RateLimit]:
    """The ``RateLimit`` dependencies in a dependency tree, in the order FastAPI runs them (each
    once, as FastAPI caches a dependency's result within a request), lifted ones included."""
    lifted = _lifted.get(id(dependant))
    found: list[RateLimit] = list(lifted[1]) if lifted is not None and lifted[0] is dependant else []

    def walk(node: Any) -> None:
        for sub in getattr(node, "dependencies", ()):
            walk(sub)
            call = getattr(sub, "call", None)
            if isinstance(call, RateLimit) and all(call is not f for f in found):
                found.append(call)

    walk(dependant)
    return found


def lift_declared(dependant: Any, covered: frozenset[RateLimit]) -> None:
    """Take the ``RateLimit`` dependencies in ``covered`` whose value nobody uses (those declared in
    a ``dependencies=[...]`` list) out of FastAPI's dependency solving for this route: the edge is
    their check. The list is replaced, not changed in place, so requests being solved keep theirs."""
    current = list(getattr(dependant, "dependencies", ()))
    lift = [d for d in current if d.name is None and isinstance(d.call, RateLimit) and d.call in covered]
    if not lift:
        return
    previous = _lifted.get(id(dependant))
    already = previous[1] if previous is not None and previous[0] is dependant else ()
    _lifted[id(dependant)] = (dependant, (*already, *(d.call for d in lift)))
    dependant.dependencies = [d for d in current if all(d is not x for x in lift)]


def _walk_routes(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    for route in routes:
        yield route
        original = getattr(route, "original_router", None)
        if original is not None:
            yield from _walk_routes(original.routes)
        elif isinstance(route, (Mount, Host)):
            yield from _walk_routes(getattr(route.app, "routes", None) or ())


def _routes_version(app: Any) -> object:
    router = app.router
    version = getattr(router, "_get_routes_version", None)
    return (len(router.routes), version() if version is not None else 0)


# --- the limits of one route ----------------------------------------------------------------------


class _Target:
    """Everything the edge needs for one (route, method): built once, reused by every request."""

    __slots__ = ("covered", "groups", "headers", "overrides", "policy", "route", "style")

    def __init__(self, route: object, context: object, limits: list[RateLimit], method: str, overrides: Any) -> None:
        self.route = route
        self.covered = frozenset(limits)
        groups: dict[int, tuple[Limiter, list[CompiledRule]]] = {}
        for dependency in limits:
            rules = dependency.rules_for_route(route, context, method)
            groups.setdefault(id(dependency.limiter), (dependency.limiter, []))[1].extend(rules)
        self.groups = tuple((limiter, tuple(rules)) for limiter, rules in groups.values())
        all_rules = tuple(rule for _, rules in self.groups for rule in rules)
        self.policy = policy_of(all_rules)
        # Several dependencies on one route answer with one set of headers: the first one's settings.
        self.headers: HeaderMode = limits[0].headers
        self.style: HeaderStyle = limits[0].header_style
        self.overrides = overrides  # the app whose dependency_overrides may replace these

    def overridden(self) -> bool:
        overrides: dict[Any, Any] | None = getattr(self.overrides, "dependency_overrides", None)
        return bool(overrides) and not self.covered.isdisjoint(overrides or ())


class _Routes:
    """The route table seen from the edge: resolution results cached per (method, root path, path)
    and rebuilt when the app's routes change (checked at most once a second for nested routers)."""

    def __init__(self, app: Any, lift: bool = False) -> None:
        self.app = app
        self.lift = lift
        self.version: object = None
        self.next_check = 0.0
        self.cacheable = True
        self.cache: dict[tuple[str, str, str], tuple[_Target | None, dict[str, Any]]] = {}
        self.targets: dict[tuple[int, str], _Target | None] = {}
        self.count = -1

    def refresh(self) -> None:
        routes = self.app.routes
        now = time.monotonic()
        if len(routes) == self.count and now < self.next_check:
            return
        self.count = len(routes)
        self.next_check = now + _RECHECK_SECONDS
        version = _routes_version(self.app)
        if version != self.version:
            self.version = version
            self.cache = {}
            self.targets = {}
            # Host routes match on the Host header, which the cache key leaves out.
            self.cacheable = not any(isinstance(r, Host) for r in _walk_routes(routes))

    def target(self, scope: Scope) -> _Target | None:
        self.refresh()
        cache_key = (scope["method"], scope.get("root_path", ""), scope["path"])
        found = self.cache.get(cache_key) if self.cacheable else None
        if found is None:
            resolved = resolve(self.app.routes, scope)
            target = None if resolved is None else self._target_of(resolved, scope["method"])
            found = (target, resolved[2] if resolved is not None and target is not None else {})
            if self.cacheable:
                if len(self.cache) >= _CACHE_LIMIT:
                    self.cache.clear()
                self.cache[cache_key] = found
        target, params = found
        if params and "path_params" not in scope:
            # Key and cost functions may read path parameters; the router sets the same values later.
            scope["path_params"] = dict(params)
        return target

    def _target_of(self, resolved: Resolved, method: str) -> _Target | None:
        route, context, _ = resolved
        owner = context if context is not None else route
        key = (id(owner), method)
        if key in self.targets:
            return self.targets[key]
        dependant = getattr(owner, "dependant", None)
        limits = declared_limits(dependant) if dependant is not None else []
        provider = getattr(owner, "dependency_overrides_provider", None)
        target = _Target(route, context, limits, method, provider) if limits else None
        if target is not None and self.lift:
            lift_declared(dependant, target.covered)
        self.targets[key] = target
        return target


# --- the ASGI layer ---------------------------------------------------------------------------------


class EdgeLayer:
    """Charges the ``RateLimit`` dependencies of the route a request will reach, before routing.

    Also keeps the headers a dependency that checks for itself collected in the scope (see
    ``ratewarden.fastapi``) on endpoints that return their own ``Response``.
    """

    def __init__(self, app: ASGIApp, fastapi_app: Any, lift: bool = False) -> None:
        self.app = app
        self.routes = _Routes(fastapi_app, lift)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        target = self.routes.target(scope)
        if target is None or target.overridden():
            await _with_collected_headers(self.app, scope, receive, send)
            return
        groups = target.groups
        decision: Decision | None = None
        try:
            if len(groups) == 1:
                limiter, rules = groups[0]
                if limiter.enabled:
                    decision = await check_rules(limiter, rules, scope)
            else:
                decision = await _check_groups(groups, scope)
        except LimitUnavailable:
            await send_unavailable(send)
            return
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[EDGE_STATE_KEY] = EdgeCheck(target.route, target.covered, decision)
        if decision is None:
            await self.app(scope, receive, send)
            return
        if not decision.allowed:
            body, headers = rejection(decision, target.style, target.headers != "off", target.policy)
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if target.headers != "always":
            await self.app(scope, receive, send)
            return
        extra = rate_limit_headers(decision, target.style, target.policy)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _check_groups(groups: Sequence[tuple[Limiter, tuple[CompiledRule, ...]]], scope: Scope) -> Decision | None:
    """Dependencies on different limiters: checked in order, as the dependencies would be; the
    first denial wins, else the decision with the least remaining."""
    decision: Decision | None = None
    for limiter, rules in groups:
        if not limiter.enabled:
            continue
        found = await check_rules(limiter, rules, scope)
        if found is None:
            continue
        if not found.allowed:
            return found
        if decision is None or found.remaining < decision.remaining:
            decision = found
    return decision


async def _with_collected_headers(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    from .fastapi import _SINK

    collected: list[tuple[bytes, bytes]] = []
    scope[_SINK] = collected

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and collected:
            message["headers"] = [*message.get("headers", ()), *collected]
        await send(message)

    await app(scope, receive, send_with_headers)
