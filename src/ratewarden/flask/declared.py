"""What the application declared: each ``@limit``/``shared_limit`` (a ``Declared``), and where
it was declared: on views, on blueprints, as exemptions and request filters (a ``Registry``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from ..algorithms import AlgorithmName
from ..callables import accepts
from ..enforcement.sync_check import require_sync_keys
from ..keys import KeyFunc, client_ip
from ..limits import DEFAULT_ALGORITHM
from ..rules import CompiledRule, CostFunc, Rule, http_methods
from ..types import Scope
from .settings import RateSpec

__all__ = ["Declared", "Registry", "ScopeTest", "scope_key"]

ScopeTest = Callable[[Scope], bool]
"""A predicate of the request's scope (``exempt_when``, ``request_filter``)."""

INTEGRATION = "ratewarden.flask.RateLimiter"


def scope_key(key: KeyFunc | None) -> KeyFunc | None:
    """``key`` as a key function of the scope: flask-limiter's key functions take no argument
    (``get_remote_address``, or one reading ``flask.request``), so one that can only be called
    without arguments is called that way. Any other signature is left to ``Rule``'s check.

    Args:
        key: The key function given; ``None``: the extension's default.
    """
    if key is None or accepts(key, 1) is not False or accepts(key, 0) is not True:
        return key
    func = cast("Callable[[], str | None]", key)

    def without_scope(scope: Scope) -> str | None:
        return func()

    # Its own module, not ratewarden's: FastCheck must not call it before Flask's request context exists.
    without_scope.__module__ = getattr(func, "__module__", None) or "__main__"
    without_scope.__qualname__ = without_scope.__name__ = getattr(func, "__qualname__", None) or repr(func)
    return without_scope


class Declared:
    """One declared limit: its rates and who it charges, not yet bound to a view's name.

    Everything is checked here, when it is declared (a bad rate, method or cost, an async key),
    so a mistake fails at import, not on the first request.

    Args:
        rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list.
        key: Who is charged: a key function of the scope; ``None``: the extension's default key.
        cost: What one request costs: a number, or a function of the scope.
        methods: The HTTP methods it applies to; ``None``: all.
        algorithm: The algorithm; ``None``: the extension's default.
        shared: The counter's name for a shared limit (one counter wherever it is declared);
            ``None``: one counter per view.
        override_defaults: Whether a view this limit applies to skips the default limits.
        exempt_when: Skips this limit for the requests it answers ``True`` for.
    """

    __slots__ = ("algorithm", "cost", "exempt_when", "key", "methods", "override_defaults", "rate", "shared")

    def __init__(
        self,
        rate: RateSpec,
        *,
        key: KeyFunc | None = None,
        cost: float | CostFunc = 1,
        methods: str | list[str] | tuple[str, ...] | frozenset[str] | None = None,
        algorithm: AlgorithmName | None = None,
        shared: str | None = None,
        override_defaults: bool = True,
        exempt_when: ScopeTest | None = None,
    ) -> None:
        self.methods = http_methods(methods, "limit")
        key = scope_key(key)
        probe = Rule("/**", rate, key=key or client_ip, cost=cost, algorithm=algorithm or DEFAULT_ALGORITHM)
        require_sync_keys([CompiledRule(probe, "rw")], INTEGRATION)
        self.rate = probe.rate if probe.rate is not None else rate  # iterables read once
        self.key = key
        self.cost = cost
        self.algorithm = algorithm
        self.shared = shared
        self.override_defaults = override_defaults
        self.exempt_when = exempt_when

    def applies_to(self, method: str) -> bool:
        """Whether the limit applies to requests of ``method``.

        Args:
            method: The request's HTTP method.
        """
        return self.methods is None or method in self.methods

    def compile(self, name: str, key: KeyFunc, algorithm: AlgorithmName, prefix: str) -> CompiledRule:
        """The limit as the check layer takes it, counted under ``name`` (a shared limit's own
        name wins).

        Args:
            name: The counter's name where it applies (e.g. the view's endpoint).
            key: The app's default key, for a limit without one.
            algorithm: The app's default algorithm, for a limit without one.
            prefix: The limiter's storage-key prefix.
        """
        rule = Rule(
            "/**", self.rate, key=self.key or key, cost=self.cost, algorithm=self.algorithm or algorithm,
            name=self.shared or name,
        )
        return CompiledRule(rule, prefix)


class Registry:
    """Where limits were declared, shared by every app the extension serves. ``generation``
    changes with every declaration, so the apps' caches of applicable limits start again."""

    def __init__(self) -> None:
        self.views: dict[Callable[..., Any], list[Declared]] = {}
        self.blueprints: dict[object, list[Declared]] = {}
        self.exempt: set[object] = set()
        self.filters: list[ScopeTest] = []
        self.generation = 0

    def add(self, target: object, declared: Declared, blueprint: bool) -> None:
        """Declare a limit on a view function or a blueprint.

        Args:
            target: The view function or the blueprint.
            declared: The limit.
            blueprint: Whether ``target`` is a blueprint.
        """
        if blueprint:
            self.blueprints.setdefault(target, []).append(declared)
        else:  # stacked decorators apply bottom-up: inserted first, they stay in source order
            self.views.setdefault(cast("Callable[..., Any]", target), []).insert(0, declared)
        self.generation += 1

    def exempt_target(self, target: object) -> None:
        """Exempt a view function or a blueprint from the default and application limits.

        Args:
            target: The view function or the blueprint.
        """
        self.exempt.add(target)
        self.generation += 1

    def view_limits(self, view: Callable[..., Any] | None) -> tuple[list[Declared], bool]:
        """The limits declared on ``view`` (or a function it wraps) and whether it is exempt.

        Args:
            view: The view function (``None``: no view matched).
        """
        limits: list[Declared] = []
        exempt = False
        seen: set[int] = set()
        current: Any = view
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            try:
                limits.extend(self.views.get(current, ()))
                exempt = exempt or current in self.exempt
            except TypeError:  # an unhashable callable object: nothing declared on it
                pass
            current = getattr(current, "__wrapped__", None)
        return limits, exempt
