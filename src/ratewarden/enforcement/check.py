"""Checking a request against its matched rules, with the failure policy applied.

Shared by the middleware, the FastAPI dependency, the decorator and the WebSocket limits, so all
of them charge the same keys the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from ..context import context_for
from ..decision import Decision
from ..errors import AmbiguousRequest, LimitUnavailable
from ..keys import ClientIP, client_ip, key_text
from ..limiter import Limiter
from ..limits import Limit
from ..rules import CompiledRule
from ..stores.base import StoreError, client_error
from ..types import Scope

__all__ = [
    "KEY_ERROR_PREFIX", "Checked", "LimitUnavailable", "add_charge", "check", "check_rules", "decided", "key_failed",
    "key_later", "key_of", "key_value", "log_failure", "report_failure", "rule_costs", "shadow_answer", "store_answer",
    "store_failed",
]

log = logging.getLogger("ratewarden")

_last_error_log = 0.0
_failures: dict[tuple[str, str], int] = {}

KEY_ERROR_PREFIX = "key-error:"
"""What a request whose key function raised is charged to: this, then the client's address."""


def failure_counts() -> dict[tuple[str, str], int]:
    """Checks that failed in this process, by (what failed, exception type): a store, a key
    function, a shadow rule... (``ratewarden_check_failures_total`` in ``Metrics``)."""
    return dict(_failures)


def _count_failure(what: str, exc: BaseException) -> None:
    name = type(exc).__name__
    _failures[(what, name)] = _failures.get((what, name), 0) + 1


def log_failure(what: str, exc: BaseException, outcome: str = "") -> None:
    """Count a failed check and log it (at most once a second); the caller applies the policy.

    Args:
        what: What failed (a store, a key function, a shadow rule...).
        exc: The failure.
        outcome: What was done about it, appended to the log line.
    """
    _count_failure(what, exc)
    # A store outage fails every request; log at most once a second, not once a request.
    global _last_error_log
    now = time.monotonic()
    if now - _last_error_log >= 1.0:
        _last_error_log = now
        log.warning("rate limit check failed (%s): %s: %s%s", what, type(exc).__name__, exc, outcome)


def key_value(key: Callable[[Scope], object], scope: Scope, client: ClientIP | None = None) -> str | Awaitable[object]:
    """Call a key function: its answer as text (``key_text``: no value is the client's address), or
    the awaitable it answered (``key_later`` awaits it). An exception is the caller's to handle.

    Args:
        key: The key function (a rule's, the bans').
        scope: The request's scope.
        client: ``key`` when it is a ``ClientIP`` (called natively), else ``None``.
    """
    raw = client.__call__(scope) if client is not None else key(scope)
    if type(raw) is str and raw:
        return raw
    if isinstance(raw, Awaitable):
        return raw
    return key_text(raw, scope)


def key_of(limiter: Limiter | None, rule: CompiledRule, scope: Scope) -> str | Awaitable[object]:
    """The client's key for ``rule`` (``key_value``), or ``key_failed``'s when its key function raised:
    the one key lookup of every check (async, blocking, shadow); ``key_later`` finishes an awaitable.

    Args:
        limiter: Whose ``on_error`` applies when the key function raises; ``None`` lets the exception
            through (a shadow rule: its caller logs it).
        rule: The rule the request matched.
        scope: The request's scope.
    """
    try:
        return key_value(rule.key, scope, rule.client_ip)
    except Exception as exc:
        if limiter is None:
            raise
        return key_failed(limiter, rule, scope, exc)


async def key_later(
    limiter: Limiter | None, rule: CompiledRule | None, scope: Scope, pending: Awaitable[object]
) -> str:
    """``key_of`` for a key function that answered an awaitable: awaited, as text, the same fallback.

    Args:
        limiter: As for ``key_of``.
        rule: The rule whose key it is; ``None`` (the bans') lets an exception through.
        scope: The request's scope.
        pending: What ``key_of`` (or ``key_value``) returned in place of a key.
    """
    try:
        return key_text(await pending, scope)
    except Exception as exc:
        if limiter is None or rule is None:
            raise
        return key_failed(limiter, rule, scope, exc)


async def _key_of(limiter: Limiter | None, rule: CompiledRule, scope: Scope) -> str:
    found = key_of(limiter, rule, scope)
    return found if isinstance(found, str) else await key_later(limiter, rule, scope, found)


def key_failed(limiter: Limiter, rule: CompiledRule, scope: Scope, exc: Exception) -> str:
    """The key to charge when ``rule``'s key function raised: never none, so a failing key
    function never lifts the limit. Logged (at most once a second) and counted as a failed check.
    Under the fail-closed policy it raises ``LimitUnavailable`` (503), and an ``AmbiguousRequest``
    (400) is raised again under either; else the request is charged to ``KEY_ERROR_PREFIX`` and
    the client's address: the requests whose key failed share one count per address and rule.

    Args:
        limiter: Whose ``on_error`` applies.
        rule: The rule whose key function failed.
        scope: The request's scope.
        exc: What the key function raised.
    """
    if limiter.on_error == "closed" or isinstance(exc, AmbiguousRequest):
        report_failure(limiter, "key function", exc)  # raises
    key = KEY_ERROR_PREFIX + client_ip(scope)
    log_failure("key function", exc, f"; rule {rule.rule.name!r} charges {key} instead")
    return key


Checked = Decision | None | Awaitable[Decision | None]
"""What ``check`` answers: the decision (``None``: none made) or, when it must wait, an awaitable of it."""


def check(limiter: Limiter, rules: tuple[CompiledRule, ...], scope: Scope) -> Checked:
    """``check_rules`` (same keys, same decision, same failure policy), decided at once where it can
    be: the decision itself (``None``: nothing decided) or, when the check must wait (an async key,
    a store that asks its server, several rules), an awaitable of it. ``LimitUnavailable`` (the
    fail-closed policy) is raised by whichever of the two answers.

    At once, without a coroutine: one enforced rule with a sync key and a fixed cost
    (``CompiledRule.checked_inline``) on a store that answers without I/O (the usual in-process
    setup), or on a store whose local cache of rejections already holds the answer.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched (a tuple: compiled, its length and items are read
            natively).
        scope: The ASGI connection scope.
    """
    if len(rules) != 1:
        return _check_all(limiter, rules, scope, False)
    rule = rules[0]
    if not rule.checked_inline:
        return _check_all(limiter, rules, scope, False)
    key = key_of(limiter, rule, scope)
    if not isinstance(key, str):  # a sync key with an async fallback
        return _charge_later(limiter, rule, scope, key)
    return _charge(limiter, rule, key)


def _charge(limiter: Limiter, rule: CompiledRule, key: str) -> Checked:
    """Charge client ``key`` to ``rule`` (one that is ``checked_inline``): the decision at once on a
    local store or from a remote store's rejection cache, else an awaitable of the store's answer."""
    store = limiter.store
    try:
        if store.local:
            if rule.one_limit:
                return store.hit_one(rule.storage_keys(key)[0], rule.limits[0], rule.cost)
            return store.hit_now(rule.storage_keys(key), rule.limits, rule.costs)
        keys = rule.storage_keys(key)
        cached = store.cached_rejection(keys, rule.costs)
        if cached is not None:
            return cached
        return store_answer(limiter, keys, rule.limits, rule.costs, "rate limit check")
    except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
        return store_failed(limiter, "rate limit check", exc, rule.storage_keys(key), rule.limits, rule.costs)


async def _charge_later(limiter: Limiter, rule: CompiledRule, scope: Scope, pending: Awaitable[object]) -> Decision | None:
    """``_charge`` once the key function's awaitable answer is awaited."""
    return await decided(_charge(limiter, rule, await key_later(limiter, rule, scope, pending)))


async def decided(checked: Checked) -> Decision | None:
    """What ``check`` answered, awaited when it is an awaitable.

    Args:
        checked: ``check``'s answer.
    """
    if checked is None or isinstance(checked, Decision):
        return checked
    return await checked


async def store_answer(
    limiter: Limiter, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], what: str
) -> Decision | None:
    """The store's all-or-nothing answer to a check, with the failure policy applied
    (``store_failed``): every door's charge of enforced limits, the gRPC service's included.

    Args:
        limiter: Whose store answers (its ``fallback`` and ``on_error`` apply when it fails).
        keys: The check's storage keys.
        limits: The limit checked on each key.
        costs: What the request costs under each limit.
        what: What failed, for ``failure_counts`` and ``LimitUnavailable``'s message.
    """
    store = limiter.store
    try:
        if store.local:
            return store.hit_now(keys, limits, costs)
        return await store.hit(keys, limits, costs)
    except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
        return store_failed(limiter, what, exc, keys, limits, costs)


async def shadow_answer(
    limiter: Limiter, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
) -> Decision | None:
    """A shadow limit's charge, on its own: the store's answer, or ``None`` when the store failed
    (logged and counted as a failed ``"shadow rule"``). Never the failure policy: a limit that never
    refuses does not refuse because its store failed (no 503 under fail-closed).

    Args:
        limiter: Whose store counts it.
        keys: The shadow limit's storage keys.
        limits: The limit on each key.
        costs: What the request costs under each limit.
    """
    store = limiter.store
    try:
        if store.local:
            return store.hit_now(keys, limits, costs)
        return await store.hit(keys, limits, costs)
    except Exception as exc:
        log_failure("shadow rule", exc)
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
    if message:
        return await _check_all(limiter, rules, scope, True)
    return await decided(check(limiter, rules if isinstance(rules, tuple) else tuple(rules), scope))


async def _check_all(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope, message: bool) -> Decision | None:
    """``check_rules`` with lists: any number of rules, shadow rules, async keys, cost functions."""
    keys: list[str] = []
    limits: list[Limit] = []
    costs: list[float] = []
    shadow: list[CompiledRule] = []
    try:
        for rule in rules:
            if rule.shadow:
                shadow.append(rule)
                continue
            key = await _key_of(limiter, rule, scope)
            if message:
                keys.extend(rule.storage_keys(key, message=True))
                limits.extend(rule.message_limits)
                costs.extend(rule.message_costs)
                continue
            add_charge(keys, limits, costs, rule, key, scope)
    except LimitUnavailable:
        raise
    except Exception as exc:  # a cost function
        report_failure(limiter, "cost function", exc)
        return None
    if shadow:
        await _check_shadow(limiter, shadow, scope, message)
    if not keys:
        return None
    return await store_answer(limiter, keys, limits, costs, "store")


def rule_costs(rule: CompiledRule, scope: Scope) -> Sequence[float]:
    """What the request costs under each of ``rule``'s limits (its cost function's answer, when it
    has one). A cost function that raises is logged and counted, and the rule's own cost (1) is
    charged: a failing cost function never lifts the limit.

    Args:
        rule: A rule the request matched.
        scope: The request's scope, for a cost function.
    """
    if rule.cost_fn is None:
        return rule.costs
    try:
        return [float(rule.cost_fn(scope))] * len(rule.limits)
    except AmbiguousRequest:
        raise
    except Exception as exc:  # never unlimited: the rule's own cost (1) is charged instead
        log_failure("cost function", exc, f"; rule {rule.rule.name!r} charges cost {rule.cost:g} instead")
        return rule.costs


def add_charge(
    keys: list[str], limits: list[Limit], costs: list[float], rule: CompiledRule, key: str, scope: Scope
) -> None:
    """Add ``rule``'s charge of client ``key`` to a check of several rules: its storage keys, its
    limits and their costs (the async and the blocking check build their lists alike).

    Args:
        keys: The check's storage keys, extended.
        limits: The limit on each key, extended.
        costs: The cost under each limit, extended.
        rule: An enforced rule the request matched.
        key: The client's key (the rule's key function's answer).
        scope: The request's scope, for a cost function.
    """
    keys.extend(rule.storage_keys(key))
    limits.extend(rule.limits)
    costs.extend(rule_costs(rule, scope))


async def _check_shadow(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope, message: bool) -> None:
    for rule in rules:
        try:
            key = await _key_of(None, rule, scope)
        except Exception as exc:
            log_failure("shadow rule", exc)
            continue
        limits = rule.message_limits if message else rule.limits
        costs = rule.message_costs if message else rule.costs
        decision = await shadow_answer(limiter, rule.storage_keys(key, message=message), limits, costs)
        if decision is None:
            continue
        if not message:
            context = context_for(scope)
            context.shadow = (*context.shadow, decision)
        if not decision.allowed:
            log.info("shadow limit %s would deny key=%s (retry after %.3fs)", rule.rule.name, key, decision.retry_after)


def store_failed(
    limiter: Limiter, what: str, exc: Exception, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
) -> Decision | None:
    """A check the store failed, as every integration answers it: ``Limiter.decide_without_store``
    counts and logs it and, under fail-open, decides it with the insurance limiter; without one,
    fail-open returns ``None`` (no decision: the request goes through) and fail-closed raises
    ``LimitUnavailable``. Any exception from the store counts: one that is not a ``StoreError`` (a
    bug in the store or its client, a corrupt local store, even a ``ConfigurationError`` it raises
    at check time) is counted by its own type and decided as a ``StoreError`` naming it.

    Args:
        limiter: Whose store failed (its ``fallback`` and ``on_error`` apply).
        what: What failed, for ``failure_counts``.
        exc: What the store raised.
        keys: The check's storage keys.
        limits: The limit checked on each key.
        costs: What the request costs under each limit.
    """
    _count_failure(what, exc)
    error = exc if isinstance(exc, StoreError) else client_error(repr(limiter.store), "hit", exc)
    decision = limiter.decide_without_store(error, keys, limits, costs)
    if decision is None and limiter.on_error == "closed":
        raise LimitUnavailable(what) from exc
    return decision


def report_failure(limiter: Limiter, what: str, exc: Exception) -> None:
    """Log; under fail-closed raise ``LimitUnavailable``; under fail-open return (no decision). An
    ``AmbiguousRequest`` (a key function's) is raised again under either.

    Args:
        limiter: Whose ``on_error`` applies.
        what: What failed, for the log.
        exc: The failure.
    """
    if isinstance(exc, AmbiguousRequest):  # the client's doing, not a failure: refused under any policy
        raise exc
    log_failure(what, exc)
    if limiter.on_error == "closed":
        raise LimitUnavailable(what) from exc
