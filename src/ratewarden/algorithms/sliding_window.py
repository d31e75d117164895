"""Sliding window counter: the previous window's count, weighted by how much of it still overlaps
the sliding window, plus the current window's count. Denied requests are not counted.

State: ``(window_start, current_count, previous_count)``; windows are epoch-aligned. A clock
reading older than the state's window counts at that window's start: state only moves forward. A
state more than a period ahead of the clock (a clock stepped back) is dropped: the key counts from now.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def sliding_window(
    state: State | None, now: float, cost: float, rate: Rate
) -> tuple[State | None, Decision]:
    limit = rate.limit
    period = rate.period
    start = math.floor(now / period) * period
    current = previous = 0.0
    if state is not None:
        if state[0] == start:
            current, previous = state[1], state[2]
        elif state[0] == start - period:
            previous = state[1]
        elif state[0] - now > max(period, STEP_BACK):  # the clock stepped back: the state is stale
            clock_stepped_back(state[0] - now, period)
        elif state[0] > start:  # a late clock reading: the newer window stands (time never goes back)
            start = now = state[0]
            current, previous = state[1], state[2]
    elapsed = now - start
    weight = 1.0 - elapsed / period
    used = previous * weight + current
    if used + cost <= limit + 1e-9:
        current += cost
        used += cost
        if current > 0:
            reset_after = start + 2 * period - now
        else:
            reset_after = (start + period - now) if previous > 0 else 0.0
        remaining = int(limit - used + 1e-9)
        return (start, current, previous), Decision(True, limit, remaining, reset_after, 0.0, period)
    if current > 0:
        reset_after = start + 2 * period - now
    else:
        reset_after = start + period - now
    if cost > limit:
        retry_after = math.inf
    else:
        room = limit - current - cost
        if room >= 0 and previous > 0:
            # The weighted previous count falls linearly inside this window.
            retry_after = period * (1.0 - room / previous) - elapsed
        elif current > 0:
            # Wait for the next window, where this window's count becomes the weighted one.
            retry_after = (start + period - now) + period * (1.0 - (limit - cost) / current)
        else:
            retry_after = start + period - now
        retry_after = max(retry_after, 0.0)
    return None, Decision(False, limit, max(0, int(limit - used + 1e-9)), reset_after, retry_after, period)
