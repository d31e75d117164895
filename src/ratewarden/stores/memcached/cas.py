"""Checks of several keys and ``adjust``: read, compute, compare and swap, retried on a lost race.

* A multi-key check reads every key with one ``gets`` and, only if all allow, writes each new
  state with ``cas`` (``add`` for a new key); if a later key loses its race, the keys already
  written are put back (compare and swap again; in a task of its own, as an interrupted
  check's, so a cancellation cannot stop it halfway) before the retry, so a check stays all or
  nothing. It holds its keys' local locks (in a fixed order), as ``adjust`` does.
* ``adjust`` (refunds and penalties) uses the same loop, one key at a time; a state whose whole
  limit is available again is written as the algorithm's "nothing used" state (memcached has no
  compare-and-delete), which reads the same as no key.
* A lost race is retried after a jittered backoff (``backoff``), at most ``retries`` times.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator, Sequence

from ...algorithms import State
from ...charges import adjusted_state
from ...decision import Decision
from ...limits import Limit
from ..base import StoreError, combine
from ..rejections import RejectionCache
from .encoding import decode, encode, expiry
from .protocol import Read, stored, values_reader, write_command
from .putbacks import PutBacks, Undo

__all__ = ["CasChecks", "adjusted_write", "backoff", "evaluate", "peek_decisions", "writes"]

BACKOFF = 0.0005  # seconds: the first CAS-conflict backoff's upper bound, doubled per conflict
BACKOFF_MAX = 0.02


def backoff(attempt: int) -> float:
    """Seconds to wait after the ``attempt``-th lost compare-and-swap race (jittered)."""
    return random.uniform(0.0, min(BACKOFF_MAX, BACKOFF * 2.0**attempt))


def peek_decisions(values: Sequence[bytes | None], limits: Sequence[Limit], now: float) -> list[Decision]:
    """Each limit's decision for a zero-cost request on its key's stored value (``None``: no key).

    Args:
        values: Each key's stored value, as read.
        limits: The limit of each key.
        now: The time to read the states at (``MemcachedStore.clock``).
    """
    out = [limit.fn(decode(v) if v is not None else None, now, 0.0, limit.rate)[1] for v, limit in zip(values, limits, strict=False)]
    for decision, limit in zip(out, limits, strict=False):
        decision.policy = limit.name
    return out


def adjusted_write(
    limit: Limit, value: bytes | None, token: int | None, now: float, amount: float
) -> tuple[bytes | None, float, Decision]:
    """What ``adjust`` writes on a key read as ``(value, token)``: ``(data, seconds, decision)``; ``data``
    is ``None`` when nothing changes. A whole limit available again is written as the algorithm's
    "nothing used" state (memcached has no compare-and-delete), which reads as no key.

    Args:
        limit: The key's limit.
        value: Its stored value (``None``: no key).
        token: Its CAS token (``None``: no key).
        now: The time (``MemcachedStore.clock``).
        amount: Units to charge; negative refunds.
    """
    state = decode(value) if value is not None else None
    new_state, decision = adjusted_state(limit, state, now, amount)
    decision.policy = limit.name
    if new_state is state or (new_state is None and token is None):
        return None, 0.0, decision  # nothing changes
    ttl = decision.reset_after
    if new_state is None:
        new_state, empty = limit.fn(None, now, 0.0, limit.rate)
        assert new_state is not None  # a zero-cost request is always allowed
        ttl = empty.reset_after
    return encode(new_state), ttl, decision


def evaluate(
    read: Sequence[Read], limits: Sequence[Limit], costs: Sequence[float], now: float
) -> tuple[list[Decision], list[State | None], list[State | None]]:
    """A multi-key check's step between its read and its writes: each limit's algorithm on its
    key's state as read, charging its cost at ``now``. Returns the decisions, the states read
    (``None``: no key) and the states to write (``None``: nothing to write).

    Args:
        read: Each key's ``(value, token)``, as read.
        limits: The limit of each key.
        costs: What the request costs under each limit.
        now: The time to check at (``MemcachedStore.clock``).
    """
    decisions: list[Decision] = []
    befores: list[State | None] = []
    states: list[State | None] = []
    for (value, _token), limit, cost in zip(read, limits, costs, strict=False):
        state = decode(value) if value is not None else None
        new_state, decision = limit.fn(state, now, cost, limit.rate)
        decision.policy = limit.name
        decisions.append(decision)
        befores.append(state)
        states.append(new_state)
    return decisions, befores, states


def writes(
    mkeys: Sequence[bytes], read: Sequence[Read], states: Sequence[State | None], decisions: Sequence[Decision],
    limits: Sequence[Limit],
) -> Iterator[tuple[Undo, int | None, int]]:
    """The writes of an allowed multi-key check, key by key (those with a state to write): what
    puts it back (``Undo``: key, value read, data to write, limit), the key's CAS token (``None``:
    ``add``) and the expiry to write it with (from one wall-clock reading, at the first write).

    Args:
        mkeys: The memcached keys.
        read: Each key's ``(value, token)``, as read.
        states: Each key's new state (``evaluate``; ``None``: nothing to write).
        decisions: Each key's decision (its ``reset_after`` sets the expiry).
        limits: The limit of each key.
    """
    wall = time.time()
    for i, mkey in enumerate(mkeys):
        new_state = states[i]
        if new_state is None:
            continue
        value, token = read[i]
        yield (mkey, value, encode(new_state), limits[i]), token, expiry(decisions[i].reset_after, wall)


class CasChecks(PutBacks):
    """The compare-and-swap loops of multi-key checks and of ``adjust``."""

    retries: int
    cache_rejections: bool
    cas_conflicts: int  # lost compare-and-swap races (retried)
    _rejections: RejectionCache

    async def _read_all(self, mkeys: list[bytes]) -> list[Read]:
        """Every key's (value, token), in one ``gets``."""
        unique = list(dict.fromkeys(mkeys))
        found = dict(zip(unique, await self._command(b"gets " + b" ".join(unique) + b"\r\n", values_reader(unique)), strict=True))
        return [found[k] for k in mkeys]

    async def _cas_hit(
        self, keys: Sequence[str], mkeys: list[bytes], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        for attempt in range(self.retries):
            read = await self._read_all(mkeys)
            now = self.clock()
            decisions, befores, states = evaluate(read, limits, costs, now)
            if not all(d.allowed for d in decisions):
                decided = combine(decisions)
                if self.cache_rejections and 0 < decided.retry_after < math.inf:
                    until = now + decided.retry_after
                    for i, key in enumerate(keys):
                        self._rejections.remember(key, costs[i], until, decisions[i], befores[i], limits[i], now)
                return decided
            self._rejections.forget(keys)
            written: list[Undo] = []
            for undo, token, exptime in writes(mkeys, read, states, decisions, limits):
                mkey, _, data, _ = undo
                payload = write_command(mkey, data, token, exptime)
                written.append(undo)
                if not await self._write(payload, written, None):
                    self.cas_conflicts += 1
                    written.pop()
                    if written:  # put back in the background, as an interrupted check's, holding the keys
                        await self._put_back_unsent(written, None)
                    await asyncio.sleep(backoff(attempt))
                    break
            else:
                return combine(decisions)
        raise StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts")

    async def _cas_adjust(
        self, mkeys: list[bytes], limits: Sequence[Limit], amounts: Sequence[float]
    ) -> list[Decision]:
        out: list[Decision] = []
        for key, limit, amount in zip(mkeys, limits, amounts, strict=True):
            for attempt in range(self.retries):
                ((value, token),) = await self._command(b"gets " + key + b"\r\n", values_reader((key,)))
                data, ttl, decision = adjusted_write(limit, value, token, self.clock(), amount)
                if data is None:
                    break  # nothing changes
                if await self._command(write_command(key, data, token, expiry(ttl, time.time())), stored):
                    break
                self.cas_conflicts += 1
                await asyncio.sleep(backoff(attempt))
            else:
                raise StoreError(f"{self!r}: adjust: gave up after {self.retries} compare-and-swap conflicts")
            out.append(decision)
        return out
