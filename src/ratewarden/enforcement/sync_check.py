"""The sync driver of a rule check (``check_blocking``), for WSGI apps, Flask and Django's sync views.

What is charged and what a failure means are the core's (``core.check_steps``), run by the
blocking driver (``steps.drive_blocking``): the store is asked through ``Store.hit_blocking`` (its
own synchronous client: no event loop, no thread hop). Key and cost functions must be synchronous here; an async one is
refused when the integration is built.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision
from ..errors import ConfigurationError
from ..limiter import Limiter
from ..limits import Limit
from ..rules import CompiledRule
from ..steps import drive_blocking
from ..types import Scope
from .core import check_steps, finish_key, key_of, store_failed

__all__ = ["check_blocking", "require_sync_keys", "store_answer_blocking", "sync_key_of"]


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
    """``core.key_of`` for synchronous code: a key function that answers an awaitable failed (it
    cannot be awaited here), with ``key_of``'s fallback.

    Args:
        limiter: Whose ``on_error`` applies when the key function fails; ``None`` raises instead.
        rule: The rule the request matched.
        scope: The request's scope.
    """
    found = key_of(limiter, rule, scope)
    return found if isinstance(found, str) else drive_blocking(finish_key(limiter, rule, scope, found))


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
        only = rules[0]
        key = sync_key_of(limiter, only, scope)
        return store_answer_blocking(limiter, only.storage_keys(key), only.limits, only.costs, "rate limit check")
    return drive_blocking(check_steps(limiter, rules, scope))


def store_answer_blocking(
    limiter: Limiter, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], what: str
) -> Decision | None:
    """``check.store_answer`` from synchronous code, with the same arguments: the store's own
    synchronous client, the same failure policy."""
    try:
        return limiter.store.hit_blocking(keys, limits, costs)
    except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
        return store_failed(limiter, what, exc, keys, limits, costs)
