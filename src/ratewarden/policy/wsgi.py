"""``WSGIPolicyMiddleware``: ``PolicyMiddleware`` for WSGI apps (PEP 3333: Flask, Django, any WSGI
callable) — the same policy file, tiers, shadow mode, bans, delays, after-response charging,
metrics, hot reload and 429/403 bytes, checked synchronously.

The request enters as the scope ``ratewarden.wsgi.scope_of`` builds from the environ, goes through
the stages of the ASGI middleware (``core.PolicyCore``: group choice, record, shadow header, ban
answer) and is checked with ``enforcement.sync_check.check_blocking``. Where the ASGI middleware
awaits, this one blocks the server thread: bans are read and written with the store's ``*_blocking``
methods (``peek_blocking``, ``hit_blocking``, ``reset_blocking``), refunds made with ``adjust_blocking``
(local stores, ``RedisStore`` and ``MemcachedStore`` have them all), and a delayed request sleeps
(``time.sleep``, at most the rule's ``max_wait``). What cannot be done without an event loop is
refused at start-up (and a reload that needs it is refused too), as ``Store.can_block`` tells: a
store without a synchronous client, bans or ``charge`` on a store without a synchronous
peek/reset/adjust, and async key functions.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..enforcement.answers import HeaderOptions
from ..enforcement.sync_check import require_sync_keys
from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, Rule, RuleSet
from ..steps import drive_blocking
from ..types import Scope
from ..wsgi.scope import CONTEXT_KEY, scope_of
from .bans import Bans
from .core import PolicyCore, policy_in_rules, settle_steps
from .decider import REFUSE, Outcome
from .request_context import PolicyContext
from .schema import Policy

__all__ = ["WSGIPolicyMiddleware"]

log = logging.getLogger("ratewarden")

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_WHO = "WSGIPolicyMiddleware"
# Where the request's context is left in the environ, as ``ratewarden.wsgi.RateLimitMiddleware`` does.
_STATUS_LINES = {
    400: "400 Bad Request", 403: "403 Forbidden", 429: "429 Too Many Requests", 503: "503 Service Unavailable",
}


def _text(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Header pairs as PEP 3333 native strings (latin-1)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def _is_async(func: object) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


class _Start:
    """The app's ``start_response``, adding ``extra`` headers and settling after-response charges
    once the status is known (at the first call)."""

    __slots__ = ("extra", "settle", "start_response")

    def __init__(self, start_response: StartResponse, extra: list[tuple[str, str]], settle: Callable[[int], None] | None):
        self.start_response = start_response
        self.extra = extra
        self.settle = settle

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
        self.done(int(status.split(None, 1)[0]))
        out = [*headers, *self.extra] if self.extra else headers
        if exc_info is None:
            return self.start_response(status, out)
        return self.start_response(status, out, exc_info)

    def done(self, status: int) -> None:
        settle, self.settle = self.settle, None
        if settle is not None:
            settle(status)


class WSGIPolicyMiddleware(PolicyCore):
    """``PolicyMiddleware`` for WSGI apps: rules or a reloadable policy file, with tiers, shadow
    mode, bans, delays, after-response charging and metrics, checked synchronously.

    The request's context (``PolicyContext``: ``decision``, ``group``, ``shadow``, ``would_deny``) is
    left in ``environ["ratewarden.context"]``. The admin methods (``block``, ``unblock``,
    ``penalty``, ``reward``, ``stats``) are coroutines, as on ``PolicyMiddleware``: run them with
    ``asyncio.run`` from an admin view.

    Args:
        app: The WSGI app to protect.
        limiter: Checks the limits on its store; the store must answer synchronously
            (``Store.hit_blocking``: every local store, ``RedisStore``, ``MemcachedStore``, a ``Breaker``
            over them), and with bans or ``charge`` rules peek, reset and adjust too (``Store.can_block``:
            the same stores).
        rules: As for ``PolicyMiddleware``.
        policy: As for ``PolicyMiddleware``.
        watch: As for ``PolicyMiddleware``.
        sighup: As for ``PolicyMiddleware``.
        shadow: As for ``PolicyMiddleware``.
        bans: As for ``PolicyMiddleware``.
        metrics: As for ``PolicyMiddleware``.
        shadow_header: As for ``PolicyMiddleware``.
        show_group: As for ``PolicyMiddleware``.
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` (429 answers only) or
            ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
    """

    def __init__(
        self,
        app: WSGIApp,
        limiter: Limiter,
        rules: Sequence[Rule] | RuleSet | str | Path | Policy = (),
        *,
        policy: str | Path | Policy | None = None,
        watch: float | None = None,
        sighup: bool = False,
        shadow: bool = False,
        bans: Bans | None = None,
        metrics: Metrics | None = None,
        shadow_header: bool = True,
        show_group: bool = True,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
    ) -> None:
        self.answers = HeaderOptions(headers, header_style)
        rules, policy = policy_in_rules(rules, policy)
        store = limiter.store
        if not store.can_block("hit"):
            raise ConfigurationError(
                f"{_WHO} checks synchronously (Store.hit_blocking); {type(store).__name__} has no synchronous "
                "client. Use a local store (MemoryStore, SharedMemoryStore) or serve the app over ASGI."
            )
        self.app = app
        self.limiter = limiter
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(rules, limiter.prefix)
        self.headers: HeaderMode = headers
        self.header_style: HeaderStyle = header_style
        self._start_policy(policy, watch, sighup, shadow, bans, metrics, shadow_header, show_group)

    def _check_store(self, rules: Sequence[Rule], bans: Bans | None) -> None:
        """What the ASGI middleware checks, plus what synchronous code needs: plain key functions,
        and synchronous ban reads and writes and refunds."""
        super()._check_store(rules, bans)
        require_sync_keys([CompiledRule(r, self.limiter.prefix) for r in rules if not r.bypass and not r.websocket], _WHO)
        store = self.limiter.store
        for rule in rules:
            if getattr(rule, "charge", None) is not None and not store.can_block("adjust"):
                raise ConfigurationError(
                    f"{_WHO}: rule {rule.name!r} (charge: counting only some statuses) refunds synchronously, "
                    f"which needs adjust_blocking; {type(store).__name__} has none (stores that do: MemoryStore, "
                    "SharedMemoryStore, RedisStore, MemcachedStore, a Breaker over them)"
                )
        if bans is not None:
            Bans.require_blocking(self.limiter, _WHO)
            if _is_async(bans.key):
                raise ConfigurationError(f"{_WHO}: the bans' key function {bans.key!r} is async; give it a plain function")

    # -- request path: the decision core's step machine, driven blocking --------------------------

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Handle one request (PEP 3333).

        Args:
            environ: The WSGI environ.
            start_response: The server's ``start_response``.
        """
        rt = self._runtime
        path = environ.get("PATH_INFO") or "/"
        if not path.isascii():
            path = scope_of(environ)["path"]  # bytes as latin-1 read as UTF-8, as ASGI gives them
        matched = rt.rules.match(environ.get("REQUEST_METHOD", "GET"), path)
        if not matched or not self.limiter.enabled:
            return self.app(environ, start_response)
        scope = scope_of(environ)
        ctx = environ[CONTEXT_KEY] = self._planned(rt, matched, scope)
        outcome = drive_blocking(self.decide_steps(ctx, scope))
        if outcome.verdict is not REFUSE:
            return self._serve(ctx, outcome, scope, environ, start_response)
        if outcome.strike:
            drive_blocking(self.strike_steps(ctx))
        start_response(_STATUS_LINES[outcome.status], _text(outcome.headers))
        return [outcome.body]

    def _serve(self, ctx: PolicyContext, outcome: Outcome, scope: Scope, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Run the app, adding the outcome's headers; after-response charges are settled when the
        app gives its status (or 500 if it raises first). The body passes untouched."""
        extra, settle = outcome.headers, outcome.settle
        if not extra and not settle:
            return self.app(environ, start_response)
        rules = ctx.rules
        limiter = self.limiter
        settled = (lambda status: drive_blocking(settle_steps(limiter, scope, rules, status))) if settle else None
        start = _Start(start_response, _text(extra), settled)
        try:
            return self.app(environ, start)
        except BaseException:
            start.done(500)
            raise
