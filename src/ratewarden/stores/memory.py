"""In-process store: a bounded ordered dict of algorithm states, with no dependency.

Every check runs the pure algorithm between one read and one write with no ``await`` in
between, so it is atomic under asyncio. A plain ``threading.Lock``, held only for that
computation (never across an ``await``, so never contended by the event loop itself), makes the
same store safe for sync callers on other threads.

Memory is bounded by ``max_keys``. Expired states are reclaimed incrementally: each new key
inspects the two oldest entries (deleting expired ones, rotating live ones to the back), so no
thread ever scans the whole table (while full, a sweep that found only live states pauses the
next for ``_FULL_SWEEP_PAUSE``, so a flood of new keys costs no more than the overflow state's
check). When the table is full of live states, a new key is charged
against a shared overflow state for its limit instead of evicting anyone: live counters are never
reset early, so a flood of new keys cannot buy an attacker a fresh allowance; while full, new
keys share one (stricter) allowance until entries expire. The table never holds more than
``max_keys`` states (``len(store)``); the overflow states, one per distinct limit, live beside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .._mypyc import mypyc_attr
from ..algorithms import State
from ..charges import adjusted_state
from ..decision import Decision
from ..errors import ConfigurationError
from ..limits import Limit
from .base import LocalStoreBase, combine

__all__ = ["MemoryStore"]

log = logging.getLogger("ratewarden.stores.memory")

_OVERFLOW = "\x00overflow:"
# While full, a sweep that reclaimed nothing waits this long before the next one: a flood of new
# keys on a table of live ones would otherwise pay a 64-entry sweep each (9x slower checks).
_FULL_SWEEP_PAUSE = 0.01


class _Entry:
    """One key's live state and when it expires; updated in place by each check, so a key already
    held costs no table write (only a new key is inserted)."""

    __slots__ = ("expires", "state")

    def __init__(self, expires: float, state: State) -> None:
        self.expires = expires
        self.state = state

    def renew(self, expires: float, state: State) -> None:
        """Take ``state``, living until ``expires``: a late clock reading never shortens a newer state's life."""
        if expires > self.expires:
            self.expires = expires
        self.state = state


@mypyc_attr(allow_interpreted_subclasses=True)
class MemoryStore(LocalStoreBase):
    """A bounded, lock-light, O(1)-per-check store living in this process.

    Args:
        max_keys: How many keys it holds; past that, expired keys are swept and new keys share one
            overflow state per limit (logged once).
        clock: Seconds since the epoch; replace it to test with a fake clock.
    """

    def __init__(self, max_keys: int = 1_000_000, clock: Callable[[], float] = time.time) -> None:
        if max_keys < 1:
            raise ConfigurationError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self.clock = clock
        self._data: OrderedDict[str, _Entry] = OrderedDict()
        self._overflow: dict[str, _Entry] = {}  # one shared state per limit, used only while full
        self._lock = threading.Lock()
        # Bound once: a check calls them with no method lookup (compiled, ~250 instructions less).
        self._acquire: Callable[[], object] = self._lock.acquire
        self._release: Callable[[], object] = self._lock.release
        self._overflow_logged = False
        self._sweep_after = 0.0  # while full: no sweep before then (the last one reclaimed nothing)
        self.overflowed = 0  # new keys charged to the shared overflow state

    def __len__(self) -> int:
        return len(self._data)

    def _sweep(self, count: int, now: float) -> None:
        """Inspect up to ``count`` oldest entries: delete expired ones, rotate live ones to the back."""
        data = self._data
        for _ in range(min(count, len(data))):
            head = next(iter(data))
            if data[head].expires <= now:
                del data[head]
            else:
                data.move_to_end(head)

    def _slot(self, key: str, limit: Limit, now: float, pending: int = 0) -> tuple[dict[str, _Entry], str]:
        """Where a new key's state goes: the table, or the shared overflow state when the table is
        full of live states (``pending`` counts new keys of this check not yet written)."""
        data = self._data
        if len(data) + pending < self.max_keys:
            return data, key
        if now >= self._sweep_after:
            held = len(data)
            self._sweep(64, now)
            if len(data) + pending < self.max_keys:
                return data, key
            if len(data) == held:  # all live: the next sweep waits, while new keys share the overflow
                self._sweep_after = now + _FULL_SWEEP_PAUSE
        self.overflowed += 1
        if not self._overflow_logged:
            self._overflow_logged = True
            log.warning(
                "memory store is full (%d live keys): new keys share an overflow allowance until "
                "entries expire; raise max_keys if this is legitimate traffic",
                self.max_keys,
            )
        return self._overflow, _OVERFLOW + limit.suffix

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        if len(keys) == 1:
            return self.hit_one(keys[0], limits[0], costs[0])
        now = self.clock()
        self._acquire()
        try:
            return self._hit_many(keys, limits, costs, now)
        finally:
            self._release()

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        """``hit_now`` of one key, with no lists or sequences to index.

        Args:
            key: The storage key.
            limit: The limit checked on it.
            cost: What the request costs.
        """
        now = self.clock()
        data = self._data
        # acquire/release rather than ``with``: half the cost compiled, and every request pays it.
        self._acquire()
        try:
            table: dict[str, _Entry] = data
            entry = data.get(key)
            if entry is None:
                table, key = self._slot(key, limit, now)
                entry = table.get(key)
            state = entry.state if entry is not None and entry.expires > now else None
            new_state, decision = limit.apply(state, now, cost)
            decision.policy = limit.name
            if new_state is not None:
                if entry is not None:
                    entry.renew(now + decision.reset_after, new_state)
                else:
                    if table is data:
                        self._sweep(2, now)
                    table[key] = _Entry(now + decision.reset_after, new_state)
            return decision
        finally:
            self._release()

    def _hit_many(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], now: float
    ) -> Decision:
        data = self._data
        results: list[tuple[dict[str, _Entry], str, _Entry | None, State | None, Decision]] = []
        allowed = True
        pending = 0
        for key, limit, cost in zip(keys, limits, costs, strict=True):
            table: dict[str, _Entry] = data
            entry = data.get(key)
            if entry is None:
                table, key = self._slot(key, limit, now, pending)
                entry = table.get(key)
                pending += table is data
            state = entry.state if entry is not None and entry.expires > now else None
            new_state, decision = limit.apply(state, now, cost)
            decision.policy = limit.name
            allowed = allowed and decision.allowed
            results.append((table, key, entry, new_state, decision))
        if allowed:
            for table, key, entry, new_state, decision in results:
                if new_state is None:
                    continue
                if entry is not None:
                    entry.renew(now + decision.reset_after, new_state)
                else:
                    table[key] = _Entry(now + decision.reset_after, new_state)
            if pending:  # after the writes: a sweep may drop an expired entry written above in place
                self._sweep(2, now)
        return combine([r[4] for r in results])

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Current decisions for a zero-cost request; charges nothing."""
        now = self.clock()
        out = []
        with self._lock:
            for key, limit in zip(keys, limits, strict=True):
                entry = self._data.get(key)
                state = entry.state if entry is not None and entry.expires > now else None
                _, decision = limit.fn(state, now, 0.0, limit.rate)
                decision.policy = limit.name
                out.append(decision)
        return out

    def reset_now(self, keys: Sequence[str]) -> None:
        """Synchronous ``reset``.

        Args:
            keys: The storage keys to forget.
        """
        with self._lock:
            for key in keys:
                self._data.pop(key, None)

    def clear_now(self) -> None:
        with self._lock:
            self._data.clear()
            self._overflow.clear()
            self.overflowed = 0

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.peek_now(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        self.reset_now(keys)

    async def clear(self) -> None:
        self.clear_now()

    def state_of(self, key: str) -> State | None:
        """The live state stored under ``key`` (for tests and stats).

        Args:
            key: A storage key.
        """
        now = self.clock()
        with self._lock:
            entry = self._data.get(key)
            return entry.state if entry is not None and entry.expires > now else None

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) without denying (``charges.adjusted_state``).

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units per key: positive charges, negative refunds.
        """

        now = self.clock()
        out = []
        data = self._data
        with self._lock:
            for key, limit, amount in zip(keys, limits, amounts, strict=True):
                entry = data.get(key)
                state = entry.state if entry is not None and entry.expires > now else None
                new_state, decision = adjusted_state(limit, state, now, amount)
                decision.policy = limit.name
                if new_state is None:
                    data.pop(key, None)
                elif new_state is state:
                    pass
                elif entry is not None:
                    entry.expires = now + decision.reset_after
                    entry.state = new_state
                elif len(data) < self.max_keys:
                    data[key] = _Entry(now + decision.reset_after, new_state)
                out.append(decision)
        return out

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.adjust_now(keys, limits, amounts)
