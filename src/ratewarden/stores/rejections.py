"""A local cache of rejections: a key over its limit costs no round trip until its retry time.

Only denials answer from the cache (it never allows what the store would deny), per storage key and
cost (another cost may have another retry time). An entry holds until ``until`` (the store's clock:
``now + retry_after`` of the denial that made it), and the store forgets a key whenever it writes it.

An entry may carry the key's state and limit as the store last read them (stores that run the
pure algorithms locally, such as ``MemcachedStore``): the decision is then the algorithm's answer
for that state now, exactly what a round trip would give while no other process changes the key.
Without a state (stores whose server runs the algorithm, such as ``RedisStore``), it is the
remembered denial with its times moved on. Such a cache may also remember keys that allowed, as
part of a denied multi-key check: a multi-key check answers from the cache only when every one of
its keys has an entry (``partial=False``), so its answer is the same combination the store gives;
with ``partial=True`` (remembered denials only) it answers with the cached denials of its keys.
``Denials`` is the plain form ``RedisStore`` keeps: one remembered denial per key.

Both are shared by the event loop and the threads of the synchronous path (``hit_blocking``):
reads take no lock (each is one ``dict.get`` of an immutable entry: atomic under the GIL and in
free-threaded builds alike), so a lookup costs what it did; every write (remember, drop an expired
entry, forget, clear, ``counted``) takes ``lock``. A store counts the event loop's cached answers
itself, lock-free (only the loop writes that count), and the threads' in ``thread_hits``. An expired entry is dropped only if it is still the
one read (never a fresher one a thread put meanwhile). ``invalidate`` (adjust, reset) moves
``epoch`` on: a denial read before it (``remember(..., epoch=...)`` with the epoch taken before
its round trip) is not remembered after it, so a cache never outlives a reset it raced with.
A clock reading older than a remembered denial (a late reading, or a clock stepped back) is never
answered from it: the store decides, by the algorithms' rules (``algorithms.base.STEP_BACK``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from ..algorithms import State
from ..decision import Decision
from ..limits import Limit
from .base import combine

__all__ = ["CACHE_MAX", "STATE_MAX", "Denials", "RejectionCache"]

CACHE_MAX = 100_000  # entries at most; expired ones are pruned first when full, then all
STATE_MAX = 32  # floats of state kept at most (a long sliding log is remembered as its decision)


class _Entry:
    __slots__ = ("cost", "decision", "denied", "limit", "state", "until")

    def __init__(
        self, until: float, cost: float, decision: Decision, state: State | None, limit: Limit | None
    ) -> None:
        self.until = until
        self.cost = cost
        self.decision = decision
        self.denied = not decision.allowed
        self.state = state
        self.limit = limit


class RejectionCache:
    """Rejections known to hold, by storage key and cost (see the module docstring).

    Args:
        partial: A multi-key check may answer from its keys' cached denials alone.
        max_entries: Entries kept at most.
    """

    def __init__(self, *, partial: bool = False, max_entries: int = CACHE_MAX) -> None:
        self._entries: dict[str, _Entry] = {}
        self.partial = partial
        self.max_entries = max_entries
        self.lock = threading.Lock()  # every write (see the module docstring)
        self.epoch = 0  # invalidations so far
        self.thread_hits = 0  # checks of hit_blocking's threads answered from the cache

    def __len__(self) -> int:
        return len(self._entries)

    def remember(
        self,
        key: str,
        cost: float,
        until: float,
        decision: Decision,
        state: State | None = None,
        limit: Limit | None = None,
        now: float = 0.0,
        epoch: int | None = None,
    ) -> None:
        """Remember ``key``'s ``decision`` for ``cost`` until ``until``, with the state and limit it
        was computed from (a state longer than ``STATE_MAX`` is dropped; an allowing entry then is
        not kept: it could not be recomputed); not if ``epoch`` (read before the round trip) is
        no longer the cache's: an invalidation came since."""
        if state is not None and len(state) > STATE_MAX:
            state = None
        if state is None or limit is None:
            if decision.allowed:
                return
            state, limit = None, None
        entry = _Entry(until, cost, decision, state, limit)
        entries = self._entries
        with self.lock:
            if epoch is not None and epoch != self.epoch:
                return
            if len(entries) >= self.max_entries and key not in entries:
                _prune(entries, now, self.max_entries)
            entries[key] = entry

    def lookup(self, keys: Sequence[str], costs: Sequence[float], now: float) -> Decision | None:
        """The denial a check of ``keys`` with ``costs`` gets at ``now``, if the cache knows it."""
        entries = self._entries
        decisions: list[Decision] = []
        missing = False
        denied = False
        for key, cost in zip(keys, costs, strict=False):
            entry = entries.get(key)
            if entry is None:
                missing = True
                continue
            if now >= entry.until:
                self._drop(key, entry)
                missing = True
                continue
            if cost != entry.cost:
                missing = True
                continue
            decision = _decision_at(entry, now)
            if decision is None:  # no longer denied (a float's rounding at the edge)
                self._drop(key, entry)
                missing = True
                continue
            denied = denied or not decision.allowed
            decisions.append(decision)
        if not denied or (missing and not self.partial):
            return None
        return combine(decisions)

    def counted(self) -> None:
        """Count a thread's check answered from the cache."""
        with self.lock:
            self.thread_hits += 1

    def _drop(self, key: str, entry: _Entry) -> None:
        with self.lock:
            if self._entries.get(key) is entry:
                del self._entries[key]

    def forget(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` (their state was just written: a fresher reading follows)."""
        entries = self._entries
        if entries:
            with self.lock:
                for key in keys:
                    entries.pop(key, None)

    def invalidate(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` after an adjust or a reset: denials read before it are not remembered."""
        with self.lock:
            self.epoch += 1
            for key in keys:
                self._entries.pop(key, None)

    def clear(self) -> None:
        with self.lock:
            self.epoch += 1
            self._entries.clear()


class Denials:
    """Remembered denials by storage key, for a store whose server runs the algorithm
    (``RedisStore``): ``entries[key] = (until, cost, decision)`` (see the module docstring).

    Args:
        max_entries: Entries kept at most.
    """

    __slots__ = ("entries", "epoch", "lock", "max_entries", "thread_hits")

    def __init__(self, max_entries: int = CACHE_MAX) -> None:
        self.entries: dict[str, tuple[float, float, Decision]] = {}
        self.lock = threading.Lock()  # every write
        self.epoch = 0  # invalidations so far
        self.max_entries = max_entries
        self.thread_hits = 0  # checks of hit_blocking's threads answered from the cache

    def lookup(self, keys: Sequence[str], costs: Sequence[float], now: float) -> Decision | None:
        """The remembered denial of the first of ``keys`` known to deny its cost at ``now``."""
        entries = self.entries
        for key, cost in zip(keys, costs, strict=False):
            entry = entries.get(key)
            if entry is None:
                continue
            until, cached_cost, d = entry
            if now >= until or until - now > d.retry_after:  # expired, or a reading older than the denial
                with self.lock:
                    if entries.get(key) is entry:
                        del entries[key]
            elif cost == cached_cost:  # another cost may have another retry time
                left = until - now
                return Decision(
                    False, d.limit, d.remaining, max(0.0, d.reset_after - (d.retry_after - left)), left,
                    d.period, d.policy,
                )
        return None

    def counted(self) -> None:
        """Count a thread's check answered from the cache."""
        with self.lock:
            self.thread_hits += 1

    def remember(self, key: str, cost: float, until: float, decision: Decision, epoch: int, now: float) -> None:
        """Remember ``key``'s denial for ``cost`` until ``until``, unless an invalidation came
        since ``epoch`` was read (before the round trip that denied)."""
        entry = (until, cost, decision)
        entries = self.entries
        with self.lock:
            if epoch != self.epoch:
                return
            if len(entries) >= self.max_entries and key not in entries:
                _prune(entries, now, self.max_entries)
            entries[key] = entry

    def invalidate(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` after an adjust or a reset: denials read before it are not remembered."""
        with self.lock:
            self.epoch += 1
            for key in keys:
                self.entries.pop(key, None)

    def clear(self) -> None:
        with self.lock:
            self.epoch += 1
            self.entries.clear()


def _prune(entries: dict[str, _Entry] | dict[str, tuple[float, float, Decision]], now: float, most: int) -> None:
    """Drop expired entries (the caller holds the lock); all of them if still full."""
    for key in [k for k, e in entries.items() if (e.until if isinstance(e, _Entry) else e[0]) <= now]:
        del entries[key]
    if len(entries) >= most:
        entries.clear()


def _decision_at(entry: _Entry, now: float) -> Decision | None:
    """The entry's decision at ``now``: recomputed from its state, or its denial moved on in time;
    ``None`` for a denied entry that no longer denies."""
    limit = entry.limit
    state = entry.state
    if limit is not None and state is not None:
        _, decision = limit.fn(state, now, entry.cost, limit.rate)
        decision.policy = limit.name
        if entry.denied and decision.allowed:
            return None
        return decision
    d = entry.decision
    left = entry.until - now
    if left > d.retry_after:  # a reading older than the denial (late, or the clock stepped back): the store decides
        return None
    return Decision(
        False, d.limit, d.remaining, max(0.0, d.reset_after - (d.retry_after - left)), left, d.period, d.policy
    )
