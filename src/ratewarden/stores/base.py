"""The contract every store fulfils: atomic all-or-nothing checks of several limits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..errors import StoreError
from ..limits import Limit

__all__ = ["Store", "StoreError", "combine"]


@mypyc_attr(allow_interpreted_subclasses=True)
class Store(ABC):
    """Stores evaluate the algorithms themselves, so each check is one atomic step.

    ``hit`` checks ``limits[i]`` against ``keys[i]`` with ``costs[i]``: if every limit allows,
    all are charged; if any denies, none is. It returns the most restrictive decision.
    """

    #: True when ``hit_now`` answers without I/O (the middleware then skips the coroutine).
    local: ClassVar[bool] = False

    @abstractmethod
    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Charge all or nothing; return the deciding decision."""

    @abstractmethod
    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Each limit's current decision for a zero-cost request, charging nothing."""

    @abstractmethod
    async def reset(self, keys: Sequence[str]) -> None:
        """Forget the state of these storage keys."""

    async def clear(self) -> None:
        """Forget every key this store holds for ratewarden."""
        raise NotImplementedError(f"{type(self).__name__} cannot clear")

    async def close(self) -> None:
        """Release connections; the default has nothing to release."""

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Synchronous ``hit`` for local stores."""
        raise NotImplementedError(f"{type(self).__name__} has no synchronous hit")

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """A rejection this process already knows to hold, answered without I/O (or ``None``)."""
        return None


def combine(decisions: Sequence[Decision]) -> Decision:
    """The decision to report for several limits: the longest wait among denials, else the
    allowance with the fewest remaining."""
    chosen = decisions[0]
    if len(decisions) == 1:
        return chosen
    denied = [d for d in decisions if not d.allowed]
    if denied:
        return max(denied, key=lambda d: d.retry_after)
    return min(decisions, key=lambda d: (d.remaining, -d.reset_after))
