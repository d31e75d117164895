"""The ``RateLimit`` FastAPI dependency and the ``RateLimitExceeded`` it raises.

Import them from ``ratewarden.fastapi``. They live here, below ``ratewarden.fastapi.routes`` and
``ratewarden.fastapi.openapi`` (which look for ``RateLimit`` in a route's dependencies), so that
``ratewarden.fastapi`` (``install``) imports all three without an import cycle.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the dependency's signature, and
# FastAPI before 0.115 cannot resolve string annotations on a callable instance's ``__call__``
# (``response: Response`` became a required query parameter: every request a 422).
import json
from collections.abc import Iterable
from typing import Any

from fastapi import HTTPException, Request, Response

from ..algorithms import AlgorithmName
from ..context import context_of
from ..decision import Decision
from ..enforcement.answers import HeaderOptions, too_many_requests_problem
from ..enforcement.check import LimitUnavailable, check_rules
from ..enforcement.outcome import REFUSE, Outcome, failed, outcome_of
from ..errors import RateLimitExceeded as _RateLimitExceeded
from ..headers import HeaderMode, HeaderStyle
from ..keys import KeyFunc, client_ip
from ..limiter import Limiter
from ..limits import DEFAULT_ALGORITHM
from ..rates import Rate
from ..route_limits import Declared
from ..rules import CompiledRule, CostFunc, Rule
from .edge import SINK_KEY as _SINK

__all__ = ["RateLimit", "RateLimitExceeded", "route_context"]



def _text(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers as the ``HTTPException`` takes them."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}


def _failure(outcome: Outcome) -> HTTPException:
    """The ``HTTPException`` of a failed check's ``Outcome`` (400 or the fail-closed 503): its
    ``detail`` and its headers but the content type and length (the exception handler that renders
    it writes its own)."""
    return HTTPException(outcome.status, json.loads(outcome.body)["detail"], _text(outcome.added_headers()) or None)


class RateLimitExceeded(_RateLimitExceeded, HTTPException):
    """Raised by ``RateLimit`` when a request is over its limit: a ``ratewarden.errors.RateLimitExceeded``
    (first in its bases, so a handler for that one is found before a generic ``HTTPException``
    handler) and a Starlette ``HTTPException``.

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
        self.declared = Declared(rate, key=key, cost=cost, algorithm=algorithm, name=name)
        self.name = name
        self.headers = headers
        self.header_style = header_style
        self.answers = HeaderOptions(headers, header_style)
        self._compiled: dict[str, tuple[CompiledRule]] = {}
        self._by_route: dict[tuple[int, str], tuple[object, tuple[CompiledRule]]] = {}
        if name is not None:
            self._compiled[""] = (self.declared.compiled(name or "route", limiter.prefix),)

    @property
    def template(self) -> Rule:
        """The limit as a rule of every path, named ``name`` (``"route"`` when counted per route)."""
        return self.declared.rule("route")

    def _rules_for(self, scope: Any) -> tuple[CompiledRule]:
        if self.name is not None:
            return self._compiled[""]
        route = scope.get("route")
        return self.rules_for_route(route, route_context(scope, route), scope.get("method", "GET"))

    def rules_for_route(self, route: object, context: object, method: str) -> tuple[CompiledRule]:
        """The rules this dependency charges on ``route`` for ``method``: per route template and
        method (``GET /items/{id}``, which ``HEAD`` shares; the full path when the route comes from
        an included router, given by FastAPI's ``context``), or the one shared limit when ``name``
        was given.

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
        # HEAD is answered by the GET endpoint (Starlette routes add it): one limit for both.
        named = method.upper()
        scope_name = f"{'GET' if named == 'HEAD' else named} {template}"
        found = self._compiled.get(scope_name)
        if found is None:
            found = (self.declared.compiled(scope_name, self.limiter.prefix),)
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
        except LimitUnavailable as exc:
            raise _failure(failed(exc)) from None
        if decision is None:
            return None
        outcome = outcome_of(decision, self.answers)
        if outcome.verdict == REFUSE:
            raw = outcome.added_headers()
            sink = scope.get(_SINK)
            if sink is not None:  # under install(): the 429 keeps these, whichever handler answers
                sink[:] = raw
            raise RateLimitExceeded(decision, _text(raw))
        if outcome.headers:
            sink = scope.get(_SINK)
            target = sink if sink is not None else response.headers.raw
            target.extend(outcome.headers)
        return decision




def route_context(scope: Any, route: object) -> object:
    """FastAPI's per-inclusion context of ``route`` (which knows the full, prefixed path of a
    route from an included router), when this FastAPI version has one."""
    context = scope.get("fastapi", {}).get("effective_route_context") if "fastapi" in scope else None
    if context is not None and getattr(context, "original_route", None) is route:
        return context
    return None


for _public in (RateLimit, RateLimitExceeded):
    _public.__module__ = "ratewarden.fastapi"  # where users import them from (reprs, tracebacks, pickle)
