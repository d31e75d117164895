"""Limits declared on route handlers (a decorator, a route option, a dependency), shared by the
framework doors: each declaration is checked when made (``Declared``), and where it was declared is
kept in one registry (``RouteLimits``: on handlers and their wrappers, on groups such as blueprints,
exemptions); a route's limits become ``Rule("/**", ...)`` counted under the route's name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

from .algorithms import AlgorithmName
from .keys import KeyFunc, client_ip
from .limits import DEFAULT_ALGORITHM
from .rates import RateSpec
from .rules import CompiledRule, CostFunc, Rule, RuleSet

__all__ = ["Declared", "RateSpec", "RouteLimits", "counted"]


class Declared:
    """One limit declared on a route handler: its rates and who it charges, checked when declared
    (a bad rate, method, key or cost fails at import or start-up, not on the first request).

    Args:
        rate: One rate or several.
        key: Who is charged: a key function of the scope; ``None``: the door's default key.
        cost: What one request costs: a number, or a function of the scope.
        methods: The HTTP methods it applies to; ``None``: all.
        algorithm: The algorithm; ``None``: the door's default.
        name: The counter's name, one counter wherever the limit applies (a shared limit); ``None``:
            the route's name (``-1``, ``-2``... for a second, third limit).
    """

    __slots__ = ("algorithm", "cost", "key", "methods", "name", "rate")

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

    def applies_to(self, method: str) -> bool:
        """Whether the limit applies to requests of ``method`` (``GET`` brings ``HEAD``).

        Args:
            method: The request's HTTP method.
        """
        return self.methods is None or method in self.methods

    def rule(
        self, name: str, key: KeyFunc = client_ip, algorithm: AlgorithmName = DEFAULT_ALGORITHM, label: str | None = None
    ) -> Rule:
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

    def compiled(
        self, name: str, prefix: str, key: KeyFunc = client_ip, algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        label: str | None = None,
    ) -> CompiledRule:
        """``rule(name, key, algorithm, label)`` as the check layer takes it, under the limiter's ``prefix``.

        Args:
            name: The counter's name where it applies.
            prefix: The limiter's storage-key prefix.
            key: The door's default key, for a limit without one.
            algorithm: The door's default algorithm, for a limit without one.
            label: What clients see when the limit has no name of its own; ``None``: ``name``.
        """
        return CompiledRule(self.rule(name, key, algorithm, label), prefix)


D = TypeVar("D", bound=Declared)


def counted(name: str, limits: Sequence[D]) -> list[tuple[D, str]]:
    """Each of the limits declared in one place with its counter's name: its own name, else
    ``name``, ``name-1``, ``name-2``... in declaration order.

    Args:
        name: The place's name (the route's).
        limits: The limits declared there.
    """
    return [(d, d.name or (name if i == 0 else f"{name}-{i}")) for i, d in enumerate(limits)]


class RouteLimits(Generic[D]):
    """Where limits were declared: on handlers (or the functions they wrap) and on groups of
    routes (a blueprint), which are exempt from a door's app-wide limits; and each route's rules,
    compiled on its first request. ``generation`` changes with every declaration, so a door's
    caches of what applies start again. It holds ``Declared`` limits, or a door's subclass of it (``D``).

    Args:
        key: The default key of a limit without one.
        algorithm: The default algorithm of a limit without one.
        prefix: The limiter's storage-key prefix.
    """

    def __init__(self, key: KeyFunc = client_ip, algorithm: AlgorithmName = DEFAULT_ALGORITHM, prefix: str = "rw") -> None:
        self.key = key
        self.algorithm = algorithm
        self.prefix = prefix
        self.declared: dict[object, list[D]] = {}
        self.exempt: set[object] = set()
        self.generation = 0
        self._routes: dict[str, RuleSet | None] = {}

    def add(self, target: object, declared: D, stacked: bool = True) -> None:
        """Declare a limit on ``target``.

        Args:
            target: The route handler (the function, or the framework's handler object), or a group.
            declared: The limit.
            stacked: Declared by a decorator: stacked ones apply bottom-up, so each goes before those
                declared already (they stay in source order); ``False``: after them (a call).
        """
        found = self.declared.setdefault(target, [])
        if stacked:
            found.insert(0, declared)
        else:
            found.append(declared)
        self._changed()

    def exempt_target(self, target: object) -> None:
        """Exempt a handler or a group from the door's app-wide limits (its own still apply).

        Args:
            target: The route handler or the group.
        """
        self.exempt.add(target)
        self._changed()

    def on(self, target: object) -> tuple[list[D], bool]:
        """The limits declared on ``target`` and on every function it wraps (``functools.wraps``),
        outermost first, and whether any of them is exempt.

        Args:
            target: The route handler or the group (``None``: none: no limit).
        """
        limits: list[D] = []
        exempt = False
        seen: set[int] = set()
        current: Any = target
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            try:
                limits.extend(self.declared.get(current, ()))
                exempt = exempt or current in self.exempt
            except TypeError:  # an unhashable callable object: nothing declared on it
                pass
            current = getattr(current, "__wrapped__", None)
        return limits, exempt

    def rules(self, name: str, handler: object, label: str | None = None) -> list[Rule]:
        """The rules of the limits declared on ``handler`` (or a function it wraps), counted under
        the route's ``name`` (``counted``).

        Args:
            name: The route's name.
            handler: The route's handler.
            label: What clients see of a limit without a name of its own; ``None``: its counter's name.
        """
        return [d.rule(n, self.key, self.algorithm, label) for d, n in counted(name, self.on(handler)[0])]

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

    def _changed(self) -> None:
        self.generation += 1
        self._routes.clear()
