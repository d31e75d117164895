"""What a limiter's insurance limiter needs from a remote store, kept per process by the store
(``RedisStore.ledger``, ``MemcachedStore.ledger``): the last answer the store gave for each key,
so an outage starts from what was left instead of from zero, and what the insurance limiter
admitted meanwhile, charged to the store (``adjust``) ahead of the next check, which fails
with the charge-back's error if the store fails it. A call the store failed that changed it all
the same (its reply came after its caller gave up) is given back the same way (``credit``), so
the request it was for counts once. Both are bounded in entries, whatever the
clients send: a flood of keys pushes out the least recently answered seeds one at a time, and a
seed pushed out before its window ends counts as nothing left (``Seeds``).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from ..caches import size_of
from ..decision import Decision
from ..errors import StoreError
from ..limits import Limit
from ..steps import Adjust, Machine, drive_blocking, driven
from .base import Store

__all__ = ["ANSWERS", "OWED", "Ledger", "Seeds"]

#: Keys whose last answer a store keeps (``Seeds``), and the bytes of one key and answer at most:
#: room for the longest ASCII storage keys (a client key of ``MAX_KEY_LENGTH``); a larger one is marked instead.
ANSWERS = 16_384
ENTRY_BYTES = 512
ANSWER_BYTES = ANSWERS * ENTRY_BYTES
#: A storage key's bytes at most (``sys.getsizeof``): the rest of ``ENTRY_BYTES`` is its answer's (remaining below 2**60).
KEY_BYTES = ENTRY_BYTES - size_of((1 << 60, 0.0))
#: Of those, keys answered again while kept: keys answered once cannot push them out.
PROTECTED = ANSWERS * 3 // 4
#: Slots of the marks seeds pushed out before their window ended leave (when the latest such window
#: ends, and the least any of them had left: 16 bytes a slot), made at the first.
MARKS = 1 << 16
MARK_BYTES = MARKS * 16
#: Keys whose local admissions wait to be charged back; beyond, new keys' are not kept (``dropped``).
OWED = 16_384

#: A net amount owed this close to zero is nothing (costs are floats: a charge and its credit cancel).
_NOTHING = 1e-9

Seed = tuple[int, float]
"""What the store said was left for a key, and the monotonic time its window ends."""


class Seeds:
    """The store's last answer per key, at most ``ANSWERS`` keys of at most ``ENTRY_BYTES`` each.

    A key answered once waits in probation; answered again while kept, it moves to the protected
    part (at most ``PROTECTED``; beyond, the least recently answered there goes back to probation).
    A new key pushes out probation's least recently answered one, so keys answered once, however
    many, never push out a protected one. A seed pushed out (or too large to keep) while its
    window runs leaves a mark instead, in the slot its key hashes to (one of ``MARKS``): the latest
    end of such windows, and the least any of them had left. A key without a seed whose slot's mark
    still runs is taken as having that least left, which is at most its own: marks can only lower
    what an outage admits, never raise it (a key sharing the slot is lowered with it).
    """

    def __init__(self) -> None:
        self._probation: OrderedDict[str, Seed] = OrderedDict()
        self._protected: OrderedDict[str, Seed] = OrderedDict()
        self._marks: array[float] | None = None
        self._least: array[int] | None = None
        #: Live seeds pushed out or not kept since the last ``clear``: each left a mark.
        self.marked = 0
        self._lock = threading.Lock()  # ``note`` runs on the event loop and in the blocking clients' threads

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def note(self, key: str, remaining: int, ends: float, now: float) -> None:
        """The store said ``remaining`` was left for ``key`` until ``ends`` (monotonic, as ``now``).

        Args:
            key: The storage key.
            remaining: What was left.
            ends: When its window ends.
            now: Monotonic seconds.
        """
        seed = (remaining, ends)
        with self._lock:
            protected = self._protected
            if key in protected:
                protected[key] = seed
                protected.move_to_end(key)
                return
            probation = self._probation
            if probation.pop(key, None) is not None:
                protected[key] = seed
                if len(protected) > PROTECTED:
                    demoted, kept = protected.popitem(last=False)
                    probation[demoted] = kept
                return
            if sys.getsizeof(key) > KEY_BYTES:
                self._mark(key, seed, now)
                return
            if len(probation) + len(protected) >= ANSWERS:
                evicted, pushed = (probation or protected).popitem(last=False)
                self._mark(evicted, pushed, now)
            probation[key] = seed

    def _mark(self, key: str, seed: Seed, now: float) -> None:
        """``key``'s seed is gone while its window runs: its slot keeps the latest end of the
        windows marked there and the least they had left, until that end."""
        remaining, ends = seed
        if ends <= now:
            return
        marks, least = self._marks, self._least
        if marks is None or least is None:
            marks = self._marks = array("d", bytes(MARKS * 8))
            least = self._least = array("q", bytes(MARKS * 8))
        slot = hash(key) & (MARKS - 1)
        if marks[slot] <= now or remaining < least[slot]:  # or the slot's earlier marks have all ended
            least[slot] = remaining
        if marks[slot] < ends:
            marks[slot] = ends
        self.marked += 1

    def take(self, key: str, now: float, marked: bool = True) -> int | None:
        """What was left for ``key`` if its window still runs at ``now``, the seed removed; without
        a seed, the least left of the seeds marked in its slot while their windows run (unless not
        ``marked``); ``None``: nothing known (the whole limit).

        Args:
            key: The storage key.
            now: Monotonic seconds.
            marked: Whether a key without a seed takes its slot's mark.
        """
        with self._lock:
            seed = self._protected.pop(key, None)
            if seed is None:
                seed = self._probation.pop(key, None)
            if seed is None:
                marks, least = self._marks, self._least
                if not marked or marks is None or least is None:
                    return None
                slot = hash(key) & (MARKS - 1)
                return least[slot] if marks[slot] > now else None
        return seed[0] if seed[1] > now else None

    def forget(self, key: str) -> None:
        """Drop ``key``'s seed (its mark stays: it is shared, and only ever lowers).

        Args:
            key: The storage key.
        """
        with self._lock:
            self._protected.pop(key, None)
            self._probation.pop(key, None)

    def clear(self) -> None:
        """Drop every seed and mark (every key was reset)."""
        with self._lock:
            self._protected.clear()
            self._probation.clear()
            self._marks = self._least = None
            self.marked = 0

    def mark_bytes(self) -> int:
        """The bytes the marks take: 0 until a live seed is first pushed out, then ``MARK_BYTES``."""
        marks, least = self._marks, self._least
        if marks is None or least is None:
            return 0
        return marks.itemsize * len(marks) + least.itemsize * len(least)


class Ledger:
    """The last answers of a store, and the charges it owes (see the module docstring)."""

    def __init__(self) -> None:
        #: key -> (remaining, monotonic time its window ends) at the store's last answer.
        self.answers = Seeds()
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
        self.answers.note(key, decision.remaining, now + decision.reset_after, now)

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

    def last_remaining(self, key: str, now: float, marked: bool = True) -> int | None:
        """What the store said was left for ``key``, if it said so in the window still running at
        ``now`` (monotonic); taken: there is one again once the store answers for the key again.
        Its slot's mark when its seed was pushed out while its window may still run (``Seeds``),
        unless not ``marked``.

        Args:
            key: The storage key.
            now: Monotonic seconds.
            marked: Whether a key without a seed takes its slot's mark.
        """
        return self.answers.take(key, now, marked)

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

    def credit(
        self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float], counting: Sequence[float]
    ) -> None:
        """A call the store failed changed it all the same (a check that charged ``amounts``, an
        adjust that applied them: their replies came after their callers gave up, who went on as
        if they had not): they are given back, netted with what is owed (the insurance limiter's
        charge for that same request cancels out), while the change counts (a window over, it
        counted in that window only).

        Args:
            keys: The call's storage keys.
            limits: The limit on each key.
            amounts: What the call charged each key (an adjust's negative amount gave units back).
            counting: Seconds from now each key's change counts for (its ``reset_after``).
        """
        now = time.monotonic()
        with self._lock:
            owed = self.owed
            for key, limit, amount, lasts in zip(keys, limits, amounts, counting, strict=False):
                if amount == 0 or lasts <= 0:
                    continue
                until = now + lasts
                found = owed.get(key)
                if found is not None and found[2] > now:
                    owed[key] = (limit, found[1] - amount, max(found[2], until))
                elif found is not None or len(owed) < OWED:
                    owed[key] = (limit, -amount, until)

    def take(self) -> tuple[list[str], list[Limit], list[float], list[float]]:
        """Every charge still owed (keys, limits, amounts, until), the ledger emptied of them;
        charges whose window has ended are dropped (they counted in a window now over), and so are
        those a credit cancelled."""
        now = time.monotonic()
        with self._lock:
            owed, self.owed = self.owed, {}
        keys: list[str] = []
        limits: list[Limit] = []
        amounts: list[float] = []
        untils: list[float] = []
        for key, (limit, amount, until) in owed.items():
            if until > now and abs(amount) > _NOTHING:
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

    def settle_steps(self, store: Store) -> Machine[StoreError | None]:
        """Charge ``store`` what is owed (one adjust), ahead of the check that calls it, so that
        check counts the charges, as a step machine (``ratewarden.steps``); if it fails, they stay
        owed and its error is the result (the check then fails with it: one timeout, not two, while
        the store is still down).

        Args:
            store: The store to charge.
        """
        keys, limits, amounts, untils = self.take()
        if not keys:
            return None
        try:
            yield Adjust(store, keys, limits, amounts)
        except StoreError as exc:
            self.owe_again(keys, limits, amounts, untils)
            return exc
        return None

    async def settle(self, store: Store) -> StoreError | None:
        """``settle_steps``, awaited.

        Args:
            store: The store to charge.
        """
        return await driven(self.settle_steps(store))

    def settle_blocking(self, store: Store) -> StoreError | None:
        """``settle_steps`` from synchronous code (``adjust_blocking``).

        Args:
            store: The store to charge.
        """
        return drive_blocking(self.settle_steps(store))

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
                self.answers.forget(key)
                self.owed.pop(key, None)
