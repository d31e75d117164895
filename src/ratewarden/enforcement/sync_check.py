"""``check_blocking``: the check of ``check.check_rules`` for synchronous code (WSGI apps).

The same keys, the same all-or-nothing charge and the same failure policy, with the store asked
through ``Store.hit_blocking`` (its own synchronous client: no event loop, no thread hop). Key and
cost functions must be synchronous here; an async one is refused when the integration is built.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..context import context_for
from ..decision import Decision
from ..errors import ConfigurationError, LimitUnavailable
from ..limiter import Limiter
from ..limits import Limit
from ..rules import CompiledRule
from ..types import Scope
from .check import add_charge, key_failed, key_of, log_failure, report_failure, store_failed

__all__ = ["check_blocking", "require_sync_keys", "sync_key_of"]

log = logging.getLogger("ratewarden")


def require_sync_keys(rules: Sequence[CompiledRule], integration: str) -> None:
    """Refuse, at start-up, rules whose key function is a coroutine: synchronous code cannot await it.

    Args:
        rules: The integration's compiled rules.
        integration: Who asks, for the message (e.g. ``"ratewarden.wsgi.RateLimitMiddleware"``).
    """
    for rule in rules:
        if rule.key_is_async:
            raise ConfigurationError(
                f"{integration}: rule {rule.rule.name!r} has an async key function ({rule.rule.key!r}); "
                "a WSGI app checks synchronously, so give it a plain function"
            )


def sync_key_of(limiter: Limiter | None, rule: CompiledRule, scope: Scope) -> str:
    """``check.key_of`` for synchronous code: a key function that answers an awaitable failed (it
    cannot be awaited here), with ``key_of``'s fallback.

    Args:
        limiter: Whose ``on_error`` applies when the key function fails; ``None`` raises instead.
        rule: The rule the request matched.
        scope: The request's scope.
    """
    found = key_of(limiter, rule, scope)
    if isinstance(found, str):
        return found
    close = getattr(found, "close", None)
    if close is not None:
        close()  # a coroutine never awaited: closed, so Python does not warn about it
    exc = TypeError(f"rule {rule.rule.name!r}: the key function returned an awaitable; synchronous code cannot await it")
    if limiter is None:
        raise exc
    return key_failed(limiter, rule, scope, exc)


def check_blocking(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope) -> Decision | None:
    """Charge the request to every rule, all or nothing; ``None`` when nothing was decided (no
    limit applies, or the check failed under the fail-open policy). Raises ``LimitUnavailable``
    under the fail-closed policy. Shadow rules are charged separately and never deny.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        scope: The request as an ASGI-shaped scope (``ratewarden.wsgi.scope_of`` builds one).
    """
    if len(rules) == 1 and rules[0].checked_inline:
        rule = rules[0]
        key = sync_key_of(limiter, rule, scope)
        return _hit(limiter, rule.storage_keys(key), rule.limits, rule.costs, "rate limit check")
    keys: list[str] = []
    limits: list[Limit] = []
    costs: list[float] = []
    shadow: list[CompiledRule] = []
    try:
        for rule in rules:
            if rule.shadow:
                shadow.append(rule)
                continue
            add_charge(keys, limits, costs, rule, sync_key_of(limiter, rule, scope), scope)
    except LimitUnavailable:
        raise
    except Exception as exc:  # a cost function
        report_failure(limiter, "cost function", exc)
        return None
    if shadow:
        _check_shadow(limiter, shadow, scope)
    if not keys:
        return None
    return _hit(limiter, keys, limits, costs, "store")


def _hit(limiter: Limiter, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], what: str) -> Decision | None:
    """The store's answer, with the failure policy applied (``what`` failed)."""
    try:
        return limiter.store.hit_blocking(keys, limits, costs)
    except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
        return store_failed(limiter, what, exc, keys, limits, costs)


def _check_shadow(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope) -> None:
    for rule in rules:
        try:
            key = sync_key_of(None, rule, scope)
            decision = limiter.store.hit_blocking(rule.storage_keys(key), rule.limits, rule.costs)
        except Exception as exc:
            log_failure("shadow rule", exc)
            continue
        context = context_for(scope)
        context.shadow = (*context.shadow, decision)
        if not decision.allowed:
            log.info("shadow limit %s would deny key=%s (retry after %.3fs)", rule.rule.name, key, decision.retry_after)
