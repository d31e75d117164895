"""Leaky bucket as a meter (nginx ``limit_req``): each request pours its cost into a bucket that
drains at ``limit/period`` per second; a request that would overflow ``burst`` (default ``limit``)
is rejected. nginx's ``burst=b`` corresponds to ``burst = b + 1`` here, since nginx does not count
the request being served. State: ``(level, last_update)``. A state updated more than a period
ahead of the clock (a clock stepped back) is dropped: the bucket starts empty.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def leaky_bucket(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    capacity = rate.capacity
    per_second = rate.limit / rate.period
    level = 0.0
    if state is not None and state[1] - now > max(rate.period, STEP_BACK):  # the clock stepped back: the state is stale
        clock_stepped_back(state[1] - now, rate.period)
        state = None
    if state is not None:
        if state[1] > now:  # a late clock reading: never move the last update back (a second drain)
            now = state[1]
        level = max(0.0, state[0] - (now - state[1]) * per_second)
    if level + cost <= capacity + 1e-9:  # float residue of a drained level is not a unit
        level += cost
        remaining = int(capacity - level + 1e-9)
        return (level, now), Decision(True, capacity, remaining, level / per_second, 0.0, rate.period)
    retry_after = math.inf if cost > capacity else (level + cost - capacity) / per_second
    remaining = int(capacity - level + 1e-9)
    return None, Decision(False, capacity, remaining, level / per_second, retry_after, rate.period)
