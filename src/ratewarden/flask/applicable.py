"""Which limits apply to a request, per app: the default, application, blueprint, shared and view
limits of its endpoint and method, compiled once into the rules ``check_blocking`` charges."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..caches import remember
from ..route_limits import RouteLimits, counted
from ..rules import CompiledRule
from ..types import Scope
from .declared import Declared, ScopeTest
from .settings import Settings

__all__ = ["APPLICATION", "AppState", "Applicable"]

_CACHE_LIMIT = 4096  # (endpoint, method) pairs remembered, 4 MiB at most (``caches.remember``)

APPLICATION = "application"
"""The counter's name of the application limits (one counter across the app)."""


class Applicable:
    """The compiled rules of one (endpoint, method): those that always apply, and those with an
    ``exempt_when`` asked per request.

    Args:
        always: Rules charged on every such request.
        conditional: ``(rule, exempt_when)`` pairs: the rule is charged unless ``exempt_when(scope)``.
    """

    __slots__ = ("always", "conditional")

    def __init__(self, always: tuple[CompiledRule, ...], conditional: tuple[tuple[CompiledRule, ScopeTest], ...]) -> None:
        self.always = always
        self.conditional = conditional

    def rules(self, scope: Scope) -> tuple[CompiledRule, ...]:
        """The rules to charge this request to.

        Args:
            scope: The request's scope.
        """
        if not self.conditional:
            return self.always
        return (*self.always, *(rule for rule, exempt in self.conditional if not exempt(scope)))


class AppState:
    """The extension in one app: its settings and its cache of applicable limits.

    Args:
        settings: The app's settings.
        registry: The limits declared on the extension (on views and blueprints).
    """

    def __init__(self, settings: Settings, registry: RouteLimits[Declared]) -> None:
        self.settings = settings
        self.limiter = settings.limiter
        self.registry = registry
        self._compiled: dict[tuple[Declared, str], CompiledRule] = {}
        self._cache: dict[tuple[str | None, str], Applicable] = {}
        self._generation = registry.generation
        self._defaults = Declared(settings.default_limits) if settings.default_limits is not None else None
        self._application = (
            Declared(settings.application_limits, shared=APPLICATION) if settings.application_limits is not None else None
        )

    def applicable(
        self, endpoint: str | None, view: Callable[..., Any] | None, blueprints: Callable[[], Iterable[object]], method: str
    ) -> Applicable:
        """The limits of a request to ``endpoint`` with ``method``, cached per (endpoint, method).

        Args:
            endpoint: The matched endpoint (``None``: no route matched: application limits only).
            view: The endpoint's view function.
            blueprints: Gives the blueprint objects the endpoint belongs to, innermost first.
            method: The HTTP method.
        """
        if self._generation != self.registry.generation:
            self._cache = {}
            self._generation = self.registry.generation
        cache_key = (endpoint, method)
        found = self._cache.get(cache_key)
        if found is None:
            found = self._resolve(endpoint, view, blueprints() if endpoint is not None else (), method)
            remember(self._cache, cache_key, found, _CACHE_LIMIT)  # the method is the client's text
        return found

    def _resolve(
        self, endpoint: str | None, view: Callable[..., Any] | None, blueprints: Iterable[object], method: str
    ) -> Applicable:
        registry = self.registry
        chosen: list[tuple[Declared, str]] = []
        view_limits, exempt = registry.on(view)
        own = [(d, n) for d, n in counted(endpoint or "", view_limits) if d.applies_to(method)]
        for blueprint in blueprints:
            on_blueprint, blueprint_exempt = registry.on(blueprint)
            exempt = exempt or blueprint_exempt
            name = getattr(blueprint, "name", "")
            own += [(d, n) for d, n in counted(f"{endpoint}@{name}", on_blueprint) if d.applies_to(method)]
        if not exempt and self._application is not None:
            chosen.append((self._application, APPLICATION))
        skip_defaults = exempt or endpoint is None or any(d.override_defaults for d, _ in own)
        if self._defaults is not None and not skip_defaults:
            chosen.append((self._defaults, f"default:{endpoint}"))
        chosen += own
        always: list[CompiledRule] = []
        conditional: list[tuple[CompiledRule, ScopeTest]] = []
        for declared, name in chosen:
            if declared.exempt_when is None:
                always.append(self._compile(declared, name))
            else:
                conditional.append((self._compile(declared, name), declared.exempt_when))
        return Applicable(_unique(always), tuple(conditional))

    def _compile(self, declared: Declared, name: str) -> CompiledRule:
        # One compiled rule per (limit, counter): a shared limit's is its own name wherever it applies.
        found = self._compiled.get((declared, name))
        if found is None:
            settings = self.settings
            found = declared.compiled(name, self.limiter.prefix, settings.key, settings.algorithm)
            self._compiled[(declared, name)] = found
        return found


def _unique(rules: Sequence[CompiledRule]) -> tuple[CompiledRule, ...]:
    """``rules`` without repeats (one shared limit declared on a view and on its blueprint is
    charged once)."""
    return tuple(dict.fromkeys(rules))
