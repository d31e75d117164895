"""Edge enforcement: limits declared with ``Depends(RateLimit(...))`` checked before FastAPI routes.

``ratewarden.fastapi.install(app)`` adds ``edge_layer(...)``. For each HTTP request it finds the route
FastAPI will run, using FastAPI's and Starlette's own ``route.matches`` in route order (prefixes,
included routers, mounts, path converters, methods), collects the ``RateLimit`` dependencies of that
route's dependency tree (route, router and app level) and charges them once, before routing and
dependency solving. A denied request gets the same problem+json 429 as ``RateLimitMiddleware`` and
never reaches the router. An allowed one carries an ``EdgeCheck`` in its context
(``ratewarden.context_of(request).edge``), so each dependency returns the decision without charging
again; the dependencies whose value is unused (``dependencies=[...]``) are taken out of FastAPI's
solving altogether (``lift_declared``), and put back while ``app.dependency_overrides`` replaces one
of the route's limits, so FastAPI runs the override and the edge stays out. Requests the layer
cannot resolve (and dependencies it did not see) fall back to the dependency checking the limit
itself. The per-request part is ``ratewarden.fastapi.edge`` (compiled);
this module resolves routes and builds their targets, once per route and path.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

from starlette.routing import BaseRoute, Host, Match, Mount

from ..limiter import Limiter
from ..rules import CompiledRule, policy_of
from ..types import ASGIApp, Scope
from .dependency import RateLimit
from .edge import EdgeCheck, EdgeLayer, EdgeTarget, Lifted

__all__ = ["EdgeCheck", "Resolved", "declared_limits", "edge_layer", "lift_declared", "limit_owners", "resolve"]

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


class _Dependencies(list[Any]):
    """A dependency list ``lift_declared`` put in a dependant (its ``lean`` or its ``full`` one),
    carrying the dependant's ``Lifted``: what was lifted lives on the dependant itself and goes with
    it (FastAPI's dependants can be neither weakly referenced nor hashed, so no registry can know
    when one is gone; a registry by ``id`` kept every lifted app alive and reused ids)."""

    __slots__ = ("lifted",)

    def __init__(self, items: Iterable[Any], lifted: Lifted) -> None:
        super().__init__(items)
        self.lifted = lifted


def _lifted_of(dependant: Any) -> Lifted | None:
    """The dependant's ``Lifted``, from the dependency list ``lift_declared`` put in it (``None`` when
    it has none, or a list set since replaced ours)."""
    current = getattr(dependant, "dependencies", None)
    found = current.lifted if isinstance(current, _Dependencies) else None
    return found if found is not None and found.dependant is dependant else None


def declared_limits(dependant: Any) -> list[RateLimit]:
    """The ``RateLimit`` dependencies in a dependency tree, in the order FastAPI runs them (each
    once, as FastAPI caches a dependency's result within a request), lifted ones included (in
    their place: the first one's settings shape the answer).

    Args:
        dependant: FastAPI's dependency tree of a route.
    """
    found: list[RateLimit] = []

    def walk(subs: Any) -> None:
        for sub in subs:
            walk(getattr(sub, "dependencies", ()))
            call = getattr(sub, "call", None)
            if isinstance(call, RateLimit) and all(call is not f for f in found):
                found.append(call)

    lifted = _lifted_of(dependant)
    walk(lifted.full if lifted is not None else getattr(dependant, "dependencies", ()))
    return found


def limit_owners(dependant: Any) -> frozenset[object]:
    """The dependencies of a tree that have a ``RateLimit`` somewhere under them: overriding one
    takes that limit out of what FastAPI runs.

    Args:
        dependant: FastAPI's dependency tree of a route.
    """
    owners: set[object] = set()

    def walk(node: Any) -> bool:
        found = False
        for sub in getattr(node, "dependencies", ()):
            call = getattr(sub, "call", None)
            if walk(sub) and isinstance(call, Hashable):  # overrides are a dict: keys are hashable
                owners.add(call)
                found = True
            found = found or isinstance(call, RateLimit)
        return found

    walk(dependant)
    return frozenset(owners)


def lift_declared(dependant: Any, covered: frozenset[RateLimit]) -> Lifted | None:
    """Take the ``RateLimit`` dependencies in ``covered`` whose value nobody uses (those declared in
    a ``dependencies=[...]`` list) out of FastAPI's dependency solving for this route: the edge is
    their check. Returns how to put them back (``Lifted``), or ``None`` when there was none to lift.
    The list is replaced, not changed in place, so requests being solved keep theirs.

    Args:
        dependant: FastAPI's dependency tree of the route.
        covered: The dependencies the edge checks.
    """
    previous = _lifted_of(dependant)
    full = previous.full if previous is not None else list(getattr(dependant, "dependencies", ()))
    already = previous.calls if previous is not None else ()
    lift = [
        d
        for d in full
        if d.name is None and isinstance(d.call, RateLimit) and (d.call in covered or any(d.call is c for c in already))
    ]
    if not lift:
        return None
    lean = [d for d in full if all(d is not x for x in lift)]
    found = previous
    if found is None:
        found = Lifted(dependant, [], [], ())
        found.full = _Dependencies(full, found)
    elif len(lift) == len(already):
        return found
    found.lean, found.calls = _Dependencies(lean, found), tuple(d.call for d in lift)
    if not found.restored:  # else an override has the full list in place until it is gone
        dependant.dependencies = found.lean
    return found


def _walk_routes(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    for route in routes:
        yield route
        original = getattr(route, "original_router", None)
        if original is not None:
            yield from _walk_routes(original.routes)
        elif isinstance(route, (Mount, Host)):
            yield from _walk_routes(getattr(route.app, "routes", None) or ())


def _routes_version(app: Any, seen: frozenset[int] = frozenset()) -> object:
    """Changes when the routes FastAPI picks from change: the app's own list, the routers included
    into it and (recursively) the apps mounted in it."""
    router = getattr(app, "router", app)
    routes = getattr(router, "routes", None)
    if routes is None or id(router) in seen:
        return None
    version = getattr(router, "_get_routes_version", None)
    inner = seen | {id(router)}
    mounted = tuple(_routes_version(r.app, inner) for r in routes if isinstance(r, (Mount, Host)))
    return (len(routes), version() if version is not None else 0, mounted)


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
    return EdgeTarget(route, frozenset(limits), grouped, first.answers, policy, overrides)


class _Resolver:
    """The route table seen from the edge (the slow path of ``EdgeLayer``): which target a request
    has, with targets built once per (route, method)."""

    def __init__(self, app: Any, lift: bool = True) -> None:
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
        if target is not None:
            target.overridable = target.covered | limit_owners(dependant)
        # Lift only on the route table the layer's path cache was built on: a path cached before a
        # route was added (a 404 then) may lead to that route now, and nothing would check a
        # lifted limit there until the cache is dropped (then the target is rebuilt and lifted).
        if (
            target is not None
            and self.lift
            and (_lifted_of(dependant) is not None or _routes_version(self.app) == self.version)
        ):
            target.lifted = lift_declared(dependant, frozenset(limits))
        self.targets[key] = target
        return target


def edge_layer(app: ASGIApp, fastapi_app: Any, lift: bool = True) -> EdgeLayer:
    """The edge layer for ``fastapi_app`` wrapping ``app`` (what ``install`` adds as middleware).

    Args:
        app: The ASGI app to wrap.
        fastapi_app: The FastAPI app whose routes are resolved.
        lift: Take unused ``RateLimit`` dependencies out of FastAPI's solving (``install(lift=...)``).
    """
    return EdgeLayer(app, _Resolver(fastapi_app, lift))
