"""What a Flask app declares: each ``@limit``/``shared_limit`` (a ``Declared``: the core's
``route_limits.Declared`` with flask-limiter's options), its key functions (``scope_key``) and
request filters (``ScopeTest``). Where they were declared is kept in the core's ``RouteLimits``."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from ..algorithms import AlgorithmName
from ..callables import accepts
from ..enforcement.sync_check import require_sync_keys
from ..keys import KeyFunc
from ..route_limits import Declared as RouteLimit
from ..rules import CompiledRule, CostFunc, http_methods
from ..types import Scope
from .settings import RateSpec

__all__ = ["Declared", "ScopeTest", "scope_key"]

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


class Declared(RouteLimit):
    """One declared limit: the core's ``route_limits.Declared`` with flask-limiter's options, not
    yet bound to a view's name.

    Everything is checked here, when it is declared (a bad rate, method or cost, an async key),
    so a mistake fails at import, not on the first request.

    Args:
        rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list.
        key: Who is charged: a key function of the scope (or of no argument); ``None``: the
            extension's default key.
        cost: What one request costs: a number, or a function of the scope.
        methods: The HTTP methods it applies to; ``None``: all.
        algorithm: The algorithm; ``None``: the extension's default.
        shared: The counter's name for a shared limit (one counter wherever it is declared);
            ``None``: one counter per view.
        override_defaults: Whether a view this limit applies to skips the default limits.
        exempt_when: Skips this limit for the requests it answers ``True`` for.
    """

    __slots__ = ("exempt_when", "override_defaults")

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
        methods = http_methods(methods, "limit")
        super().__init__(rate, key=scope_key(key), cost=cost, methods=methods, algorithm=algorithm)
        require_sync_keys([self.compiled("/**", "rw")], INTEGRATION)  # named before ``shared`` is set
        self.name = shared
        self.override_defaults = override_defaults
        self.exempt_when = exempt_when

    @property
    def shared(self) -> str | None:
        """The counter's name of a shared limit (``name``); ``None``: one counter per view."""
        return self.name

    def compile(self, name: str, key: KeyFunc, algorithm: AlgorithmName, prefix: str) -> CompiledRule:
        """The limit as the check layer takes it, counted under ``name`` (a shared limit's own name
        wins): ``compiled``, with the extension's defaults before the prefix.

        Args:
            name: The counter's name where it applies (e.g. the view's endpoint).
            key: The app's default key, for a limit without one.
            algorithm: The app's default algorithm, for a limit without one.
            prefix: The limiter's storage-key prefix.
        """
        return self.compiled(name, prefix, key, algorithm)
