"""Checking a request against its matched rules, with the failure policy applied.

Shared by the middleware, the FastAPI dependency, the decorator and the WebSocket limits, so all
of them charge the same keys the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Sequence

from ..context import context_for
from ..decision import Decision
from ..errors import LimitUnavailable
from ..keys import key_text
from ..limiter import Limiter
from ..limits import Limit
from ..rules import CompiledRule
from ..stores.base import StoreError
from ..types import Scope

__all__ = [
    "KeyPending", "LimitUnavailable", "can_check_now", "check_now", "check_pending", "check_rules", "report_failure",
    "store_failed",
]

log = logging.getLogger("ratewarden")

_last_error_log = 0.0
_failures: dict[tuple[str, str], int] = {}


def failure_counts() -> dict[tuple[str, str], int]:
    """Checks that failed in this process, by (what failed, exception type): a store, a key
    function, a shadow rule... (``ratewarden_check_failures_total`` in ``Metrics``)."""
    return dict(_failures)


def _count_failure(what: str, exc: BaseException) -> None:
    name = type(exc).__name__
    _failures[(what, name)] = _failures.get((what, name), 0) + 1


def _report_failure(what: str, exc: BaseException) -> None:
    _count_failure(what, exc)
    # A store outage fails every request; log at most once a second, not once a request.
    global _last_error_log
    now = time.monotonic()
    if now - _last_error_log >= 1.0:
        _last_error_log = now
        log.warning("rate limit check failed (%s): %s: %s", what, type(exc).__name__, exc)


async def _key_of(rule: CompiledRule, scope: Scope) -> str:
    value = rule.key(scope)
    if rule.key_is_async or isinstance(value, Awaitable):
        value = await value  # type: ignore[misc]
    return key_text(value, scope)


class KeyPending(Exception):
    """``check_now`` cannot decide at once: the key function answered an awaitable, which
    ``check_pending`` awaits. Rare: only a sync key function with an async fallback does that.

    Args:
        value: The key function's awaitable answer.
    """

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


def can_check_now(limiter: Limiter, rules: tuple[CompiledRule, ...]) -> bool:
    """Whether ``check_now`` applies: one enforced rule with a sync key and a fixed cost, on a store
    that answers without I/O (the usual in-process setup).

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
    """
    return len(rules) == 1 and rules[0].checked_inline and limiter.store.local


def check_now(limiter: Limiter, rule: CompiledRule, scope: Scope) -> Decision | None:
    """``check_rules`` for one rule that ``can_check_now``, without a coroutine: same keys, same
    decision, same failure policy. Raises ``KeyPending`` when the key function answered an awaitable.

    Args:
        limiter: Checks the limits on its store.
        rule: The one rule the request matched.
        scope: The ASGI connection scope.
    """
    try:
        client = rule.client_ip
        raw = client.__call__(scope) if client is not None else rule.key(scope)  # native call for ClientIP
        if type(raw) is str and raw:
            key = raw
        elif isinstance(raw, Awaitable):
            raise KeyPending(raw)
        else:  # no value: the client IP then
            key = key_text(raw, scope)
    except KeyPending:
        raise
    except Exception as exc:
        report_failure(limiter, "rate limit check", exc)
        return None
    try:
        store = limiter.store
        if rule.one_limit:
            return store.hit_one(rule.storage_keys(key)[0], rule.limits[0], rule.cost)
        return store.hit_now(rule.storage_keys(key), rule.limits, rule.costs)
    except StoreError as exc:
        return store_failed(limiter, "rate limit check", exc, rule.storage_keys(key), rule.limits, rule.costs)
    except Exception as exc:
        report_failure(limiter, "rate limit check", exc)
        return None


async def check_pending(limiter: Limiter, rule: CompiledRule, scope: Scope, pending: KeyPending) -> Decision | None:
    """The rest of ``check_now`` once the key function's awaitable answer is awaited.

    Args:
        limiter: Checks the limits on its store.
        rule: The one rule the request matched.
        scope: The ASGI connection scope.
        pending: What ``check_now`` raised.
    """
    try:
        value = await pending.value  # type: ignore[misc]
        keys = rule.storage_keys(key_text(value, scope))
    except Exception as exc:
        report_failure(limiter, "rate limit check", exc)
        return None
    try:
        return limiter.store.hit_now(keys, rule.limits, rule.costs)
    except StoreError as exc:
        return store_failed(limiter, "rate limit check", exc, keys, rule.limits, rule.costs)
    except Exception as exc:
        report_failure(limiter, "rate limit check", exc)
        return None


async def check_rules(
    limiter: Limiter,
    rules: Sequence[CompiledRule],
    scope: Scope,
    message: bool = False,
) -> Decision | None:
    """Charge the request to every rule, all or nothing; ``None`` when nothing was decided
    (no limit applies, or the check failed under the fail-open policy).

    Shadow rules are charged separately and never deny: their decision is logged when it would
    have denied and, for a request or a WebSocket connection (not for each of its messages, which
    would grow without bound), added to the request's ``RequestContext.shadow``.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        scope: The ASGI connection scope.
        message: Charge the WebSocket message limits instead of the connection or request ones.
    """
    # Longer than 60 lines on purpose: this single-rule fast path is every request's path, and
    # splitting it out would add a call to each of them.
    if len(rules) == 1 and not message:
        rule = rules[0]
        store = limiter.store
        if rule.checked_inline:
            # The common case: one enforced rule; no lists, and no await on a local store or for a
            # rejection the store already knows (a remote store's rejection cache).
            try:
                raw = rule.key(scope)
                if type(raw) is str and raw:
                    key = raw
                else:  # no value (the client IP then), or an awaitable (an async fallback)
                    value = await raw if isinstance(raw, Awaitable) else raw
                    key = key_text(value, scope)
                storage_keys = rule.storage_keys(key)
            except Exception as exc:
                report_failure(limiter, "rate limit check", exc)
                return None
            try:
                if store.local:
                    return store.hit_now(storage_keys, rule.limits, rule.costs)
                cached = store.cached_rejection(storage_keys, rule.costs)
                return cached or await store.hit(storage_keys, rule.limits, rule.costs)
            except StoreError as exc:
                return store_failed(limiter, "rate limit check", exc, storage_keys, rule.limits, rule.costs)
            except Exception as exc:
                report_failure(limiter, "rate limit check", exc)
                return None
    keys: list[str] = []
    limits: list[Limit] = []
    costs: list[float] = []
    shadow: list[CompiledRule] = []
    try:
        for rule in rules:
            if rule.shadow:
                shadow.append(rule)
                continue
            key = await _key_of(rule, scope)
            if message:
                keys.extend(rule.storage_keys(key, message=True))
                limits.extend(rule.message_limits)
                costs.extend(rule.message_costs)
                continue
            keys.extend(rule.storage_keys(key))
            limits.extend(rule.limits)
            if rule.cost_fn is None:
                costs.extend(rule.costs)
            else:
                cost = float(rule.cost_fn(scope))
                costs.extend([cost] * len(rule.limits))
    except Exception as exc:
        report_failure(limiter, "key function", exc)
        return None
    if shadow:
        await _check_shadow(limiter, shadow, scope, message)
    if not keys:
        return None
    try:
        store = limiter.store
        if store.local:
            return store.hit_now(keys, limits, costs)
        return await store.hit(keys, limits, costs)
    except StoreError as exc:
        return store_failed(limiter, "store", exc, keys, limits, costs)
    except Exception as exc:
        report_failure(limiter, "store", exc)
        return None


async def _check_shadow(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope, message: bool) -> None:
    for rule in rules:
        try:
            key = await _key_of(rule, scope)
            limits = rule.message_limits if message else rule.limits
            costs = rule.message_costs if message else rule.costs
            decision = await limiter.store.hit(rule.storage_keys(key, message=message), limits, costs)
        except Exception as exc:
            _report_failure("shadow rule", exc)
            continue
        if not message:
            context = context_for(scope)
            context.shadow = (*context.shadow, decision)
        if not decision.allowed:
            log.info("shadow limit %s would deny key=%s (retry after %.3fs)", rule.rule.name, key, decision.retry_after)


def store_failed(
    limiter: Limiter, what: str, exc: StoreError, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
) -> Decision | None:
    """A check the store failed, as every integration answers it: ``Limiter.decide_without_store``
    counts and logs it and, under fail-open, decides it with the insurance limiter; without one,
    fail-open returns ``None`` (no decision: the request goes through) and fail-closed raises
    ``LimitUnavailable``.

    Args:
        limiter: Whose store failed (its ``fallback`` and ``on_error`` apply).
        what: What failed, for ``failure_counts``.
        exc: What the store raised.
        keys: The check's storage keys.
        limits: The limit checked on each key.
        costs: What the request costs under each limit.
    """
    _count_failure(what, exc)
    decision = limiter.decide_without_store(exc, keys, limits, costs)
    if decision is None and limiter.on_error == "closed":
        raise LimitUnavailable(what) from exc
    return decision


def report_failure(limiter: Limiter, what: str, exc: Exception) -> None:
    """Log; under fail-closed raise ``LimitUnavailable``; under fail-open return (no decision).

    Args:
        limiter: Whose ``on_error`` applies.
        what: What failed, for the log.
        exc: The failure.
    """
    _report_failure(what, exc)
    if limiter.on_error == "closed":
        raise LimitUnavailable(what) from exc
