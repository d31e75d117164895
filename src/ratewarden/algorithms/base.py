"""What every algorithm is: a pure function of (state, now, cost, rate)."""

from __future__ import annotations

from typing import Protocol

from ..decision import Decision
from ..rates import Rate

__all__ = ["Algorithm", "State"]

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
