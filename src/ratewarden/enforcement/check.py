"""The async rule check: the middleware, the FastAPI dependency, the decorator and the WebSocket
limits call it. What is charged and what a failure means are the core's (``core.py``), run by the
async driver (``steps.drive``); this module adds the shortcut of the usual case, one rule with a
plain key on a store that answers at once, decided without a step machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from ..decision import Decision
from ..errors import LimitUnavailable
from ..limiter import Limiter
from ..limits import Limit
from ..rules import CompiledRule
from ..steps import drive
from ..types import Scope
from .core import check_steps, finish_key, key_of, log_failure, store_failed

__all__ = [
    "Checked", "LimitUnavailable", "check", "check_rules", "decided", "key_later", "rule_key", "shadow_answer", "store_answer",
]


async def key_later(
    limiter: Limiter | None, rule: CompiledRule, scope: Scope, pending: Awaitable[object]
) -> str:
    """``key_of`` for a key function that answered an awaitable: awaited, as text, the same fallback
    (``core.finish_key``).

    Args:
        limiter: As for ``key_of``.
        rule: The rule whose key it is.
        scope: The request's scope.
        pending: What ``key_of`` returned in place of a key.
    """
    found = drive(finish_key(limiter, rule, scope, pending))
    return found if isinstance(found, str) else await found


async def rule_key(limiter: Limiter, rule: CompiledRule, scope: Scope) -> str:
    """``rule``'s key for this request, awaited when its key function answers an awaitable, with
    ``key_failed``'s fallback: the key a check charged, for what follows it (a refund, a delay).

    Args:
        limiter: Whose ``on_error`` applies when the key function fails.
        rule: The rule the request matched.
        scope: The request's scope.
    """
    found = key_of(limiter, rule, scope)
    return found if isinstance(found, str) else await key_later(limiter, rule, scope, found)


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
        return await decided(_check_all(limiter, rules, scope, True))
    return await decided(check(limiter, rules if isinstance(rules, tuple) else tuple(rules), scope))


def _check_all(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope, message: bool) -> Checked:
    """``check_rules`` through the core's step machine (``core.check_steps``): any number of rules,
    shadow rules, async keys, cost functions; decided at once while the store answers at once."""
    return drive(check_steps(limiter, rules, scope, message))
