"""Fixed window: a counter per calendar-aligned window.

Windows are aligned to the Unix epoch (a "1/min" window runs from :00 to :59 of each minute, a
"1/day" window from 00:00 UTC), so every process and store agrees on the boundaries and
``Retry-After`` is exactly the time to the next boundary. State: ``(window_start, count)``.

A check whose clock reading is older than the state's window (read before a boundary, run after
another check began the next window) counts in that newer window: state only moves forward. A
state more than a period ahead of the clock is no late reading but a clock stepped back: it is
dropped, and the key counts from now (``clock_stepped_back``).
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def fixed_window(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    return fixed_window_of(state, now, cost, rate.limit, rate.period)


def fixed_window_of(
    state: State | None, now: float, cost: float, limit: int, period: float
) -> tuple[State | None, Decision]:
    """``fixed_window`` with the rate's limit and period given (``Limit`` keeps them, so the memory
    store's fast path reads no ``Rate`` attribute)."""
    start = math.floor(now / period) * period
    count = 0.0
    if state is not None:
        if state[0] == start:
            count = state[1]
        elif state[0] - now > max(period, STEP_BACK):  # the clock stepped back: the state is stale
            clock_stepped_back(state[0] - now, period)
        elif state[0] > start:  # a late clock reading: the newer window stands (time never goes back)
            start = now = state[0]
            count = state[1]
    reset_after = start + period - now
    total = count + cost
    if total <= limit:
        return (start, total), Decision(True, limit, int(limit - total), reset_after, 0.0, period)
    retry_after = math.inf if cost > limit else reset_after
    return None, Decision(False, limit, max(0, int(limit - count)), reset_after, retry_after, period)
