"""The per-request context: what ratewarden decided about one request, for the application.

Every integration that leaves something on a request (``RateLimitMiddleware``,
``PolicyMiddleware``, per-rule shadow limits, the FastAPI edge layer) puts it on one
``RequestContext`` under one key, ``scope["state"]["ratewarden"]`` (``request.state.ratewarden``
in Starlette and FastAPI), and writes nothing else to the request state. Read it with
``context_of(request)``. Public attributes:

* ``decision``: the ``Decision`` of the middleware's enforced limits (``None`` when no limit
  applied or the check failed under ``on_error="open"``);
* ``shadow``: the decisions of per-rule shadow limits (``Rule(..., shadow=True)``), a tuple;
* ``edge``: the ``EdgeCheck`` of the FastAPI edge layer (``install(app)``), else ``None``;
* ``group``: the caller's group when a tiered rule of ``PolicyMiddleware`` applied, else ``""``;
* ``would_deny``: in ``PolicyMiddleware``'s global shadow mode, the decision that would have
  refused the request, else ``None``.

When several integrations check one request they share the context; the innermost middleware's
``decision`` is the one left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._mypyc import mypyc_attr
from .decision import Decision
from .scopes import value_of
from .types import Scope

__all__ = ["STATE_KEY", "EdgeCheck", "RequestContext", "context_for", "context_of"]

STATE_KEY: Final = "ratewarden"
"""The one key ratewarden writes in ``scope["state"]``."""


@mypyc_attr(allow_interpreted_subclasses=True)
class EdgeCheck:
    """What the edge decided for one request.

    Args:
        route: The route it resolved.
        covered: The ``RateLimit`` dependencies it checked.
        decision: What it decided; ``None`` when nothing was (e.g. a fail-open store error).
    """

    __slots__ = ("covered", "decision", "route")

    def __init__(self, route: object, covered: frozenset[object], decision: Decision | None) -> None:
        self.route = route
        self.covered = covered
        self.decision = decision

    def covers(self, dependency: object, route: object) -> bool:
        """Whether the edge already checked ``dependency`` on ``route``.

        Args:
            dependency: A ``RateLimit`` dependency.
            route: The route it runs on.
        """
        return route is self.route and dependency in self.covered


@mypyc_attr(allow_interpreted_subclasses=True)
class RequestContext:
    """What ratewarden knows and decided about one request (see the module's docstring)."""

    # Defaults in the class body, no __init__: one is created per limited request, the cheapest way.
    decision: Decision | None = None
    shadow: tuple[Decision, ...] = ()
    edge: EdgeCheck | None = None
    group: str = ""
    would_deny: Decision | None = None

    def __repr__(self) -> str:
        return (
            f"RequestContext(decision={self.decision!r}, shadow={self.shadow!r}, edge={self.edge!r}, "
            f"group={self.group!r}, would_deny={self.would_deny!r})"
        )


def context_of(request: Mapping[str, Any]) -> RequestContext | None:
    """The context ratewarden attached to this request, if any.

    Args:
        request: An ASGI scope, or a Starlette/FastAPI ``Request`` or ``WebSocket``.
    """
    state = request.get("state")
    if state:
        found = state.get(STATE_KEY)
        if isinstance(found, RequestContext):
            return found
    return None


def context_for(scope: Scope) -> RequestContext:
    """The request's context, attached first if it has none (an integration about to fill it in).

    Args:
        scope: The ASGI connection scope.
    """
    state = value_of(scope, "state")
    if state is None:
        context = RequestContext()
        scope["state"] = {STATE_KEY: context}
        return context
    found = value_of(state, STATE_KEY)
    if isinstance(found, RequestContext):
        return found
    context = RequestContext()
    state[STATE_KEY] = context
    return context
