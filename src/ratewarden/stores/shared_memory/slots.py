"""One key of a check: its place in the table (``Slot``), loading its live state (a key whose
writer died counts as fully used), storing its new state, and charging a key that finds its
region full to the shared overflow state of its limit instead (never evicting a live counter);
and a check of several keys, all or nothing.

Every function here runs with the keys' regions locked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from ..._mypyc import mypyc_attr
from ...algorithms import State
from ...charges import adjusted_state
from ...decision import Decision
from ...limits import Limit
from .layout import (
    BODY_HEAD,
    CLEAN,
    E_BODY,
    E_DIGEST,
    E_FLOATS,
    F64,
    R_NEXT_EXPIRY,
    U32,
    WRITING,
    Region,
    hold_of,
)
from .locks import lock as lock_region
from .locks import unlock as unlock_region
from .segment import Segment
from .table import FIELDS, corrupt, count, entry, find, has_room, insert, later, read, settle, sweep, write

_body_head_from: Final = BODY_HEAD.unpack_from
_u32_from: Final = U32.unpack_from
_f64_from: Final = F64.unpack_from


@mypyc_attr(allow_interpreted_subclasses=True)
class Slot:
    """One key of a check: where its state lives and what the algorithm made of it."""

    __slots__ = ("digest", "home", "new", "region", "state")

    def __init__(self, digest: bytes, home: int, region: Region) -> None:
        self.digest = digest
        self.home = home
        self.region = region
        self.state: State | None = None
        self.new = False


def load(seg: Segment, slot: Slot, limit: Limit, now: float) -> int:
    """Read ``slot``'s live state; returns its entry offset, or -1 if absent."""
    region = slot.region
    pos = find(seg, region, slot.digest, slot.home)
    if pos < 0:
        return -1
    off = entry(seg, region, pos)
    if settle(seg, off, now):
        # Its writer died mid-write: the key counts as fully used from now on.

        state, decision = adjusted_state(limit, None, now, float(limit.rate.capacity))
        write(seg, region, off, now + decision.reset_after, state or ())
    expires, state = read(seg, off)
    slot.state = state if expires > now else None
    return off


def charge_one(
    seg: Segment, digest: bytes, home: int, region: Region, limit: Limit, cost: float, now: float
) -> Decision | None:
    """The one-key check, its region locked: the key's decision, its new state stored (a new key
    sweeps its region a little first); None when the key is new and its region full (its limit's
    overflow allowance is then charged instead: ``charge_overflow``)."""
    # The one inlined copy of find/read/write (table.py), for a clean entry found: calling them
    # (and load's Slot, settle, later) made a hot-key check ~1.1 µs slower in the interpreter
    # (2.1 -> 3.3 µs, ctypes mutex), ~55 % (measured). The write keeps table.write's
    # next_expiry bound, through the same FIELDS writer (its read costs ~0.09 µs of the check).
    mm = seg.mm
    mask = region.mask
    index = region.index
    i = home & mask
    while True:
        v = _u32_from(mm, index + 4 * i)[0]
        if v == 0:
            off = -1
            break
        off = region.entries + (v - 1) * seg.esize
        if mm[off + E_DIGEST : off + E_DIGEST + 16] == digest:
            break
        # A miss (only misses pay for this): a slot beyond the region, or more occupied slots
        # than the region holds (a consistent index is at most half full), is corruption.
        i = (i + 1) & mask
        if v > region.cap or i == (home + region.cap + 1) & mask:
            raise corrupt(seg, region, "an index slot beyond the region, or no empty slot")
    if off >= 0 and not mm[off]:
        expires, n = _body_head_from(mm, off + E_BODY)
        try:
            states = seg.states[n]
        except IndexError:
            raise corrupt(seg, region, f"an entry's state of {n} numbers") from None
        state = states.unpack_from(mm, off + E_FLOATS) if expires > now else None
        new_state, decision = limit.fn(state, now, cost, limit.rate)
        decision.policy = limit.name
        if new_state is not None:
            until = now + decision.reset_after
            if expires > until:  # never earlier (later())
                until = expires
            mm[off] = WRITING
            seg.bodies[len(new_state)].pack_into(mm, off + E_BODY, until, len(new_state), *new_state)
            mm[off] = CLEAN
            if until < _f64_from(mm, region.base + R_NEXT_EXPIRY)[0]:  # never: until >= expires >= it
                FIELDS.f64(mm, region.base + R_NEXT_EXPIRY, until)
        return decision
    return _charge_one(seg, Slot(digest, home, region), limit, cost, now)


def _charge_one(seg: Segment, slot: Slot, limit: Limit, cost: float, now: float) -> Decision | None:
    """``charge_one`` through the general functions: a new key, or one whose entry is dirty."""
    region = slot.region
    off = load(seg, slot, limit, now)
    if off < 0:
        if not has_room(seg, region, 0, now):
            return None
        slot.new = True
    new_state, decision = limit.fn(slot.state, now, cost, limit.rate)
    decision.policy = limit.name
    if new_state is not None:
        expires = now + decision.reset_after
        if off >= 0:
            write(seg, region, off, later(seg, off, expires), new_state)
        else:
            sweep(seg, region, 2, now)
            insert(seg, region, slot.digest, slot.home, hold_of(limit), expires, new_state)
    return decision


def charge_overflow(
    seg: Segment, slot: Slot, limit: Limit, cost: float, now: float, commit: bool
) -> tuple[State | None, Decision]:
    """Run ``limit`` on the overflow state ``slot``; ``commit``: store the new state too."""
    region = slot.region
    off = load(seg, slot, limit, now)
    state = slot.state
    if off < 0 and not has_room(seg, region, 0, now):
        # Every overflow state is live: be strict rather than admit more than a limit.

        state, _ = adjusted_state(limit, None, now, float(limit.rate.capacity))
    new_state, decision = limit.fn(state, now, cost, limit.rate)
    decision.policy = limit.name
    if commit and new_state is not None:
        store_state(seg, slot, limit, new_state, now + decision.reset_after)
    return new_state, decision


def store_state(seg: Segment, slot: Slot, limit: Limit, state: State, expires: float) -> None:
    """Write ``state`` for ``slot``: its entry (never moving its expiry earlier: a check's write), or a
    new one while the region has room."""
    region = slot.region
    pos = find(seg, region, slot.digest, slot.home)
    if pos >= 0:
        off = entry(seg, region, pos)
        write(seg, region, off, later(seg, off, expires), state)
    elif count(seg, region) < region.cap:
        insert(seg, region, slot.digest, slot.home, hold_of(limit), expires, state)


def charge_all(
    seg: Segment,
    slots: Sequence[Slot],
    limits: Sequence[Limit],
    costs: Sequence[float],
    now: float,
    overflow_slot: Callable[[Segment, Limit], Slot],
) -> list[Decision]:
    """Every key's decision; the new states are written only if every key is allowed. A key whose
    region is full goes to ``overflow_slot(seg, limit)`` (the overflow region's lock, always
    taken last, is held until the end)."""
    overflow_locked = False
    pending: dict[int, int] = {}
    results: list[tuple[Slot, State | None, Decision]] = []
    allowed = True
    try:
        for slot, limit, cost in zip(slots, limits, costs, strict=True):
            if load(seg, slot, limit, now) < 0:
                region = slot.region
                waiting = pending.get(id(region), 0)
                if has_room(seg, region, waiting, now):
                    slot.new = True
                    pending[id(region)] = waiting + 1
                else:
                    if not overflow_locked:  # the overflow lock is always taken last
                        lock_region(seg, seg.overflow)
                        overflow_locked = True
                    over = overflow_slot(seg, limit)
                    new_state, decision = charge_overflow(seg, over, limit, cost, now, False)
                    allowed = allowed and decision.allowed
                    results.append((over, new_state, decision))
                    continue
            new_state, decision = limit.fn(slot.state, now, cost, limit.rate)
            decision.policy = limit.name
            allowed = allowed and decision.allowed
            results.append((slot, new_state, decision))
        if allowed:
            swept: set[int] = set()
            for (slot, new_state, decision), limit in zip(results, limits, strict=True):
                if new_state is None:
                    continue
                if slot.new and id(slot.region) not in swept:
                    swept.add(id(slot.region))
                    sweep(seg, slot.region, 2, now)
                store_state(seg, slot, limit, new_state, now + decision.reset_after)
    finally:
        if overflow_locked:
            unlock_region(seg, seg.overflow)
    return [r[2] for r in results]
