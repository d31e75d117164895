"""Token bucket: ``burst`` tokens (default ``limit``), refilled continuously at ``limit/period``
tokens per second with full float precision. State: ``(tokens, last_update)``. A state updated
more than a period ahead of the clock (a clock stepped back) is dropped: the bucket starts full.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def refilled(state: State | None, now: float, capacity: int, per_second: float, period: float) -> tuple[float, float]:
    """The bucket's tokens at ``now`` and the time they are counted at (``now``, or the state's own
    time when it is later): ``state``'s tokens refilled at ``per_second`` up to the capacity, or a
    full bucket (``token_bucket`` and ``token_bucket_debt`` refill alike)."""
    if state is not None and state[1] - now > max(period, STEP_BACK):  # the clock stepped back: the state is stale
        clock_stepped_back(state[1] - now, period)
        state = None
    if state is None:
        return float(capacity), now
    if state[1] > now:  # a late clock reading: never move the last update back (a second refill)
        now = state[1]
    return min(float(capacity), state[0] + (now - state[1]) * per_second), now


def token_bucket(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    capacity = rate.capacity
    period = rate.period
    per_second = rate.limit / period
    tokens, now = refilled(state, now, capacity, per_second, period)
    if tokens + 1e-9 >= cost:  # float residue of a refill is not a missing unit
        tokens -= cost
        reset_after = (capacity - tokens) / per_second
        return (tokens, now), Decision(True, capacity, int(tokens + 1e-9), reset_after, 0.0, period)
    retry_after = math.inf if cost > capacity else (cost - tokens) / per_second
    reset_after = (capacity - tokens) / per_second
    return None, Decision(False, capacity, int(tokens + 1e-9), reset_after, retry_after, period)
