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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..algorithms import State
from ..decision import Decision
from ..limits import Limit
from .base import combine

__all__ = ["CACHE_MAX", "STATE_MAX", "RejectionCache"]

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
        self.hits = 0  # checks answered from the cache

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
    ) -> None:
        """Remember ``key``'s ``decision`` for ``cost`` until ``until``, with the state and limit it
        was computed from (a state longer than ``STATE_MAX`` is dropped; an allowing entry then is
        not kept: it could not be recomputed)."""
        if state is not None and len(state) > STATE_MAX:
            state = None
        if state is None or limit is None:
            if decision.allowed:
                return
            state, limit = None, None
        entries = self._entries
        if len(entries) >= self.max_entries and key not in entries:
            self._prune(now)
        entries[key] = _Entry(until, cost, decision, state, limit)

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
                del entries[key]
                missing = True
                continue
            if cost != entry.cost:
                missing = True
                continue
            decision = _decision_at(entry, now)
            if decision is None:  # no longer denied (a float's rounding at the edge)
                del entries[key]
                missing = True
                continue
            denied = denied or not decision.allowed
            decisions.append(decision)
        if not denied or (missing and not self.partial):
            return None
        self.hits += 1
        return combine(decisions)

    def forget(self, keys: Iterable[str]) -> None:
        entries = self._entries
        if entries:
            for key in keys:
                entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def _prune(self, now: float) -> None:
        entries = self._entries
        for key in [k for k, e in entries.items() if e.until <= now]:
            del entries[key]
        if len(entries) >= self.max_entries:
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
    return Decision(
        False, d.limit, d.remaining, max(0.0, d.reset_after - (d.retry_after - left)), left, d.period, d.policy
    )
