"""GCRA (generic cell rate algorithm): one timestamp per key, the theoretical arrival time (TAT).

Emission interval ``T = period / limit``; burst ``B`` (default ``limit``) lets ``B`` requests
through at once. A request of cost ``c`` is admitted when ``max(TAT, now) + c*T - now <= B*T``.
``retry_after`` is the exact time until that holds, not overstated by the burst tolerance.
State: ``(tat,)``.

Exact arithmetic: the TAT is an absolute time (~1.8e9 s, where floats are 2.4e-7 s apart), so
adding to it rounded on every request, always the same way (a burst of 7/hour got 6, one of
10000/s got 10005). Every time is therefore a whole number of steps of a power-of-two grid ``q``,
the float step of ``|now| + B*T`` (so ``now`` is usually on it; doubled if ``B`` more steps could
reach ``2**53``): ``now`` is rounded down to it, a stored TAT up, ``T`` up to ``n = ceil(T/q)``
steps and a charge ``c*n`` up to whole steps. Those integers stay below ``2**53``, so Python's ints
and the Redis script's doubles compute them exactly and identically: a burst at one instant admits
exactly ``floor(B/c)`` for a whole cost ``c``, and the rate is never exceeded (with ``now`` read to
the step). The price is an under-admission of at most ``q/T`` (today 0.02% at 1000/s per key,
2.4% at 100000/s, in fact 0.14% at both 10000/s and 100000/s) and fractional charges rounded up to
a step. Old states stay valid: a TAT off the grid is read up to it. An admitted TAT is at most
``B*T`` ahead of the clock; one more than a period further ahead (a clock stepped back) is dropped.
"""

from __future__ import annotations

import math
from typing import Final

from ..decision import Decision
from ..rates import Rate
from .base import STEP_BACK, State, clock_stepped_back

_EXACT: Final = 9_007_199_254_740_992  # 2**53: integers below it are exact doubles


def gcra(state: State | None, now: float, cost: float, rate: Rate) -> tuple[State | None, Decision]:
    burst = rate.capacity
    interval = rate.period / rate.limit
    # The grid step q: the float step of |now| + B*T (so ``now`` is usually on the grid), doubled
    # when the TATs could reach 2**53 steps.
    q = math.ldexp(1.0, math.frexp(abs(now) + burst * interval)[1] - 53)
    step = math.ceil(interval / q)  # T, rounded up: the rate is never exceeded
    start = math.floor(now / q)  # divisions by a power of two are exact
    if start + burst * step >= _EXACT:
        q *= 2.0
        step = math.ceil(interval / q)
        start = math.floor(now / q)
    window = burst * step
    ahead = 0
    if state is not None:
        tat = math.ceil(state[0] / q)
        if tat > start:
            ahead = tat - start
            if (ahead - window) * q > max(rate.period, STEP_BACK):  # past B*T + period: the clock stepped back
                clock_stepped_back((ahead - window) * q, rate.period)
                ahead = 0
    used = ahead + math.ceil(cost * step)
    if used <= window:
        return ((start + used) * q,), Decision(True, burst, (window - used) // step, used * q, 0.0, rate.period)
    retry_after = math.inf if cost > burst else (used - window) * q
    remaining = max(0, (window - ahead) // step)
    return None, Decision(False, burst, remaining, ahead * q, retry_after, rate.period)
