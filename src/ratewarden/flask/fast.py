"""The check before Flask's request machinery: ``init_app`` wraps ``app.wsgi_app`` in a
``FastCheck``, which matches the endpoint with Flask's own router, charges the request once
(``check_blocking``) and leaves the decision in the environ, where the ``before_request`` hook finds
it instead of checking again. An allowed request gets its rate-limit headers through a wrapped
``start_response``; a 429 (or fail-closed 503) nobody in the app could see or change is answered
here, as raw WSGI, with the bytes the hook's answer would have had.

Anything it cannot decide alone is left to the hook, unchanged: a route that does not match (404,
405, redirects), a ``key``/``cost``/``exempt_when``/``request_filter`` that is not one of
ratewarden's own scope functions (it may read ``flask.request``), hooks or signals of the app that
run before the extension's check. A denial is answered by Flask when an ``on_limit``, an
error handler for the 429, another ``after_request``/``teardown_request`` function, a signal
receiver, a custom ``response_class`` or a session cookie could see it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from flask import Flask, Response
from flask import signals as flask_signals
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect

from ..caches import remember
from ..context import context_for
from ..decision import Decision
from ..enforcement.outcome import failed, outcome_of
from ..enforcement.sync_check import check_blocking
from ..errors import AmbiguousRequest, LimitUnavailable
from ..route_limits import RouteLimits
from ..rules import CompiledRule, policy_of
from ..types import Scope
from ..wsgi.middleware import Environ, StartResponse, WSGIApp, _StartWithHeaders, start_outcome
from ..wsgi.scope import scope_of
from .applicable import Applicable, AppState
from .declared import Declared, ScopeTest
from .responses import RateLimitExceeded, outcome_for, unhandled


class RateLimiter(Protocol):
    """What ``FastCheck`` reads of the extension it serves (``extension.RateLimiter``), named here
    so that this module does not import the extension back."""

    registry: RouteLimits[Declared]
    filters: list[ScopeTest]
    on_limit: Callable[[Decision], Any] | None

    def _check(self) -> Any: ...

    def _add_headers(self, response: Any) -> Any: ...

__all__ = ["CHECKED_KEY", "NOTHING", "UNAVAILABLE", "Checked", "FastCheck"]

CHECKED_KEY = "ratewarden.flask"
"""The environ key of what was decided about the request (a ``Checked`` or a marker)."""

NOTHING = "ratewarden.flask:nothing"
"""Marker: checked, no limit applied (or the check failed open)."""
UNAVAILABLE = "ratewarden.flask:unavailable"
"""Marker: the check failed closed; the hook answers the 503 (an ``AmbiguousRequest`` is left as
itself: the hook answers its 400)."""

# Flask's status lines (werkzeug upper-cases the reason), so a raw answer is the hook's, byte for byte.
_STATUS_LINES = {429: "429 TOO MANY REQUESTS", 503: "503 SERVICE UNAVAILABLE", 400: "400 BAD REQUEST"}
_ROUTES = 4096  # routes remembered, 4 MiB at most (``caches.remember``: paths with variable parts are unbounded)
_PROBE = RateLimitExceeded.__new__(RateLimitExceeded)  # only its type is read by _find_error_handler
_SIGNALS = (
    flask_signals.request_started, flask_signals.request_finished, flask_signals.request_tearing_down,
    flask_signals.got_request_exception, flask_signals.appcontext_pushed, flask_signals.appcontext_popped,
    flask_signals.appcontext_tearing_down,
)


class Checked:
    """What was decided about the current request (kept in its environ)."""

    __slots__ = ("answer", "at_wsgi", "decision", "policy", "rules")

    def __init__(self, decision: Decision, policy: bytes, rules: tuple[CompiledRule, ...] = ()) -> None:
        self.decision = decision
        self.policy = policy
        self.rules = rules  # those charged: the limit that denied is found there
        self.answer: object = None  # the extension's own 429, sent as it is
        self.at_wsgi = False  # the rate-limit headers are added by FastCheck's start_response


def check_request(state: AppState, rules: tuple[CompiledRule, ...], scope: Scope) -> Checked | LimitUnavailable | None:
    """The one Flask check of a request (``FastCheck`` before Flask, the ``before_request`` hook
    inside it): ``check_blocking``'s decision as ``Checked`` (``None``: nothing decided), or the
    ``LimitUnavailable`` it raised, for the caller to answer in its own way.

    Args:
        state: The app's limiter and settings.
        rules: The rules that apply to the request.
        scope: The request's scope.
    """
    try:
        decision = check_blocking(state.limiter, rules, scope)
    except LimitUnavailable as exc:
        return exc
    if decision is None:
        return None
    context_for(scope).decision = decision
    return Checked(decision, policy_of(rules), rules)


def scope_only(function: object) -> bool:
    """Whether ``function`` (a key, cost or scope test) is known to read only the scope: a number,
    or one of ratewarden's own functions (``client_ip``, ``header(...)``...)."""
    if not callable(function):
        return True
    module = getattr(function, "__module__", None) or type(function).__module__
    return isinstance(module, str) and (module == "ratewarden" or module.startswith("ratewarden."))


def _rules_scope_only(applicable: Applicable) -> bool:
    rules: list[CompiledRule] = [*applicable.always, *(rule for rule, _ in applicable.conditional)]
    return all(scope_only(rule.key) and scope_only(rule.rule.cost) for rule in rules) and all(
        scope_only(test) for _, test in applicable.conditional
    )


def _blueprint_names(endpoint: str) -> list[str]:
    """The blueprints of ``endpoint``, innermost first (Flask's ``request.blueprints``)."""
    names: list[str] = []
    name = endpoint
    while "." in name:
        name = name.rpartition(".")[0]
        names.append(name)
    return names


class _EndpointRules:
    """What ``FastCheck`` does for one (endpoint, method)."""

    __slots__ = ("answers", "applicable")

    def __init__(self, applicable: Applicable, answers: bool) -> None:
        self.applicable = applicable
        self.answers = answers  # a denial can be answered here


class FastCheck:
    """The WSGI layer ``init_app`` puts around ``app.wsgi_app`` (see the module's docstring).

    Args:
        app: The Flask app.
        inner: The app's previous ``wsgi_app``.
        extension: The extension.
        state: The extension's state in the app.
    """

    __slots__ = ("_by_endpoint", "_filters", "_filters_ok", "_generation", "_routes", "app", "extension", "inner", "state")

    def __init__(self, app: Flask, inner: WSGIApp, extension: RateLimiter, state: AppState) -> None:
        self.app = app
        self.inner = inner
        self.extension = extension
        self.state = state
        self._by_endpoint: dict[tuple[str, str], _EndpointRules | None] = {}
        self._routes: dict[tuple[object, ...], _EndpointRules | None] = {}  # the environ's routing inputs -> its rules
        self._generation = -1
        self._filters = -1
        self._filters_ok = False

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        state = self.state
        settings = state.settings
        if not settings.enabled or not state.limiter.enabled or CHECKED_KEY in environ:
            return self.inner(environ, start_response)
        filters = self.extension.filters
        if len(filters) != self._filters:
            self._filters_ok = all(scope_only(test) for test in filters)
            self._filters = len(filters)
        if not self._filters_ok:
            return self.inner(environ, start_response)
        found = self._rules_for(environ)
        if found is None:
            return self.inner(environ, start_response)
        scope = scope_of(environ)
        for test in filters:
            if test(scope):
                environ[CHECKED_KEY] = NOTHING
                return self.inner(environ, start_response)
        rules = found.applicable.rules(scope)
        if not rules:
            environ[CHECKED_KEY] = NOTHING
            return self.inner(environ, start_response)
        checked = check_request(state, rules, scope)
        if isinstance(checked, LimitUnavailable):
            ambiguous = isinstance(checked, AmbiguousRequest)
            if found.answers and self._answerable(environ):
                return start_outcome(start_response, failed(checked), _STATUS_LINES)
            environ[CHECKED_KEY] = checked if ambiguous else UNAVAILABLE
            return self.inner(environ, start_response)
        if checked is None:
            environ[CHECKED_KEY] = NOTHING
            return self.inner(environ, start_response)
        decision = checked.decision
        environ[CHECKED_KEY] = checked
        if decision.allowed:
            if settings.header_reset == "epoch":  # the after_request hook writes X-RateLimit-Reset's time
                return self.inner(environ, start_response)
            checked.at_wsgi = True
            headers = outcome_of(decision, settings.answers, checked.policy).headers
            return self.inner(environ, _StartWithHeaders(start_response, headers) if headers else start_response)
        if found.answers and self.extension.on_limit is None and self._answerable(environ):
            outcome = outcome_for(decision, settings.answers, checked.policy, settings.header_reset)
            return start_outcome(start_response, outcome, _STATUS_LINES)
        return self.inner(environ, start_response)  # the hook answers from checked

    def _rules_for(self, environ: Environ) -> _EndpointRules | None:
        app = self.app
        config = app.config
        if config.get("TRUSTED_HOSTS") is not None:
            return None
        registry = self.extension.registry
        if self._generation != registry.generation:
            self._by_endpoint = {}
            self._routes = {}
            self._generation = registry.generation
        configured = config.get("SERVER_NAME")
        route: tuple[object, ...] | None = None
        if "HTTP_UPGRADE" not in environ:  # what Flask's routing reads of the environ (not the query)
            route = (
                environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"), environ.get("SCRIPT_NAME"),
                environ.get("HTTP_HOST"), environ.get("SERVER_NAME"), environ.get("SERVER_PORT"),
                environ.get("wsgi.url_scheme"), configured,
            )
            if route in self._routes:
                return self._routes[route]
        found = self._route(environ, configured)
        if route is not None and getattr(app, "_got_first_request", False):  # routes and hooks are final now
            remember(self._routes, route, found, _ROUTES)
        return found

    def _route(self, environ: Environ, configured: object) -> _EndpointRules | None:
        app = self.app
        url_map = app.url_map
        server_name = None if url_map.host_matching or configured is None else str(configured)
        subdomain = None
        if not url_map.host_matching and not app.subdomain_matching:
            subdomain = url_map.default_subdomain or ""
        try:
            rule, _ = url_map.bind_to_environ(environ, server_name=server_name, subdomain=subdomain).match(
                return_rule=True
            )
        except (HTTPException, RequestRedirect):
            return None  # Flask answers it (404, 405, redirect); the hook checks it
        endpoint = rule.endpoint
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        key = (endpoint, method)
        if key in self._by_endpoint:
            return self._by_endpoint[key]
        found = self._resolve(endpoint, method)
        if getattr(app, "_got_first_request", False):  # the app's hooks and handlers are final now
            remember(self._by_endpoint, key, found, _ROUTES)  # the method is the client's text
        return found

    def _resolve(self, endpoint: str, method: str) -> _EndpointRules | None:
        app = self.app
        extension = self.extension
        names = _blueprint_names(endpoint)
        if any(app.url_value_preprocessors.values()):
            return None
        before = app.before_request_funcs.get(None, [])
        if not before or before[0] != extension._check:
            return None  # another hook of the app's runs first (and may answer without a charge)
        blueprints = [app.blueprints[name] for name in names if name in app.blueprints]
        applicable = self.state.applicable(endpoint, app.view_functions.get(endpoint), lambda: blueprints, method)
        if not _rules_scope_only(applicable):
            return None
        scopes: list[str | None] = [None, *names]
        answers = (
            app.response_class is Response
            and unhandled(app, _PROBE, names, in_request=False)
            and list(app.after_request_funcs.get(None, [])) == [extension._add_headers]
            and not any(app.after_request_funcs.get(name) for name in names)
            and not any(app.teardown_request_funcs.get(name) for name in scopes)
        )
        return _EndpointRules(applicable, answers)

    def _answerable(self, environ: Environ) -> bool:
        """Per request: nobody but the extension would see this request's denial."""
        if any(signal.receivers for signal in _SIGNALS):
            return False
        cookie = environ.get("HTTP_COOKIE")
        return not cookie or str(self.app.config.get("SESSION_COOKIE_NAME") or "session") not in cookie

