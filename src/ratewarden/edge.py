"""Edge enforcement: limits declared with ``Depends(RateLimit(...))`` checked before FastAPI routes.

``ratewarden.fastapi.install(app)`` adds ``edge_layer(...)``. For each HTTP request it finds the route
FastAPI will run, using FastAPI's and Starlette's own ``route.matches`` in route order (prefixes,
included routers, mounts, path converters, methods), collects the ``RateLimit`` dependencies of that
route's dependency tree (route, router and app level) and charges them once, before routing and
dependency solving. A denied request gets the same problem+json 429 as ``RateLimitMiddleware`` and
never reaches the router. An allowed one carries an ``EdgeCheck`` in its context
(``ratewarden.context_of(request).edge``), so each dependency returns the decision without charging
again. Requests the layer cannot resolve (and dependencies it did not see) fall back to the
dependency checking the limit itself. The per-request part is ``ratewarden.asgi.edge`` (compiled);
this module resolves routes and builds their targets, once per route and path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from starlette.routing import BaseRoute, Host, Match, Mount

from .asgi.edge import EdgeCheck, EdgeLayer, EdgeTarget
from .fastapi import RateLimit
from .limiter import Limiter
from .rules import CompiledRule, policy_of
from .types import ASGIApp, Scope

__all__ = ["EdgeCheck", "Resolved", "declared_limits", "edge_layer", "lift_declared", "resolve"]

Resolved = tuple[BaseRoute, Any, dict[str, Any]]
"""The route FastAPI will run (``scope["route"]`` there), FastAPI's inclusion context for it (or
``None``), and the path parameters."""


# --- which route FastAPI will run -----------------------------------------------------------------


def resolve(routes: Sequence[BaseRoute], scope: Scope) -> Resolved | None:
    """The route that fully matches ``scope`` first, as FastAPI's router picks it; ``None`` for
    a 404, a 405 (partial match), a slash redirect or a route this module does not know how to
    enter (then the dependencies check their limits themselves).

    Args:
        routes: The app's routes, in order.
        scope: The ASGI connection scope.
    """
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
    once, as FastAPI caches a dependency's result within a request), lifted ones included.

    Args:
        dependant: FastAPI's dependency tree of a route.
    """
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
    their check. The list is replaced, not changed in place, so requests being solved keep theirs.

    Args:
        dependant: FastAPI's dependency tree of the route.
        covered: The dependencies the edge checks.
    """
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


def make_target(route: object, context: object, limits: list[RateLimit], method: str, overrides: object) -> EdgeTarget:
    """The ``EdgeTarget`` of ``limits`` on ``route`` for ``method``: their rules grouped by limiter."""
    groups: dict[int, tuple[Limiter, list[CompiledRule]]] = {}
    for dependency in limits:
        rules = dependency.rules_for_route(route, context, method)
        groups.setdefault(id(dependency.limiter), (dependency.limiter, []))[1].extend(rules)
    grouped = tuple((limiter, tuple(rules)) for limiter, rules in groups.values())
    policy = policy_of(tuple(rule for _, rules in grouped for rule in rules))
    # Several dependencies on one route answer with one set of headers: the first one's settings.
    first = limits[0]
    return EdgeTarget(route, frozenset(limits), grouped, first.headers, first.header_style, policy, overrides)


class _Resolver:
    """The route table seen from the edge (the slow path of ``EdgeLayer``): which target a request
    has, with targets built once per (route, method)."""

    def __init__(self, app: Any, lift: bool = False) -> None:
        self.app = app
        self.lift = lift
        self.version: object = None
        self.cacheable = True
        self.targets: dict[tuple[int, str], EdgeTarget | None] = {}

    def routes(self) -> Sequence[BaseRoute]:
        return self.app.routes  # type: ignore[no-any-return]

    def changed(self) -> bool:
        version = _routes_version(self.app)
        if version == self.version:
            return False
        self.version = version
        self.targets = {}
        # Host routes match on the Host header, which the layer's cache key leaves out.
        self.cacheable = not any(isinstance(r, Host) for r in _walk_routes(self.app.routes))
        return True

    def lookup(self, scope: Scope) -> tuple[EdgeTarget | None, dict[str, Any]]:
        resolved = resolve(self.app.routes, scope)
        if resolved is None:
            return None, {}
        target = self._target_of(resolved, scope["method"])
        return target, resolved[2] if target is not None else {}

    def _target_of(self, resolved: Resolved, method: str) -> EdgeTarget | None:
        route, context, _ = resolved
        owner = context if context is not None else route
        key = (id(owner), method)
        if key in self.targets:
            return self.targets[key]
        dependant = getattr(owner, "dependant", None)
        limits = declared_limits(dependant) if dependant is not None else []
        provider = getattr(owner, "dependency_overrides_provider", None)
        target = make_target(route, context, limits, method, provider) if limits else None
        if target is not None and self.lift:
            lift_declared(dependant, frozenset(limits))
        self.targets[key] = target
        return target


def edge_layer(app: ASGIApp, fastapi_app: Any, lift: bool = False) -> EdgeLayer:
    """The edge layer for ``fastapi_app`` wrapping ``app`` (what ``install`` adds as middleware).

    Args:
        app: The ASGI app to wrap.
        fastapi_app: The FastAPI app whose routes are resolved.
        lift: Also lift unused ``RateLimit`` dependencies out of FastAPI's solving
            (``install(edge_only=True)``).
    """
    return EdgeLayer(app, _Resolver(fastapi_app, lift))
