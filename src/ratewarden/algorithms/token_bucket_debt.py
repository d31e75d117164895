"""Token bucket with debt: a token bucket whose balance may go negative, down to ``-debt``.

A request is admitted when the bucket holds at least one whole token (or its whole cost, if that
is smaller) and the balance after it stays at or above ``-debt``. A negative balance is paid back
by the refill before anything else is admitted. This lets a request costlier than the bucket
through once, then holds the client back for as long as the overdraft takes to repay.
State: ``(tokens, last_update)``. A state updated more than a period ahead of the clock (a clock
stepped back) is dropped: the bucket starts full.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import State
from .token_bucket import refilled


def token_bucket_debt(
    state: State | None, now: float, cost: float, rate: Rate
) -> tuple[State | None, Decision]:
    capacity = rate.capacity
    debt = rate.max_debt
    period = rate.period
    per_second = rate.limit / period
    tokens, now = refilled(state, now, capacity, per_second, period)
    needed = max(min(cost, 1.0), cost - debt)
    if tokens + 1e-9 >= needed:  # float residue of a refill is not a missing unit
        tokens -= cost
        reset_after = (capacity - tokens) / per_second
        remaining = max(0, int(tokens + 1e-9))
        return (tokens, now), Decision(True, capacity, remaining, reset_after, 0.0, period)
    retry_after = math.inf if needed > capacity else (needed - tokens) / per_second
    reset_after = (capacity - tokens) / per_second
    return None, Decision(False, capacity, max(0, int(tokens + 1e-9)), reset_after, retry_after, period)
