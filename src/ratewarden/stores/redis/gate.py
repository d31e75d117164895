"""At most as many calls through the redis-py client at once as its pool has connections: the
rest wait their turn.

Only the standalone pool (``BlockingConnectionPool``) waits for a free connection; redis-py's
Sentinel and Cluster pools raise ``MaxConnectionsError`` as soon as they are exhausted, so a
burst of checks larger than the pool (``coalesce=0``) failed some of them on a healthy server.
Every call the store makes through the client takes a turn here first (pipelines of its own
connections do not: ``pool_size`` bounds them). The caller's timeout bounds the wait; a ``Turn``
records that its call had to wait, so that a timeout names the pool's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ...errors import ConfigurationError

__all__ = ["ConnectionGate", "Turn"]

_T = TypeVar("_T")


class Turn:
    """One store call (one or more client calls): whether any of them waited for a connection."""

    __slots__ = ("waited",)

    def __init__(self) -> None:
        self.waited = False


class ConnectionGate:
    """Lets ``size`` client calls run at once, each using at most one connection per server; the
    others wait. The semaphore binds to the loop that first waits on it,
    as the client's connections bind to the loop that opened them."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ConfigurationError(f"a connection gate needs at least 1 connection, got {size}")
        self.size = size
        self._free = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def slot(self, turn: Turn) -> AsyncIterator[None]:
        """Hold one connection's turn for the block (its client calls made one after another)."""
        if self._free.locked():
            turn.waited = True
        await self._free.acquire()
        try:
            yield
        finally:
            self._free.release()

    async def run(self, turn: Turn, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """``await call(*args)`` in a turn of its own (the call is made only once it has one)."""
        async with self.slot(turn):
            return await call(*args)
