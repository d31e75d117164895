"""One key of a check: its place in the table (``Slot``), loading its live state (a key whose
writer died counts as fully used), storing its new state, and charging a key that finds its
region full to the shared overflow state of its limit instead (never evicting a live counter).

Every function here runs with the key's region locked.
"""

from __future__ import annotations

from ..._mypyc import mypyc_attr
from ...algorithms import State
from ...decision import Decision
from ...limits import Limit
from .layout import Region, hold_of
from .segment import Segment
from .table import count, entry, find, has_room, insert, read, settle, write


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
        from ...charges import adjusted_state

        state, decision = adjusted_state(limit, None, now, float(limit.rate.capacity))
        write(seg, region, off, now + decision.reset_after, state or ())
    expires, state = read(seg, off)
    slot.state = state if expires > now else None
    return off


def charge_overflow(
    seg: Segment, slot: Slot, limit: Limit, cost: float, now: float, commit: bool
) -> tuple[State | None, Decision]:
    """Run ``limit`` on the overflow state ``slot``; ``commit``: store the new state too."""
    region = slot.region
    off = load(seg, slot, limit, now)
    state = slot.state
    if off < 0 and not has_room(seg, region, 0, now):
        # Every overflow state is live: be strict rather than admit more than a limit.
        from ...charges import adjusted_state

        state, _ = adjusted_state(limit, None, now, float(limit.rate.capacity))
    new_state, decision = limit.fn(state, now, cost, limit.rate)
    decision.policy = limit.name
    if commit and new_state is not None:
        store_state(seg, slot, limit, new_state, now + decision.reset_after)
    return new_state, decision


def store_state(seg: Segment, slot: Slot, limit: Limit, state: State, expires: float) -> None:
    """Write ``state`` for ``slot``: its entry, or a new one while the region has room."""
    region = slot.region
    pos = find(seg, region, slot.digest, slot.home)
    if pos >= 0:
        write(seg, region, entry(seg, region, pos), expires, state)
    elif count(seg, region) < region.cap:
        insert(seg, region, slot.digest, slot.home, hold_of(limit), expires, state)
