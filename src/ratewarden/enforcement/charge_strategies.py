"""How a request of several counted items is charged: the strategies of a gateway's check whose
items each carry their own key, limit and cost (Envoy's descriptors, translated by ``serve.rls``).

An item's ``kind`` says how it counts:

- ``ENFORCED``: every enforced item of a request is charged all or nothing in one store call
  (``charge_items``), one counter named twice charged once for both costs; or, ``each=True``, each
  on its own, a refused one charged up to its limit (``Store.adjust``), as envoyproxy/ratelimit does;
- ``SHADOW``: charged on its own, never refuses, and a store failure is logged, never the failure
  policy (``shadow_answer``);
- ``QUOTA``: charged on its own with the failure policy; the request is refused by its quota
  items only when every one of them is over (``request_allowed``);
- ``UNLIMITED`` and ``NONE``: no store touched, never over.

A counted item with no limit (``limit=None``) is a limit of 0: always over, charged nothing (an
enforced one leaves the other enforced items read, not charged). A store failure under fail-closed
raises ``LimitUnavailable`` naming what the store said, from one place (``_unavailable``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Sequence

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..errors import LimitUnavailable
from ..limiter import Limiter
from ..limits import Limit
from ..stores.base import StoreError
from .check import shadow_answer, store_answer
from .core import log_failure, store_failed

__all__ = [
    "COUNTED", "ENFORCED", "KINDS", "NONE", "QUOTA", "SHADOW", "UNLIMITED", "Item", "charge_items", "copy_decision",
    "request_allowed", "window_left",
]

ENFORCED = "enforced"
SHADOW = "shadow"
QUOTA = "quota"
UNLIMITED = "unlimited"
NONE = "none"
#: Every kind of item.
KINDS = (ENFORCED, SHADOW, QUOTA, UNLIMITED, NONE)
#: The kinds that count (a store's, or a limit of 0's).
COUNTED = (ENFORCED, SHADOW, QUOTA)


@mypyc_attr(allow_interpreted_subclasses=True)
class Item:
    """One item of a request: what it charges and, once charged, its decision.

    Args:
        kind: ``ENFORCED``, ``SHADOW``, ``QUOTA``, ``UNLIMITED`` or ``NONE``.
        key: Its storage key.
        limit: Its limit; ``None`` on a counted kind: a limit of 0 (always over).
        cost: What the request costs under it.
        zero: A limit of 0's policy: its name (its decision's ``policy``) and its window in seconds
            (its decision's reset).
    """

    __slots__ = ("cost", "decision", "key", "kind", "left", "limit", "zero")

    def __init__(
        self, kind: str, key: str = "", limit: Limit | None = None, cost: float = 1.0, zero: tuple[str, int] = ("", 1)
    ) -> None:
        self.kind = kind
        self.key = key
        self.limit = limit
        self.cost = cost
        self.zero = zero
        #: The item's decision once charged (``None``: nothing decided: not counted, or its store
        #: failed under fail-open without an insurance limiter).
        self.decision: Decision | None = None
        #: ``each=True``: what a refused charge found left before it was charged up to the limit (else -1).
        self.left = -1.0


async def charge_items(limiter: Limiter, items: Sequence[Item], each: bool = False) -> None:
    """Charge ``items`` and set each counted one's ``decision``: the enforced ones all or nothing
    (``each=True``: each on its own, a refused one up to its limit), shadow and quota ones on their own.

    Args:
        limiter: Whose store counts them (its ``fallback`` and ``on_error`` apply when it fails).
        items: The request's items.
        each: Charge every item on its own, as envoyproxy/ratelimit does (needs a store that can adjust).

    Raises:
        LimitUnavailable: The store failed under fail-closed, naming what it said.
    """
    if len(items) == 1 and not each:
        item = items[0]
        limit = item.limit
        if limit is not None and item.kind == ENFORCED:  # the usual request: one counter, no lists built
            store = limiter.store
            if not store.local:
                item.decision = await _enforced(limiter, (item.key,), (limit,), (item.cost,))
                return
            try:
                item.decision = store.hit_one(item.key, limit, item.cost)
            except Exception as exc:  # a StoreError, or a bug in the store: never let through unchecked
                try:
                    item.decision = store_failed(limiter, "store", exc, (item.key,), (limit,), (item.cost,))
                except LimitUnavailable as failed:
                    raise _unavailable(failed, exc) from exc
            return
    jobs: list[Awaitable[None]] = []
    enforced: list[Item] = []
    blocked = False
    for item in items:
        kind = item.kind
        if kind not in COUNTED:
            continue
        if item.limit is None:
            name, period = item.zero
            item.decision = Decision(False, 0, 0, window_left(period), math.inf, float(period), name)
            blocked = blocked or kind == ENFORCED
        elif each:
            jobs.append(_charge_each(limiter, item))
        elif kind == ENFORCED:
            enforced.append(item)
        else:
            jobs.append(_charge_apart(limiter, item))
    if enforced:
        jobs.append(_all_or_nothing(limiter, enforced, blocked))
    if len(jobs) == 1:
        await jobs[0]
    elif jobs:
        await asyncio.gather(*jobs)


def request_allowed(items: Sequence[Item]) -> bool:
    """Whether the charged ``items`` let the request through: no enforced item over, and not every
    quota item over; shadow items and undecided ones (a failed store under fail-open) never refuse.

    Args:
        items: The request's items, charged (``charge_items``).
    """
    quotas = spent = 0
    for item in items:
        decision = item.decision
        if decision is None:
            continue
        kind = item.kind
        if kind == QUOTA:
            quotas += 1
            if not decision.allowed:
                spent += 1
        elif kind == ENFORCED and not decision.allowed:
            return False
    return quotas == 0 or spent < quotas


async def _enforced(
    limiter: Limiter, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
) -> Decision | None:
    """``store_answer`` (the failure policy of every door), its ``LimitUnavailable`` naming the store's failure."""
    try:
        return await store_answer(limiter, keys, limits, costs, "store")
    except LimitUnavailable as exc:
        error = _unavailable(exc)
        raise error from error.__cause__


def _unavailable(exc: LimitUnavailable, cause: BaseException | None = None) -> LimitUnavailable:
    """The fail-closed error of a failed charge, naming what the store said (the one wrapping): ``cause``,
    else ``exc``'s cause, else the exception it was raised while handling (compiled by mypyc, ``raise ...
    from`` leaves the cause unset); set as the new error's cause here, for the same reason."""
    cause = cause or exc.__cause__ or exc.__context__
    error = LimitUnavailable(f"the rate limit store failed: {cause or exc}")
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


async def _charge_apart(limiter: Limiter, item: Item) -> None:
    """A shadow item (never the failure policy) or a quota item (the failure policy), on its own."""
    assert item.limit is not None
    keys, limits, costs = (item.key,), (item.limit,), (item.cost,)
    if item.kind == SHADOW:
        item.decision = await shadow_answer(limiter, keys, limits, costs)
    else:
        item.decision = await _enforced(limiter, keys, limits, costs)


async def _charge_each(limiter: Limiter, item: Item) -> None:
    """One item on its own (``each=True``), as envoyproxy/ratelimit counts: a refused charge is made
    anyway, up to the limit (``Store.adjust``), so the counter ends exhausted and 0 is left."""
    assert item.limit is not None
    keys, limits, costs = (item.key,), (item.limit,), (item.cost,)
    if item.kind == SHADOW:
        decision = await shadow_answer(limiter, keys, limits, costs)
    else:
        decision = await _enforced(limiter, keys, limits, costs)
    if decision is not None and not decision.allowed:
        item.left = float(decision.remaining)
        if decision.remaining > 0:
            try:
                await limiter.store.adjust(keys, limits, costs)
            except Exception as exc:  # the refusal stands; only its charge is lost
                log_failure("store", exc)
        decision = Decision(
            False, decision.limit, 0, decision.reset_after, decision.retry_after, decision.period, decision.policy
        )
    item.decision = decision


async def _all_or_nothing(limiter: Limiter, items: list[Item], blocked: bool) -> None:
    """One all-or-nothing charge of the enforced ``items`` (``blocked``: an enforced limit of 0 is
    always over, so nothing is charged, only read); each item's decision is its own counter's,
    read back (``Store.peek``) when there are several."""
    at_key: dict[str, int] = {}
    keys: list[str] = []
    limits: list[Limit] = []
    costs: list[float] = []
    for item in items:
        assert item.limit is not None
        at = at_key.get(item.key)
        if at is None:  # the same counter twice in one request: charged once, for both costs
            at_key[item.key] = len(keys)
            keys.append(item.key)
            limits.append(item.limit)
            costs.append(0.0 if blocked else item.cost)
        elif not blocked:
            costs[at] += item.cost
    decision = await _enforced(limiter, keys, limits, costs)
    if decision is None:
        return
    if len(keys) == 1:
        for item in items:
            item.decision = decision
        return
    try:
        each = await limiter.store.peek(keys, limits)
    except (StoreError, NotImplementedError):
        each = [decision] * len(keys)
    refused = not decision.allowed
    admitted = 0
    for item in items:
        at = at_key[item.key]
        found = each[at]
        if blocked:
            found = copy_decision(found, True)
        elif refused:
            over = found.remaining < costs[at] or not found.allowed
            found = copy_decision(found, not over, decision.retry_after if over else 0.0)
        item.decision = found
        if found.allowed:
            admitted += 1
    if refused and not blocked and admitted == len(items):
        for item in items:  # a race moved the counts: the store said no, so the request is denied
            assert item.decision is not None
            item.decision = copy_decision(item.decision, False, decision.retry_after)


def copy_decision(decision: Decision, allowed: bool, retry_after: float | None = None, policy: str | None = None) -> Decision:
    """A new decision like ``decision`` (a store's decisions are never changed in place).

    Args:
        decision: The decision copied.
        allowed: The copy's verdict.
        retry_after: The copy's ``retry_after`` (``None``: the same).
        policy: The copy's limit name (``None``: the same).
    """
    retry = decision.retry_after if retry_after is None else retry_after
    return Decision(
        allowed, decision.limit, decision.remaining, decision.reset_after, retry, decision.period,
        decision.policy if policy is None else policy,
    )


def window_left(period: int) -> float:
    """Seconds to the end of the current epoch-aligned window of ``period`` seconds.

    Args:
        period: The window, in seconds.
    """
    return period - math.fmod(time.time(), period)
