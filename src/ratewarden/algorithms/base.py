"""What every algorithm is: a pure function of (state, now, cost, rate)."""

from __future__ import annotations

import logging
import time
from typing import Final, Protocol

from ..decision import Decision
from ..rates import Rate

__all__ = ["STEP_BACK", "Algorithm", "State", "clock_stepped_back"]

log = logging.getLogger("ratewarden.algorithms")

_WARN_EVERY: Final = 600.0  # seconds between two warnings of a clock stepped back
_warned_at: list[float] = [-_WARN_EVERY]  # when the last one was logged (time.monotonic)

STEP_BACK: Final = 30.0
"""How far ahead of the clock (and more than its period) a state must be to be taken for a clock
stepped back and dropped. A late clock reading is behind by what a store's deadline and the
scheduler allow, seconds at worst under load (a short window's state is often more than a period
ahead of a late reading); a clock stepped back after running ahead is usually far more."""

State = tuple[float, ...]
"""An algorithm's stored state: a flat tuple of floats, so every store can hold it."""


class Algorithm(Protocol):
    """``(state or None, now in seconds, cost, rate) -> (new state or None, decision)``.

    The new state is ``None`` when the request is denied: a denied request changes nothing.
    The state stays meaningful for ``decision.reset_after`` seconds; after that it equals no state,
    so stores use that as its time to live.
    """

    def __call__(
        self, state: State | None, now: float, cost: float, rate: Rate
    ) -> tuple[State | None, Decision]: ...


def clock_stepped_back(ahead: float, period: float) -> None:
    """Warn (at most every ten minutes) that a key's state was ``ahead`` seconds ahead of the
    clock, more than its ``period`` and ``STEP_BACK``: the clock stepped back, and the algorithm
    counts from now.

    A late clock reading (read before another check wrote the state) is behind by what the store's
    deadline and the scheduler allow, never by ``STEP_BACK``; a clock stepped back (corrected after
    running ahead) often is. Keeping
    such a state would refuse the key until the clock catches up with it, while ``Retry-After``
    counts from the state's own time. The Redis script does the same and logs to the Redis log.

    Args:
        ahead: How far the state's time is ahead of the clock, in seconds.
        period: The limit's period, in seconds.
    """
    now = time.monotonic()
    if now - _warned_at[0] >= _WARN_EVERY:
        _warned_at[0] = now
        log.warning(
            "a rate-limit state is %.3f s ahead of the clock (more than its period, %g s): the clock "
            "stepped back; its keys count again from now",
            ahead,
            period,
        )
