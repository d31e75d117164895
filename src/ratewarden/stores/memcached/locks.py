"""This process's per-key locks: a key has one contender per process (its batch, a multi-key
check or an adjust); a check of several keys takes them in a fixed order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .commands import Commands

_T = TypeVar("_T")


def _releaser(lock: asyncio.Lock) -> Callable[[bool], None]:
    return lambda _: lock.release()


class KeyLocks(Commands):
    """Operations run holding their keys' local locks."""

    _locks: dict[bytes, list[Any]]  # key -> [asyncio.Lock, users]

    async def _locked(self, mkeys: list[bytes], operation: Callable[[], Awaitable[_T]]) -> _T:
        ordered = sorted(set(mkeys))
        users: list[bytes] = []  # keys whose lock entry counts us
        acquired: list[asyncio.Lock] = []  # locks we hold (a waiter cancelled holds none)
        try:
            for key in ordered:
                entry = self._locks.get(key)
                if entry is None:
                    entry = self._locks[key] = [asyncio.Lock(), 0]
                entry[1] += 1
                users.append(key)
                lock: asyncio.Lock = entry[0]
                if lock.locked():
                    await self._wait_ours(asyncio.ensure_future(lock.acquire()), _releaser(lock))
                else:
                    await lock.acquire()
                acquired.append(lock)
            return await operation()
        finally:
            for held in acquired:
                held.release()
            for key in users:
                entry = self._locks[key]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]
