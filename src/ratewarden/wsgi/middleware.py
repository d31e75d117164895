"""``RateLimitMiddleware`` for WSGI (PEP 3333): the ASGI middleware's rules, keys, headers and answers
for synchronous apps (Flask, Django, any WSGI callable), checked with ``enforcement.check_blocking``.

It never touches a response body: an allowed request's ``start_response`` is wrapped (to add the
rate-limit headers) and the app's iterable is returned as it is, so streaming responses, ``close()``
and ``wsgi.file_wrapper`` pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._mypyc import mypyc_attr
from ..context import context_for, context_of
from ..decision import Decision
from ..enforcement.answers import HeaderOptions
from ..enforcement.outcome import ALLOW, Outcome, failed, outcome_of
from ..enforcement.sync_check import check_blocking, require_sync_keys
from ..errors import LimitUnavailable
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..rules import CompiledRule, Rule, RuleSet, policy_of
from .scope import CONTEXT_KEY, scope_of

__all__ = ["CONTEXT_KEY", "Environ", "LimitHandler", "RateLimitMiddleware", "StartResponse", "WSGIApp"]

Environ = dict[str, Any]
"""The PEP 3333 ``environ``."""
StartResponse = Callable[..., Callable[[bytes], object]]
"""The PEP 3333 ``start_response(status, headers, exc_info=None)``; returns ``write``."""
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
"""A PEP 3333 application."""
LimitHandler = Callable[[Environ, Decision], "WSGIApp | None"]
"""Custom 429 handler: returns a WSGI app whose response is sent instead (``None``: the default 429)."""

_WHO = "ratewarden.wsgi.RateLimitMiddleware"
_STATUS_LINES = {429: "429 Too Many Requests", 503: "503 Service Unavailable", 400: "400 Bad Request"}
_StrHeaders = list[tuple[str, str]]


def _text_headers(headers: Iterable[tuple[bytes, bytes]]) -> _StrHeaders:
    """Header (name, value) pairs as the PEP 3333 native strings (latin-1)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def start_outcome(start_response: StartResponse, outcome: Outcome, lines: dict[int, str] = _STATUS_LINES) -> list[bytes]:
    """Send a refusal ``Outcome`` as it is (its status as ``lines`` write it, complete header list
    and body): what a WSGI app returns for it.

    Args:
        start_response: The PEP 3333 ``start_response``.
        outcome: The core's refusal.
        lines: The status line of each status.
    """
    start_response(lines[outcome.status], _text_headers(outcome.headers))
    return [outcome.body]


@mypyc_attr(allow_interpreted_subclasses=True)
class _StartWithHeaders:
    """A ``start_response`` that adds ``headers`` (an allowed ``Outcome``'s) to the app's own (a new
    list: the app's is left as it was). One small object per allowed request, no closure."""

    __slots__ = ("headers", "start_response")

    def __init__(self, start_response: StartResponse, headers: list[tuple[bytes, bytes]]) -> None:
        self.start_response = start_response
        self.headers = headers

    def __call__(self, status: str, headers: _StrHeaders, exc_info: Any = None) -> Callable[[bytes], object]:
        out = list(headers)
        for name, value in self.headers:
            out.append((name.decode("latin-1"), value.decode("latin-1")))
        if exc_info is None:
            return self.start_response(status, out)
        return self.start_response(status, out, exc_info)


class _StartAddingMissing:
    """A ``start_response`` that adds ``headers`` except those whose name the app set itself (a
    custom ``on_limit`` answer keeps ``Retry-After`` and the rate-limit headers, never twice)."""

    __slots__ = ("headers", "start_response")

    def __init__(self, start_response: StartResponse, headers: _StrHeaders) -> None:
        self.start_response = start_response
        self.headers = headers

    def __call__(self, status: str, headers: _StrHeaders, exc_info: Any = None) -> Callable[[bytes], object]:
        present = {name.lower() for name, _ in headers}
        out = [*headers, *(h for h in self.headers if h[0] not in present)]
        if exc_info is None:
            return self.start_response(status, out)
        return self.start_response(status, out, exc_info)


class RateLimitMiddleware:
    """Applies ``rules`` to every request of a WSGI app: the same rules, keys, headers, 429 and
    failure policy as the ASGI ``ratewarden.RateLimitMiddleware``, checked synchronously.

    The request's ``RequestContext`` (its ``decision`` and ``shadow`` decisions) is left in
    ``environ["ratewarden.context"]`` (``CONTEXT_KEY``) whenever something was decided; it is also
    ``context_of(scope_of(environ))``. Rules whose key function is a coroutine are refused here: a
    WSGI app cannot await it. WebSocket rules never match a WSGI request.

    Args:
        app: The WSGI app to protect.
        limiter: Checks the limits on its store (``Store.hit_blocking``: every local store, and the
            remote stores with a synchronous client).
        rules: A list, or a ``RuleSet`` (whose ``replace`` swaps rules at run time).
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` (429 answers only) or
            ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` (draft-10
            ``RateLimit``/``RateLimit-Policy``) or ``"legacy"`` (``X-RateLimit-*``).
        on_limit: Replaces the problem+json 429: receives the environ and the decision and returns a
            WSGI app whose response is sent, with the 429's ``Retry-After`` and rate-limit headers
            added where it did not set them; ``None`` (or an answer of ``None``) keeps the default.
    """

    def __init__(
        self,
        app: WSGIApp,
        limiter: Limiter,
        rules: Sequence[Rule] | RuleSet = (),
        *,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
        on_limit: LimitHandler | None = None,
    ) -> None:
        self.answers = HeaderOptions(headers, header_style)
        self.app = app
        self.limiter = limiter
        limiter.store.require_blocking(_WHO, "hit")
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(rules, limiter.prefix)
        require_sync_keys(
            [CompiledRule(r, self.rules.prefix) for r in self.rules.rules if not r.bypass and not r.websocket], _WHO
        )
        self.headers = headers
        self.header_style: HeaderStyle = header_style
        self.on_limit = on_limit

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if not path.isascii():
            path = scope_of(environ)["path"]  # bytes as latin-1 read as UTF-8, as ASGI gives them
        matched = self.rules.match(environ.get("REQUEST_METHOD", "GET"), path)
        if not matched:
            return self.app(environ, start_response)
        limiter = self.limiter
        if not limiter.enabled:
            return self.app(environ, start_response)
        scope = scope_of(environ)
        try:
            decision = check_blocking(limiter, matched, scope)
        except LimitUnavailable as exc:
            return start_outcome(start_response, failed(exc))
        if decision is None:
            shadowed = context_of(scope)  # shadow rules' decisions only
            if shadowed is not None:
                environ[CONTEXT_KEY] = shadowed
            return self.app(environ, start_response)
        context = context_for(scope)
        context.decision = decision
        environ[CONTEXT_KEY] = context
        outcome = outcome_of(decision, self.answers, policy_of(matched))
        if outcome.verdict == ALLOW:
            headers = outcome.headers
            return self.app(environ, _StartWithHeaders(start_response, headers) if headers else start_response)
        on_limit = self.on_limit
        if on_limit is not None:
            answer = on_limit(environ, decision)
            if answer is not None:
                return answer(environ, _StartAddingMissing(start_response, _text_headers(outcome.added_headers())))
        return start_outcome(start_response, outcome)
