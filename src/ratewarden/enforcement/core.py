"""The decision core of a rule check, with no I/O: which key each rule charges, what one check
charges (all or nothing) and what its shadow limits charge, and what a failed check means.

It never awaits and never blocks: ``check_steps`` is the check as a step machine (``ratewarden.steps``),
yielding a key function's awaitable answer and each store charge for a driver to answer (``drive``
awaiting, ``drive_blocking`` blocking), and taking the answer, or the failure, back here
(``store_failed``, ``shadow_outcome``). So the async and sync checks differ only in their driver.
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
from ..steps import Await, Hit, Machine
from ..stores.base import StoreError, client_error
from ..types import Scope

__all__ = [
    "KEY_ERROR_PREFIX",
    "Charge",
    "Shadow",
    "add_charge",
    "charge_for",
    "check_steps",
    "failure_counts",
    "finish_key",
    "key_failed",
    "key_of",
    "key_value",
    "log_failure",
    "report_failure",
    "rule_costs",
    "rule_keys",
    "shadow_outcome",
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
    the one key lookup of every check (async, blocking, shadow); ``check.key_later`` finishes an awaitable.

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


Pending = str | Awaitable[object] | None
"""A rule's key as ``rule_keys`` finds it: the text, an awaitable the door must finish (``key_later``),
or ``None``: a shadow rule whose key function failed (logged; it charges nothing)."""


def rule_keys(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope) -> list[Pending]:
    """Each rule's key (``key_of``): an enforced rule's failure takes ``key_failed``'s fallback (or
    raises under fail-closed), a shadow rule's is logged and leaves ``None``.

    Args:
        limiter: Whose ``on_error`` applies.
        rules: The rules the request matched.
        scope: The request's scope.
    """
    found: list[Pending] = []
    for rule in rules:
        if not rule.shadow:
            found.append(key_of(limiter, rule, scope))
            continue
        try:
            found.append(key_of(None, rule, scope))
        except Exception as exc:
            log_failure("shadow rule", exc)
            found.append(None)
    return found


class Shadow:
    """One shadow rule's charge: charged on its own, never refusing (``shadow_outcome``)."""

    __slots__ = ("costs", "key", "keys", "limits", "rule")

    def __init__(self, rule: CompiledRule, key: str, message: bool) -> None:
        self.rule = rule
        self.key = key
        self.keys = rule.storage_keys(key, message=message)
        self.limits = rule.message_limits if message else rule.limits
        self.costs = rule.message_costs if message else rule.costs


class Charge:
    """What one check charges: the enforced rules' storage keys, limits and costs (all or nothing),
    and each shadow rule's own charge."""

    __slots__ = ("costs", "keys", "limits", "shadows")

    def __init__(self, keys: list[str], limits: list[Limit], costs: list[float], shadows: list[Shadow]) -> None:
        self.keys = keys
        self.limits = limits
        self.costs = costs
        self.shadows = shadows


def charge_for(
    limiter: Limiter, rules: Sequence[CompiledRule], keys: Sequence[Pending], scope: Scope, message: bool = False
) -> Charge | None:
    """The charge of a check of ``rules`` whose keys are ``keys`` (``rule_keys``, finished); ``None``
    when a cost function's failure decided it under fail-open (``report_failure``; fail-closed raises).

    Args:
        limiter: Whose ``on_error`` applies.
        rules: The rules the request matched.
        keys: Each rule's key, finished by the driver (``None``: a shadow rule that charges nothing).
        scope: The request's scope, for cost functions.
        message: Charge the WebSocket message limits instead of the connection or request ones.
    """
    storage: list[str] = []
    limits: list[Limit] = []
    costs: list[float] = []
    shadows: list[Shadow] = []
    try:
        for i, rule in enumerate(rules):
            key = keys[i]
            if key is None:
                continue
            if not isinstance(key, str):
                raise TypeError(f"rule {rule.rule.name!r}: its key was not finished (an awaitable)")
            if rule.shadow:
                shadows.append(Shadow(rule, key, message))
            elif message:
                storage.extend(rule.storage_keys(key, message=True))
                limits.extend(rule.message_limits)
                costs.extend(rule.message_costs)
            else:
                add_charge(storage, limits, costs, rule, key, scope)
    except LimitUnavailable:
        raise
    except Exception as exc:  # a cost function
        report_failure(limiter, "cost function", exc)
        return None
    return Charge(storage, limits, costs, shadows)


def shadow_outcome(shadow: Shadow, decision: Decision | None, scope: Scope, message: bool) -> None:
    """What a shadow limit's answer does: recorded on the request's ``RequestContext.shadow`` (not
    for a WebSocket message: that would grow without bound), and logged when it would have denied.
    ``None`` (its store failed, already logged) does nothing.

    Args:
        shadow: The shadow rule's charge.
        decision: The store's answer to it.
        scope: The request's scope.
        message: Whether it was a WebSocket message's charge.
    """
    if decision is None:
        return
    if not message:
        context = context_for(scope)
        context.shadow = (*context.shadow, decision)
    if not decision.allowed:
        log.info("shadow limit %s would deny key=%s (retry after %.3fs)", shadow.rule.rule.name, shadow.key, decision.retry_after)


def finish_key(limiter: Limiter | None, rule: CompiledRule, scope: Scope, pending: Awaitable[object]) -> Machine[str]:
    """``key_of`` for a key function that answered an awaitable: finished by the driver (synchronous
    code cannot: a failure), as text, with ``key_failed``'s fallback.

    Args:
        limiter: As for ``key_of``: ``None`` lets a failure through (a shadow rule's).
        rule: The rule whose key it is.
        scope: The request's scope.
        pending: What ``key_of`` returned in place of a key.
    """
    try:
        return key_text((yield Await(pending, f"rule {rule.rule.name!r}: the key function")), scope)
    except Exception as exc:
        if limiter is None:
            raise
        return key_failed(limiter, rule, scope, exc)


def check_steps(limiter: Limiter, rules: Sequence[CompiledRule], scope: Scope, message: bool = False) -> Machine[Decision | None]:
    """A check of ``rules`` as a step machine: every rule's key (an awaitable one finished by the
    driver, a failed one replaced by ``key_failed``'s), each shadow rule charged on its own, then
    the enforced rules all or nothing. Its result is the decision; ``None`` when nothing was decided
    (no limit applies, or the check failed under fail-open). Fail-closed raises ``LimitUnavailable``.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        scope: The request's scope.
        message: Charge the WebSocket message limits instead of the connection or request ones.
    """
    if not message and len(rules) == 1 and rules[0].checked_inline:  # the usual case: no list, no Charge
        only = rules[0]
        key = key_of(limiter, only, scope)
        if not isinstance(key, str):
            key = yield from finish_key(limiter, only, scope, key)
        keys = only.storage_keys(key)
        try:
            checked: Decision = yield Hit(limiter.store, keys, only.limits, only.costs)
        except Exception as exc:
            return store_failed(limiter, "rate limit check", exc, keys, only.limits, only.costs)
        return checked
    found_keys = rule_keys(limiter, rules, scope)
    for i, found in enumerate(found_keys):
        if found is None or isinstance(found, str):
            continue
        rule = rules[i]
        if not rule.shadow:
            found_keys[i] = yield from finish_key(limiter, rule, scope, found)
            continue
        try:
            found_keys[i] = yield from finish_key(None, rule, scope, found)
        except Exception as exc:
            log_failure("shadow rule", exc)
            found_keys[i] = None
    charge = charge_for(limiter, rules, found_keys, scope, message)
    if charge is None:
        return None
    store = limiter.store
    for shadow in charge.shadows:
        try:
            answer: Decision | None = yield Hit(store, shadow.keys, shadow.limits, shadow.costs)
        except Exception as exc:  # never the failure policy: a limit that never refuses does not refuse now
            log_failure("shadow rule", exc)
            answer = None
        shadow_outcome(shadow, answer, scope, message)
    if not charge.keys:
        return None
    try:
        decision: Decision = yield Hit(store, charge.keys, charge.limits, charge.costs)
    except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
        return store_failed(limiter, "store", exc, charge.keys, charge.limits, charge.costs)
    return decision
