"""Every table operation of ``SharedMemoryStore`` besides the check: peek, adjust, reset, clear,
counting the live keys and reading one key's state.

The check stays in ``store.py`` (``hit_now``, with ``slots.charge_one``: the hot path); these run
far less often and use the general helpers (``locks``, ``slots``, ``table``). Each
takes the thread lock and its regions' locks itself, in ascending order, within the table's
``lock_timeout`` (``locks.held``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...algorithms import State
from ...charges import adjusted_state
from ...decision import Decision
from ...limits import Limit
from .layout import hold_of
from .locks import held
from .segment import Segment
from .slots import Slot, load
from .table import clear as clear_table
from .table import count, delete, entry, find, insert, read, write

__all__ = ["adjust", "clear", "live_keys", "peek", "reset", "state_of"]


def peek(seg: Segment, slots: Sequence[Slot], limits: Sequence[Limit], now: float) -> list[Decision]:
    """Each limit's decision for a zero-cost request on its slot; charges nothing."""
    out = []
    with held(seg, [s.region for s in slots]):
        for slot, limit in zip(slots, limits, strict=True):
            load(seg, slot, limit, now)
            _, decision = limit.fn(slot.state, now, 0.0, limit.rate)
            decision.policy = limit.name
            out.append(decision)
    return out


def adjust(
    seg: Segment, slots: Sequence[Slot], limits: Sequence[Limit], amounts: Sequence[float], now: float
) -> list[Decision]:
    """Charge (positive) or refund (negative) ``amounts`` without denying (``charges.adjusted_state``);
    a key whose whole limit is back is deleted, a new key is stored only while its region has room."""

    out = []
    with held(seg, [s.region for s in slots]):
        for slot, limit, amount in zip(slots, limits, amounts, strict=True):
            region = slot.region
            off = load(seg, slot, limit, now)
            state = slot.state
            new_state, decision = adjusted_state(limit, state, now, amount)
            decision.policy = limit.name
            if new_state is None:
                if off >= 0:
                    delete(seg, region, find(seg, region, slot.digest, slot.home))
            elif new_state is not state:
                expires = now + decision.reset_after
                if off >= 0:
                    write(seg, region, off, expires, new_state)
                elif count(seg, region) < region.cap:
                    insert(seg, region, slot.digest, slot.home, hold_of(limit), expires, new_state)
            out.append(decision)
    return out


def reset(seg: Segment, slots: Sequence[Slot]) -> None:
    """Delete the slots' entries."""
    with held(seg, [s.region for s in slots]):
        for slot in slots:
            pos = find(seg, slot.region, slot.digest, slot.home)
            if pos >= 0:
                delete(seg, slot.region, pos)


def clear(seg: Segment) -> None:
    """Empty every region and the overflow states."""
    with held(seg, [*seg.regions, seg.overflow]):
        clear_table(seg)


def live_keys(seg: Segment) -> int:
    """The entries the regions hold (expired ones not yet reclaimed included)."""
    return sum(count(seg, region) for region in seg.regions)


def state_of(seg: Segment, slot: Slot, now: float) -> State | None:
    """The live state in ``slot``, or ``None`` when it has none or it expired."""
    with held(seg, [slot.region]):
        pos = find(seg, slot.region, slot.digest, slot.home)
        if pos < 0:
            return None
        expires, state = read(seg, entry(seg, slot.region, pos))
        return state if expires > now else None
