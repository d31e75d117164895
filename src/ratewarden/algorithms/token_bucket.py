"""Token bucket: ``burst`` tokens (default ``limit``), refilled continuously at ``limit/period``
tokens per second with full float precision. State: ``(tokens, last_update)``. A state updated
more than a period ahead of the clock (a clock stepped back) is dropped: the bucket starts full.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def token_bucket(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    capacity = rate.capacity
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
    if tokens + 1e-9 >= cost:  # float residue of a refill is not a missing unit
        tokens -= cost
        reset_after = (capacity - tokens) / per_second
        return (tokens, now), Decision(True, capacity, int(tokens + 1e-9), reset_after, 0.0, rate.period)
    retry_after = math.inf if cost > capacity else (cost - tokens) / per_second
    reset_after = (capacity - tokens) / per_second
    return None, Decision(False, capacity, int(tokens + 1e-9), reset_after, retry_after, rate.period)
