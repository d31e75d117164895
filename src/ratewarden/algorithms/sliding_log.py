"""Sliding window log: an exact record of the last ``limit`` admitted units.

A request of cost ``c`` is admitted when fewer than ``limit - c + 1`` units were admitted in the
last ``period`` seconds. The log keeps one timestamp per admitted unit and never more than
``limit`` of them, so memory per key is bounded by the limit. State: the sorted timestamps. A log
whose newest stamp is more than a period ahead of the clock (a clock stepped back) is dropped.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back


def sliding_log(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    limit = rate.limit
    period = rate.period
    horizon = now - period
    log: State = ()
    if state and state[-1] - now > max(period, STEP_BACK):  # the clock stepped back: the log is stale
        clock_stepped_back(state[-1] - now, period)
    elif state:
        if state[-1] > now:  # a late clock reading: stamps stay in order (time never goes back)
            now = state[-1]
            horizon = now - period
        i = 0
        n = len(state)
        while i < n and state[i] <= horizon:
            i += 1
        log = state[i:]
    units = math.ceil(cost)
    used = len(log)
    if used + units <= limit:
        if units:
            log = log + (now,) * units
        reset_after = (log[-1] + period - now) if log else 0.0
        return log, Decision(True, limit, limit - len(log), reset_after, 0.0, period)
    reset_after = log[-1] + period - now if log else 0.0
    if units > limit:
        retry_after = math.inf
    else:
        # The (used + units - limit)-th oldest entry must leave the window.
        retry_after = log[used + units - limit - 1] + period - now
    return None, Decision(False, limit, max(0, limit - used), reset_after, retry_after, period)
