"""Per-route limits: what each ``@limiter.limit`` declared on a handler, compiled once per route
into the rules the check layer charges."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..algorithms import AlgorithmName
from ..keys import KeyFunc, client_ip
from ..limits import DEFAULT_ALGORITHM
from ..rates import Rate
from ..rules import CostFunc, Rule, RuleSet

__all__ = ["Declared", "RateSpec", "RouteLimits"]

RateSpec = str | Rate | Iterable[str | Rate]
"""One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them."""


class Declared:
    """One ``@limit``: its rates and who it charges, checked when declared (a bad rate, method, key
    or cost fails at import, not on the first request).

    Args:
        rate: One rate or several.
        key: Who is charged: a key function of the scope; ``None``: the extension's default key.
        cost: What one request costs: a number, or a function of the scope.
        methods: The HTTP methods it applies to; ``None``: all.
        algorithm: The algorithm; ``None``: the extension's default.
        name: The counter's name; ``None``: the route's name (``-1``, ``-2``... for a second, third limit).
    """

    def __init__(
        self,
        rate: RateSpec,
        *,
        key: KeyFunc | None = None,
        cost: float | CostFunc = 1,
        methods: str | Iterable[str] | None = None,
        algorithm: AlgorithmName | None = None,
        name: str | None = None,
    ) -> None:
        probe = Rule("/**", rate, key=key or client_ip, cost=cost, methods=methods, algorithm=algorithm or DEFAULT_ALGORITHM)
        self.rate = probe.rate if probe.rate is not None else rate  # iterables read once
        self.key = key
        self.cost = cost
        self.methods = probe.methods
        self.algorithm = algorithm
        self.name = name

    def rule(self, name: str, key: KeyFunc, algorithm: AlgorithmName) -> Rule:
        """The limit as a rule of every path, named ``name`` unless it has a name of its own.

        Args:
            name: The counter's name where it applies.
            key: The extension's default key, for a limit without one.
            algorithm: The extension's default algorithm, for a limit without one.
        """
        return Rule(
            "/**", self.rate, key=self.key or key, cost=self.cost, methods=self.methods,
            algorithm=self.algorithm or algorithm, name=self.name or name,
        )


class RouteLimits:
    """The limits declared on handlers, and their rules per route, compiled on a route's first request.

    Args:
        key: The default key of a limit without one.
        algorithm: The default algorithm of a limit without one.
        prefix: The limiter's storage-key prefix.
    """

    def __init__(self, key: KeyFunc, algorithm: AlgorithmName, prefix: str) -> None:
        self.key = key
        self.algorithm = algorithm
        self.prefix = prefix
        self.declared: dict[Callable[..., Any], list[Declared]] = {}
        self._routes: dict[str, RuleSet | None] = {}

    def add(self, handler: Callable[..., Any], declared: Declared) -> None:
        """Declare a limit on ``handler``.

        Args:
            handler: The route handler.
            declared: The limit.
        """
        # Stacked decorators apply bottom-up: inserted first, they stay in source order.
        self.declared.setdefault(handler, []).insert(0, declared)
        self._routes.clear()

    def of(self, route: Any) -> RuleSet | None:
        """The rules of ``route`` (a Sanic ``Route``, or ``None`` when no route matched).

        Args:
            route: The request's route.
        """
        if route is None:
            return None
        name: str = route.name
        if name in self._routes:  # routes are the app's own: a bounded table
            return self._routes[name]
        declared = self._declared_on(route.handler)
        rules = [d.rule(name if i == 0 else f"{name}-{i}", self.key, self.algorithm) for i, d in enumerate(declared)]
        found = RuleSet(rules, self.prefix) if rules else None
        self._routes[name] = found
        return found

    def _declared_on(self, handler: Any) -> list[Declared]:
        """The limits declared on ``handler`` or a function it wraps (``functools.wraps``)."""
        seen: set[int] = set()
        while handler is not None and id(handler) not in seen:
            seen.add(id(handler))
            found = self.declared.get(handler)
            if found is not None:
                return found
            handler = getattr(handler, "__wrapped__", None)
        return []
