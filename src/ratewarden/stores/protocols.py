"""The store contract: what a store implements, as protocols.

A store implements ``AsyncStore`` (``hit``, ``peek``, ``reset``: each over N keys, all or nothing).
Everything else is a capability, a small protocol of its own, checked once when an option that
needs it is configured (``Limiter``, ``charge=``, the WSGI doors, bans), never per request:

- ``Adjusting``: ``adjust``, refunds and penalties (``charge=``; defined in ``charges``);
- ``BlockingStore``: the same four operations for threads, without an event loop (WSGI); its
  parts (``BlockingHit``, ...) one by one, for a store with a synchronous check only;
- ``LocalStore``: the same four operations answered without I/O (in-process stores), so the async
  doors call them without a coroutine;
- ``RejectionCache`` and ``HealthReporting``: a local cache of rejections and its count;
- ``Clearable`` and ``Closable``: ``clear`` and ``close``.

A store of your own implements the ones it can, with no base class; ``Limiter`` (and ``Breaker``)
take it through ``stores.adapted.as_store``. ratewarden's own stores derive from ``stores.base.Store``,
which implements ``AsyncStore``, ``Adjusting`` and ``BlockingStore`` whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from ..charges import Adjusting
from ..decision import Decision
from ..limits import Limit

__all__ = [
    "BLOCKING", "Adjusting", "AsyncStore", "BlockingAdjust", "BlockingHit", "BlockingOperation", "BlockingPeek",
    "BlockingReset", "BlockingStore", "Clearable", "Closable", "HealthReporting", "LocalStore", "RejectionCache",
]

#: An operation of ``BlockingStore``: ``<operation>_blocking``.
BlockingOperation = Literal["hit", "peek", "reset", "adjust"]


@runtime_checkable
class AsyncStore(Protocol):
    """What every store implements. ``hit`` checks ``limits[i]`` against ``keys[i]`` with
    ``costs[i]``: if every limit allows, all are charged; if any denies, none is."""

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Charge all or nothing; return the deciding decision (``base.combine``).

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        ...

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Each limit's decision for a zero-cost request, charging nothing.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
        """
        ...

    async def reset(self, keys: Sequence[str]) -> None:
        """Forget the state of these storage keys.

        Args:
            keys: The storage keys to forget.
        """
        ...


@runtime_checkable
class BlockingHit(Protocol):
    """``hit`` for threads: the store's own synchronous client, never an event loop."""

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit``, blocking the calling thread.

        Args:
            keys: As for ``AsyncStore.hit``.
            limits: As for ``AsyncStore.hit``.
            costs: As for ``AsyncStore.hit``.
        """
        ...


@runtime_checkable
class BlockingPeek(Protocol):
    """``peek`` for threads."""

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek``, blocking the calling thread.

        Args:
            keys: As for ``AsyncStore.peek``.
            limits: As for ``AsyncStore.peek``.
        """
        ...


@runtime_checkable
class BlockingReset(Protocol):
    """``reset`` for threads."""

    def reset_blocking(self, keys: Sequence[str]) -> None:
        """``reset``, blocking the calling thread.

        Args:
            keys: As for ``AsyncStore.reset``.
        """
        ...


@runtime_checkable
class BlockingAdjust(Protocol):
    """``adjust`` for threads."""

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust``, blocking the calling thread.

        Args:
            keys: As for ``Adjusting.adjust``.
            limits: As for ``Adjusting.adjust``.
            amounts: As for ``Adjusting.adjust``.
        """
        ...


@runtime_checkable
class BlockingStore(BlockingHit, BlockingPeek, BlockingReset, BlockingAdjust, Protocol):
    """The four operations for synchronous code (WSGI apps, threads), safe from many threads at once."""


#: Each blocking operation's protocol, as ``Store.can_block`` asks about them.
BLOCKING: dict[BlockingOperation, type] = {
    "hit": BlockingHit, "peek": BlockingPeek, "reset": BlockingReset, "adjust": BlockingAdjust,
}


@runtime_checkable
class LocalStore(Protocol):
    """The four operations answered without I/O, in this process (memory, shared memory): the
    async doors call ``hit_now`` without a coroutine, and the insurance limiter must be one."""

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit`` without I/O.

        Args:
            keys: As for ``AsyncStore.hit``.
            limits: As for ``AsyncStore.hit``.
            costs: As for ``AsyncStore.hit``.
        """
        ...

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` without I/O.

        Args:
            keys: As for ``AsyncStore.peek``.
            limits: As for ``AsyncStore.peek``.
        """
        ...

    def reset_now(self, keys: Sequence[str]) -> None:
        """``reset`` without I/O.

        Args:
            keys: As for ``AsyncStore.reset``.
        """
        ...

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` without I/O.

        Args:
            keys: As for ``Adjusting.adjust``.
            limits: As for ``Adjusting.adjust``.
            amounts: As for ``Adjusting.adjust``.
        """
        ...


@runtime_checkable
class RejectionCache(Protocol):
    """A rejection this process already knows to hold, answered without I/O (or ``None``): the
    doors ask it before a remote store's ``hit``."""

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """The rejection, or ``None`` when the server must be asked.

        Args:
            keys: Storage keys, one per limit.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        ...


@runtime_checkable
class HealthReporting(Protocol):
    """How many checks the store answered from its cache of rejections, without its server
    (``Limiter.without_store``'s ``over_limit_cache``, ``Metrics``)."""

    @property
    def cached_rejections(self) -> int: ...


@runtime_checkable
class Clearable(Protocol):
    """Forget every key the store holds for ratewarden (``Limiter.clear``)."""

    async def clear(self) -> None: ...


@runtime_checkable
class Closable(Protocol):
    """Release connections (``Limiter.close``)."""

    async def close(self) -> None: ...
