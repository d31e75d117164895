"""Limits declared on route handlers (a decorator, a route option), shared by the framework doors:
each declaration is checked when made (``Declared``), and a route's limits become one ``RuleSet``
of ``Rule("/**", ...)`` named after the route (``RouteLimits``), built on its first request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .algorithms import AlgorithmName
from .keys import KeyFunc, client_ip
from .limits import DEFAULT_ALGORITHM
from .rates import Rate
from .rules import CostFunc, Rule, RuleSet

__all__ = ["Declared", "RateSpec", "RouteLimits"]

RateSpec = str | Rate | Iterable[str | Rate]
"""One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them."""


class Declared:
    """One limit declared on a route handler: its rates and who it charges, checked when declared
    (a bad rate, method, key or cost fails at import or start-up, not on the first request).

    Args:
        rate: One rate or several.
        key: Who is charged: a key function of the scope; ``None``: the door's default key.
        cost: What one request costs: a number, or a function of the scope.
        methods: The HTTP methods it applies to; ``None``: all.
        algorithm: The algorithm; ``None``: the door's default.
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

    def rule(self, name: str, key: KeyFunc, algorithm: AlgorithmName, label: str | None = None) -> Rule:
        """The limit as a rule of every path, named ``name`` unless it has a name of its own.

        Args:
            name: The counter's name where it applies.
            key: The door's default key, for a limit without one.
            algorithm: The door's default algorithm, for a limit without one.
            label: What clients see when the limit has no name of its own (``""``: the rate as
                written); ``None``: ``name``.
        """
        return Rule(
            "/**", self.rate, key=self.key or key, cost=self.cost, methods=self.methods,
            algorithm=self.algorithm or algorithm, name=self.name or name, label=None if self.name else label,
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
        self.declared: dict[object, list[Declared]] = {}
        self._routes: dict[str, RuleSet | None] = {}

    def add(self, handler: object, declared: Declared) -> None:
        """Declare a limit on ``handler``.

        Args:
            handler: The route handler (the function, or the framework's handler object).
            declared: The limit.
        """
        # Stacked decorators apply bottom-up: inserted first, they stay in source order.
        self.declared.setdefault(handler, []).insert(0, declared)
        self._routes.clear()

    def rules(self, name: str, handler: object, label: str | None = None) -> list[Rule]:
        """The rules of the limits declared on ``handler`` (or a function it wraps), counted under
        the route's ``name`` (``name-1``, ``name-2``... for a second, third limit).

        Args:
            name: The route's name.
            handler: The route's handler.
            label: What clients see of a limit without a name of its own; ``None``: its counter's name.
        """
        declared = self._declared_on(handler)
        return [
            d.rule(name if i == 0 else f"{name}-{i}", self.key, self.algorithm, label) for i, d in enumerate(declared)
        ]

    def of(self, name: str, handler: object) -> RuleSet | None:
        """The rules of the route named ``name`` as one ``RuleSet`` (``None`` when it has none), built once.

        Args:
            name: The route's name (routes are the app's own: a bounded table).
            handler: The route's handler.
        """
        if name in self._routes:
            return self._routes[name]
        rules = self.rules(name, handler)
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
