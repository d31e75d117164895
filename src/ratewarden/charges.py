"""Adjusting counters outside a normal check: refunds, penalties and rewards.

A refund (negative amount) gives units back, e.g. when a request is only meant to count if its
response was an error; a penalty (positive amount) charges units regardless of the limit,
saturating when the limit is exhausted. Both reuse the pure algorithms: a refund is the algorithm
run with a negative cost, and a state that ends up with the whole limit available is simply
deleted (which is what "nothing used" means for every algorithm).

Stores that can implement ``Adjusting`` (an ``adjust(keys, limits, amounts)`` coroutine, with
``adjusted_state``; checked when ``charge=`` is configured), one of the store protocols
(``stores.protocols``); the local ones also a synchronous ``adjust_now``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .algorithms import State
from .decision import Decision
from .errors import ConfigurationError
from .limits import Limit

__all__ = ["Adjusting", "Charge", "adjust", "adjusted_state"]


@runtime_checkable
class Adjusting(Protocol):
    """The store capability of refunds and penalties (``stores.protocols`` names it with the
    others): every ``Store`` has it; a store of your own has it when it writes ``adjust``. Defined
    here, beside the arithmetic, so this module imports no store and the stores can import
    ``adjusted_state``."""

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Apply ``amounts[i]`` to ``keys[i]`` without a limit check.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key.
            amounts: Units per key: positive charges, negative refunds.
        """
        ...


def adjusted_state(limit: Limit, state: State | None, now: float, amount: float) -> tuple[State | None, Decision]:
    """The state after charging ``amount`` (refunding when negative) without denying.

    Returns ``(None, decision)`` when the key should be deleted (its whole limit is available).

    Args:
        limit: The limit, whose algorithm runs.
        state: The key's stored state, ``None`` when it has none.
        now: The current time, in seconds since the epoch.
        amount: Units to charge; negative refunds.
    """
    fn = limit.fn
    rate = limit.rate
    if amount >= 0:
        new_state, decision = fn(state, now, amount, rate)
        if new_state is None and decision.remaining > 0:
            # Over the limit: charge what is left, so the key ends exhausted.
            new_state, decision = fn(state, now, float(decision.remaining), rate)
        if new_state is None:
            _, decision = fn(state, now, 0.0, rate)
            return state, decision
        return new_state, decision
    if state is None:
        _, decision = fn(None, now, 0.0, rate)
        return None, decision
    if limit.algorithm == "sliding_log":
        # One timestamp per admitted unit: drop the newest ones.
        units = math.ceil(-amount)
        new_state = state[: max(0, len(state) - units)]
        _, decision = fn(new_state, now, 0.0, rate)
    elif limit.algorithm == "token_bucket_debt":
        # Plain arithmetic: the admission rule (a whole token) must not refuse a refund in debt.
        capacity = float(rate.capacity)
        at = max(now, state[1])  # never move the last update back
        tokens = min(capacity, state[0] + (at - state[1]) * (rate.limit / rate.period))
        new_state = (min(capacity, tokens - amount), at)
        _, decision = fn(new_state, now, 0.0, rate)
    else:
        new_state, decision = fn(state, now, amount, rate)
        if new_state is not None and limit.algorithm == "sliding_window" and new_state[1] < 0:
            new_state = (new_state[0], 0.0, new_state[2])
            _, decision = fn(new_state, now, 0.0, rate)
    if new_state is None or decision.remaining >= decision.limit:
        _, decision = fn(None, now, 0.0, rate)
        return None, decision
    return new_state, decision


async def adjust(store: Adjusting, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
    """Charge (positive) or refund (negative) ``amounts`` on ``keys``, never denying.

    Args:
        store: A store that can adjust (``Adjusting``).
        keys: Storage keys, one per limit.
        limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
        amounts: Units per key: positive charges, negative refunds.
    """
    return await store.adjust(keys, limits, amounts)


class Charge:
    """When a request really counts, decided after its response.

    The request is still checked (and charged) before the handler runs, so a client over its
    limit is refused up front; once the response status is known, the charge is refunded unless
    the status is one of ``statuses``. ``Charge.failures()`` counts only 4xx and 5xx answers
    (refund on success).

    Args:
        statuses: The statuses that count: ints (``401``), classes (``"5xx"``) or ranges (``"400-499"``).
    """

    def __init__(self, statuses: Sequence[int | str]) -> None:
        self.spec = tuple(statuses)
        ranges: list[tuple[int, int]] = []
        for item in self.spec:
            ranges.append(_status_range(item))
        if not ranges:
            raise ConfigurationError("charge: statuses must name at least one status (e.g. [401, '5xx'])")
        self.ranges = tuple(ranges)

    @classmethod
    def failures(cls) -> Charge:
        return cls(["4xx", "5xx"])

    def counts(self, status: int) -> bool:
        """Whether a response with ``status`` keeps its charge.

        Args:
            status: The response's HTTP status.
        """
        return any(lo <= status <= hi for lo, hi in self.ranges)

    def __repr__(self) -> str:
        return f"Charge({list(self.spec)!r})"


def _status_range(item: int | str) -> tuple[int, int]:
    if isinstance(item, bool):
        raise ConfigurationError(f"invalid status {item!r}")
    if isinstance(item, int):
        if 100 <= item <= 599:
            return item, item
        raise ConfigurationError(f"invalid status {item!r}: expected 100-599")
    if isinstance(item, str):
        text = item.strip().lower()
        if len(text) == 3 and text[0] in "12345" and text[1:] == "xx":
            base = int(text[0]) * 100
            return base, base + 99
        lo_text, sep, hi_text = text.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            pass
        else:
            if 100 <= lo <= hi <= 599:
                return lo, hi
    raise ConfigurationError(f"invalid status {item!r}: use a code (401), a class ('5xx') or a range ('400-499')")
