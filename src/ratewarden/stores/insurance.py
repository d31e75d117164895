"""What a limiter's insurance limiter needs from a remote store, kept per process by the store
(``RedisStore.ledger``, ``MemcachedStore.ledger``): the last answer the store gave for each key,
so an outage starts from what was left instead of from zero, and what the insurance limiter
admitted meanwhile, charged to the store (``adjust``) ahead of the next check, which fails
with the charge-back's error if the store fails it. Both are bounded in entries, whatever the clients send.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from ..caches import remember
from ..decision import Decision
from ..errors import StoreError
from ..limits import Limit
from .base import Store

__all__ = ["ANSWERS", "OWED", "Ledger"]

#: Keys whose last answer a store keeps (emptied whole when full, as every lookup cache), and their
#: bytes at most: room for the longest storage keys (a client key of ``MAX_KEY_LENGTH``).
ANSWERS = 16_384
ANSWER_BYTES = ANSWERS * 512
#: Keys whose local admissions wait to be charged back; beyond, new keys' are not kept (``dropped``).
OWED = 16_384


class Ledger:
    """The last answers of a store, and the charges it owes (see the module docstring)."""

    def __init__(self) -> None:
        #: key -> (remaining, monotonic time its window ends) at the store's last answer.
        self.answers: dict[str, tuple[int, float]] = {}
        #: key -> (limit, units admitted locally, monotonic time they stop counting).
        self.owed: dict[str, tuple[Limit, float, float]] = {}
        #: Monotonic time of the store's last answer (``-inf``: none yet).
        self.answered_at = -math.inf
        #: Units admitted locally that could not be charged back (the ledger was full).
        self.dropped = 0.0
        self._lock = threading.Lock()  # ``owe`` and ``take`` run on the event loop and in threads

    def note(self, key: str, decision: Decision) -> None:
        """The store answered ``decision`` for ``key`` (the limit that decided its check).

        Args:
            key: The deciding storage key.
            decision: The store's answer.
        """
        now = time.monotonic()
        self.answered_at = now
        remember(self.answers, key, (decision.remaining, now + decision.reset_after), ANSWERS, ANSWER_BYTES)

    def note_check(self, keys: Sequence[str], limits: Sequence[Limit], decision: Decision) -> None:
        """The store answered ``decision`` for a check of ``keys``: noted for the key whose limit
        decided it (a store that does not say which: the first limit it matches).

        Args:
            keys: The check's storage keys.
            limits: The limit checked on each key.
            decision: The store's answer.
        """
        if len(keys) == 1:
            self.note(keys[0], decision)
            return
        for key, limit in zip(keys, limits, strict=False):
            if limit.name == decision.policy and limit.rate.limit == decision.limit and limit.rate.period == decision.period:
                self.note(key, decision)
                return
        self.answered_at = time.monotonic()

    def last_remaining(self, key: str, now: float) -> int | None:
        """What the store said was left for ``key``, if it said so in the window still running at
        ``now`` (monotonic); taken: an outage seeds each key once.

        Args:
            key: The storage key.
            now: Monotonic seconds.
        """
        found = self.answers.pop(key, None)
        if found is None or found[1] <= now:
            return None
        return found[0]

    def owe(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], decision: Decision) -> None:
        """The insurance limiter admitted a check the store failed: its costs are owed to the store.

        Args:
            keys: The check's storage keys.
            limits: The limit checked on each key.
            costs: What it cost under each limit.
            decision: The insurance limiter's answer (its ``reset_after`` bounds how long a single
                key's charge counts; a check of several limits keeps each for its period).
        """
        now = time.monotonic()
        single = len(keys) == 1
        with self._lock:
            owed = self.owed
            for key, limit, cost in zip(keys, limits, costs, strict=False):
                if cost <= 0:
                    continue
                until = now + (decision.reset_after if single else limit.rate.period)
                found = owed.get(key)
                if found is not None and found[2] > now:
                    owed[key] = (limit, found[1] + cost, max(found[2], until))
                elif found is not None or len(owed) < OWED:
                    owed[key] = (limit, cost, until)
                else:
                    self.dropped += cost

    def take(self) -> tuple[list[str], list[Limit], list[float], list[float]]:
        """Every charge still owed (keys, limits, amounts, until), the ledger emptied of them;
        charges whose window has ended are dropped (they counted in a window now over)."""
        now = time.monotonic()
        with self._lock:
            owed, self.owed = self.owed, {}
        keys: list[str] = []
        limits: list[Limit] = []
        amounts: list[float] = []
        untils: list[float] = []
        for key, (limit, amount, until) in owed.items():
            if until > now:
                keys.append(key)
                limits.append(limit)
                amounts.append(amount)
                untils.append(until)
        return keys, limits, amounts, untils

    def owe_again(self, keys: list[str], limits: list[Limit], amounts: list[float], untils: list[float]) -> None:
        """Charges the store could not take (it failed again): owed still.

        Args:
            keys: What ``take`` returned.
            limits: Their limits.
            amounts: Their amounts.
            untils: Until when each counts.
        """
        with self._lock:
            owed = self.owed
            for key, limit, amount, until in zip(keys, limits, amounts, untils, strict=True):
                found = owed.get(key)
                if found is not None:
                    owed[key] = (limit, found[1] + amount, max(found[2], until))
                elif len(owed) < OWED:
                    owed[key] = (limit, amount, until)
                else:
                    self.dropped += amount

    async def settle(self, store: Store) -> StoreError | None:
        """Charge ``store`` what is owed (one ``adjust``), ahead of the check that calls it, so that
        check counts the charges; if it fails, they stay owed and its error is returned (the check
        then fails with it: one timeout, not two, while the store is still down).

        Args:
            store: The store to charge.
        """
        keys, limits, amounts, untils = self.take()
        if not keys:
            return None
        try:
            await store.adjust(keys, limits, amounts)
        except StoreError as exc:
            self.owe_again(keys, limits, amounts, untils)
            return exc
        return None

    def settle_blocking(self, store: Store) -> StoreError | None:
        """``settle`` from synchronous code (``adjust_blocking``).

        Args:
            store: The store to charge.
        """
        keys, limits, amounts, untils = self.take()
        if not keys:
            return None
        try:
            store.adjust_blocking(keys, limits, amounts)
        except StoreError as exc:
            self.owe_again(keys, limits, amounts, untils)
            return exc
        return None

    def forget(self, keys: Sequence[str] | None = None) -> None:
        """Drop the answers and charges of ``keys`` (every key's: ``None``), as a reset does.

        Args:
            keys: The storage keys reset, or ``None`` for all.
        """
        with self._lock:
            if keys is None:
                self.answers.clear()
                self.owed.clear()
                return
            for key in keys:
                self.answers.pop(key, None)
                self.owed.pop(key, None)
