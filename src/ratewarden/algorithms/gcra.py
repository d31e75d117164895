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
    tat = now if state is None or state[0] < now else state[0]
    new_tat = tat + cost * interval
    if new_tat - now <= window + 1e-9:
        remaining = int((window - (new_tat - now)) / interval + 1e-9)
        return (new_tat,), Decision(True, burst, remaining, new_tat - now, 0.0, rate.period)
    retry_after = math.inf if cost > burst else new_tat - window - now
    remaining = max(0, int((window - (tat - now)) / interval + 1e-9))
    return None, Decision(False, burst, remaining, tat - now, retry_after, rate.period)
