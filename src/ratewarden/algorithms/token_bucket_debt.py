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
from .base import STEP_BACK, State, clock_stepped_back


def token_bucket_debt(
    state: State | None, now: float, cost: float, rate: Rate
) -> tuple[State | None, Decision]:
    capacity = rate.capacity
    debt = rate.max_debt
    per_second = rate.limit / rate.period
    if state is not None and state[1] - now > max(rate.period, STEP_BACK):  # the clock stepped back: the state is stale
        clock_stepped_back(state[1] - now, rate.period)
        state = None
    if state is None:
        tokens = float(capacity)
    else:
        if state[1] > now:  # a late clock reading: never move the last update back (a second refill)
            now = state[1]
        tokens = min(float(capacity), state[0] + (now - state[1]) * per_second)
    needed = max(min(cost, 1.0), cost - debt)
    if tokens + 1e-9 >= needed:  # float residue of a refill is not a missing unit
        tokens -= cost
        reset_after = (capacity - tokens) / per_second
        remaining = max(0, int(tokens + 1e-9))
        return (tokens, now), Decision(True, capacity, remaining, reset_after, 0.0, rate.period)
    retry_after = math.inf if needed > capacity else (needed - tokens) / per_second
    reset_after = (capacity - tokens) / per_second
    return None, Decision(False, capacity, max(0, int(tokens + 1e-9)), reset_after, retry_after, rate.period)
