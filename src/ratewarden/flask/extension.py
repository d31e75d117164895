"""``RateLimiter``: the Flask extension. Limits are declared with decorators (``limit``,
``shared_limit``, ``exempt``, ``request_filter``); each request is charged once, all or nothing, to
every limit that applies (``enforcement.sync_check.check_blocking``): before Flask's dispatch by the
WSGI layer ``fast.FastCheck`` where it can decide alone, else by a ``before_request`` hook; the
rate-limit headers are added by that layer's ``start_response`` or by an ``after_request`` hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import Blueprint, Flask, current_app, request
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response as BaseResponse

from ..algorithms import AlgorithmName
from ..decision import Decision
from ..enforcement.check import LimitUnavailable
from ..enforcement.outcome import ALLOW
from ..errors import AmbiguousRequest, ConfigurationError, UsageError
from ..headers import HeaderMode, HeaderStyle
from ..keys import KeyFunc
from ..limiter import Limiter
from ..route_limits import RouteLimits
from ..rules import CostFunc
from ..wsgi.scope import scope_of
from .applicable import AppState
from .declared import Declared, ScopeTest, scope_key
from .fast import CHECKED_KEY, UNAVAILABLE, Checked, FastCheck, check_request
from .responses import (
    RateLimitExceeded,
    add_headers,
    denying_limit,
    outcome_for,
    unavailable_response,
    unhandled,
)
from .settings import RateSpec, ResetFormat, read_settings

__all__ = ["EXTENSION_KEY", "RateLimiter"]

EXTENSION_KEY = "ratewarden"
"""The extension's state in ``app.extensions``."""

_T = TypeVar("_T")
OnLimit = Callable[[Decision], "ResponseReturnValue | None"]
Methods = str | list[str] | tuple[str, ...] | frozenset[str] | None


class RateLimiter:
    """Rate limits for a Flask app, with flask-limiter's idioms on ratewarden's check layer.

    Every callable given to it (``key``, ``cost``, ``exempt_when``, ``request_filter``) takes the
    request's ASGI-shaped scope (``ratewarden.wsgi.scope_of``), so ratewarden's key functions
    (``client_ip``, ``header("X-API-Key")``, ``ClientIP(trusted_proxies=...)``) work as they are; it
    may read ``flask.request`` instead and ignore its argument. A key function of no argument
    (flask-limiter's ``key_func`` style) is called without one. Each argument left ``None`` is read
    from ``app.config`` (``RATEWARDEN_*``, see ``settings.CONFIG_KEYS``).

    Args:
        app: The app; ``None``: call ``init_app(app)`` later (once per app).
        limiter: Checks the limits on its store; ``None``: built from ``RATEWARDEN_STORAGE_URL``
            (default ``memory://``), ``RATEWARDEN_KEY_PREFIX`` and ``RATEWARDEN_ON_ERROR``.
        key: Who a limit without its own ``key`` charges: a key function of the scope, or of no
            argument (default: the client IP, behind ``RATEWARDEN_TRUSTED_PROXIES`` if set).
        default_limits: Rates for every view with no limit of its own, counted per view.
        application_limits: Rates for every request, one counter across the app.
        algorithm: The algorithm of limits that name none (default ``"fixed_window"``).
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` or ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
        header_reset: What ``X-RateLimit-Reset`` holds: ``"seconds"`` until more quota (the default)
            or that moment as a Unix time (``"epoch"``, flask-limiter's).
        on_limit: Called with the denying decision; a response it returns is sent instead of the
            429 (``None``: the 429 is raised as usual).
        enabled: ``False`` lets every request through.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        limiter: Limiter | None = None,
        key: KeyFunc | None = None,
        default_limits: RateSpec | None = None,
        application_limits: RateSpec | None = None,
        algorithm: AlgorithmName | None = None,
        headers: HeaderMode | bool | None = None,
        header_style: HeaderStyle | None = None,
        header_reset: ResetFormat | None = None,
        on_limit: OnLimit | None = None,
        enabled: bool | None = None,
    ) -> None:
        key = scope_key(key)
        if key is not None:
            Declared("1/s", key=key)  # a key it cannot call (its signature, async) fails here, not per request
        self._options: dict[str, Any] = {
            "limiter": limiter, "key": key, "default_limits": default_limits, "application_limits": application_limits,
            "algorithm": algorithm, "headers": headers, "header_style": header_style, "header_reset": header_reset,
            "enabled": enabled,
        }
        self.on_limit = on_limit
        self.registry: RouteLimits[Declared] = RouteLimits()
        self.filters: list[ScopeTest] = []
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Limit ``app``: read its config and install the request hooks.

        Args:
            app: The Flask app.
        """
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(f"RateLimiter: init_app was already called for the app {app.name!r}")
        state = AppState(read_settings(app.config, **self._options), self.registry)
        app.extensions[EXTENSION_KEY] = state
        app.before_request(self._check)
        app.after_request(self._add_headers)
        app.wsgi_app = FastCheck(app, app.wsgi_app, self, state)  # type: ignore[method-assign]

    # --- declarations ------------------------------------------------------------------------------

    def limit(
        self,
        rate: RateSpec,
        *,
        key: KeyFunc | None = None,
        cost: float | CostFunc = 1,
        methods: Methods = None,
        algorithm: AlgorithmName | None = None,
        override_defaults: bool = True,
        exempt_when: ScopeTest | None = None,
    ) -> Callable[[_T], _T]:
        """Limit a view function, or every view of a blueprint (``limiter.limit("10/s")(bp)``),
        each view with its own counter. Returns the function or blueprint unchanged.

        Args:
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list.
            key: Who is charged: a key function of the scope (or of no argument); ``None``: the extension's default.
            cost: What one request costs: a number, or a function of the scope.
            methods: The HTTP methods it applies to (``"POST"`` or several); ``None``: all.
            algorithm: The algorithm; ``None``: the extension's default.
            override_defaults: The view skips the default limits (``False``: both apply).
            exempt_when: A function of the scope; the limit is skipped when it returns ``True``.
        """
        declared = Declared(
            rate, key=key, cost=cost, methods=methods, algorithm=algorithm,
            override_defaults=override_defaults, exempt_when=exempt_when,
        )
        return self._declare(declared)

    def shared_limit(
        self,
        rate: RateSpec,
        scope: str,
        *,
        key: KeyFunc | None = None,
        cost: float | CostFunc = 1,
        methods: Methods = None,
        algorithm: AlgorithmName | None = None,
        override_defaults: bool = True,
        exempt_when: ScopeTest | None = None,
    ) -> Callable[[_T], _T]:
        """One counter named ``scope`` across every view (and blueprint) it decorates: keep the
        decorator (``api = limiter.shared_limit("100/min", scope="api")``) and apply it to each.

        Args:
            rate: One rate or several.
            scope: The counter's name (in storage keys and the ``RateLimit-Policy`` header).
            key: Who is charged: a key function of the scope (or of no argument); ``None``: the extension's default.
            cost: What one request costs: a number, or a function of the scope.
            methods: The HTTP methods it applies to; ``None``: all.
            algorithm: The algorithm; ``None``: the extension's default.
            override_defaults: The views skip the default limits (``False``: both apply).
            exempt_when: A function of the scope; the limit is skipped when it returns ``True``.
        """
        if not isinstance(scope, str) or not scope:
            raise ConfigurationError(f"shared_limit scope must be a non-empty name, got {scope!r}")
        declared = Declared(
            rate, key=key, cost=cost, methods=methods, algorithm=algorithm, shared=scope,
            override_defaults=override_defaults, exempt_when=exempt_when,
        )
        return self._declare(declared)

    def _declare(self, declared: Declared) -> Callable[[_T], _T]:
        def decorate(target: _T) -> _T:
            if not isinstance(target, Blueprint) and not callable(target):
                raise TypeError(f"RateLimiter limits decorate view functions and blueprints, got {target!r}")
            # A blueprint's limits are calls, in source order; a view's are stacked decorators.
            self.registry.add(target, declared, stacked=not isinstance(target, Blueprint))
            return target

        return decorate

    def exempt(self, target: _T) -> _T:
        """Exempt a view function or a blueprint from the default and application limits (limits
        declared on it still apply). Returns it unchanged.

        Args:
            target: The view function or the blueprint.
        """
        self.registry.exempt_target(target)
        return target

    def request_filter(self, test: ScopeTest) -> ScopeTest:
        """Register a function of the scope: a request it returns ``True`` for is not limited at all.

        Args:
            test: The function.
        """
        self.filters.append(test)
        return test

    # --- per request -------------------------------------------------------------------------------

    @property
    def limiter(self) -> Limiter:
        """The current app's ``Limiter``."""
        return _state().limiter

    @property
    def current_decision(self) -> Decision | None:
        """The current request's decision (``None``: no limit applied, or the check failed open)."""
        checked = request.environ.get(CHECKED_KEY)
        return checked.decision if isinstance(checked, Checked) else None

    def _check(self) -> ResponseReturnValue | None:
        decided = request.environ.get(CHECKED_KEY)
        if decided is not None:  # charged before Flask's dispatch (FastCheck): never twice
            if decided is UNAVAILABLE:
                return unavailable_response()
            if isinstance(decided, AmbiguousRequest):
                return unavailable_response(decided)
            if isinstance(decided, Checked) and not decided.decision.allowed:
                return self._refuse(_state(), decided)
            return None
        state = _state()
        if not state.settings.enabled or not state.limiter.enabled:
            return None
        scope = scope_of(request.environ)
        for test in self.filters:
            if test(scope):
                return None
        endpoint = request.endpoint
        app = current_app
        view = app.view_functions.get(endpoint) if endpoint is not None else None
        applicable = state.applicable(
            endpoint, view, lambda: [app.blueprints[name] for name in request.blueprints if name in app.blueprints],
            request.method,
        )
        rules = applicable.rules(scope)
        if not rules:
            return None
        checked = check_request(state, rules, scope)
        if isinstance(checked, LimitUnavailable):
            return unavailable_response(checked)
        if checked is None:
            return None
        request.environ[CHECKED_KEY] = checked
        if checked.decision.allowed:
            return None
        return self._refuse(state, checked)

    def _refuse(self, state: AppState, checked: Checked) -> ResponseReturnValue | None:
        decision = checked.decision
        if self.on_limit is not None:
            answer = self.on_limit(decision)
            if answer is not None:
                return answer
        settings = state.settings
        error = RateLimitExceeded(
            decision, settings.answers, checked.policy,
            denying_limit(decision, checked.rules), settings.header_reset,
        )
        checked.answer = error.response
        if unhandled(current_app, error, request.blueprints, in_request=True):
            # No handler of the app's would see it: answer the 429 as it is. Raising it makes Flask
            # build the response again (measured: a 429 cost 101.7 µs raised, 68.2 returned).
            return error.response
        raise error

    def _add_headers(self, response: BaseResponse) -> BaseResponse:
        checked = request.environ.get(CHECKED_KEY)
        if not isinstance(checked, Checked) or response is checked.answer or checked.at_wsgi:
            return response
        settings = _state().settings
        outcome = outcome_for(checked.decision, settings.answers, checked.policy, settings.header_reset)
        if outcome.verdict == ALLOW:
            add_headers(response, outcome.headers)
        else:  # the app's own 429 (on_limit, an errorhandler): the headers it left out
            add_headers(response, outcome.added_headers(), missing_only=True)
        return response


def _state() -> AppState:
    state = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, AppState):
        raise UsageError(f"RateLimiter.init_app was not called for the app {current_app.name!r}")
    return state
