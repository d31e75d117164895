"""GCRA (generic cell rate algorithm): one timestamp per key, the theoretical arrival time (TAT).

Emission interval ``T = period / limit``; burst ``B`` (default ``limit``) lets ``B`` requests
through at once. A request of cost ``c`` is admitted when ``max(TAT, now) + c*T - now <= B*T``.
``retry_after`` is the exact time until that holds, not overstated by the burst tolerance.
State: ``(tat,)``.
"""

from __future__ import annotations

import math

from ..decision import Decision
from ..rates import Rate
from .base import State


def gcra(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    burst = rate.capacity
    interval = rate.period / rate.limit
    window = burst * interval
    # Offsets from ``now``, never ``(now + x) - now``: at wall-clock times (~1.8e9 s) that loses
    # ~2e-7 s, and a burst-1 limit such as 1/200ms would refuse every request.
    ahead = 0.0 if state is None or state[0] < now else state[0] - now
    used = ahead + cost * interval
    if used <= window + 1e-9:
        remaining = int((window - used) / interval + 1e-9)
        return (now + used,), Decision(True, burst, remaining, used, 0.0, rate.period)
    retry_after = math.inf if cost > burst else used - window
    remaining = max(0, int((window - ahead) / interval + 1e-9))
    return None, Decision(False, burst, remaining, ahead, retry_after, rate.period)
