"""A region's entries: probing the index, reading and writing states crash-safely, inserting and
deleting (backward-shift, no tombstones), finishing what a dead process left half-done, and
reclaiming expired entries (a cursor sweep per insert, a full sweep when the region is full).

Every function here runs with the region's lock held (``locks.py``). Every probe stops after the
region's capacity of slots, and a field that cannot be true (an index slot or a count beyond the
region, garbage written into the file) raises ``SharedMemoryError`` (``corrupt``) instead of being
followed: the check then fails by the limiter's ``on_error``, never spins.
"""

from __future__ import annotations

import logging
import math

from ...algorithms import State
from .errors import SharedMemoryError
from .layout import (
    BODY_HEAD,
    CLEAN,
    CRASHED,
    DIGEST,
    E_BODY,
    E_DIGEST,
    E_FLOATS,
    E_HOLD,
    F64,
    MUTEX,
    OP_DELETE,
    OP_INSERT,
    OP_NONE,
    R_CURSOR,
    R_NEXT_EXPIRY,
    R_OP,
    R_OP_A,
    R_OP_B,
    RHEAD,
    U32,
    WRITING,
    Fields,
    Region,
)
from .segment import Segment

log = logging.getLogger("ratewarden.stores.shared_memory")

# Every count, op, cursor, index slot and expiry bound is written through this (tests swap it to
# kill a process at a chosen write).
FIELDS = Fields()


def corrupt(seg: Segment, region: Region, what: str) -> SharedMemoryError:
    """The error for a region whose fields cannot be true: ``what`` is wrong, and the way out."""
    return SharedMemoryError(
        f"{seg.path} is corrupt (region {region.number}: {what}); stop every process using it and "
        f"remove it (rm {seg.path}), or use another name"
    )


def entry(seg: Segment, region: Region, pos: int) -> int:
    """The offset of entry ``pos`` of ``region``."""
    return region.entries + pos * seg.esize


def count(seg: Segment, region: Region) -> int:
    """The region's entries (at most its capacity: a larger count is corrupt)."""
    n = int(U32.unpack_from(seg.mm, region.base)[0])
    if n > region.cap:
        raise corrupt(seg, region, f"count {n} above its capacity {region.cap}")
    return n


def slot_value(seg: Segment, region: Region, i: int) -> int:
    """Index slot ``i``: 0 (empty) or an entry position + 1 within the region's capacity."""
    v = int(U32.unpack_from(seg.mm, region.index + 4 * i)[0])
    if v > region.cap:
        raise corrupt(seg, region, f"index slot {i} points at entry {v - 1}, beyond its capacity {region.cap}")
    return v


def find(seg: Segment, region: Region, digest: bytes, home: int) -> int:
    """The entry position holding ``digest`` in ``region``, or -1."""
    mm = seg.mm
    mask = region.mask
    i = home & mask
    # A consistent index is at most half full: an empty slot comes within the capacity's probes.
    for _ in range(region.cap + 1):
        v = slot_value(seg, region, i)
        if v == 0:
            return -1
        off = region.entries + (v - 1) * seg.esize + E_DIGEST
        if mm[off : off + 16] == digest:
            return v - 1
        i = (i + 1) & mask
    raise corrupt(seg, region, "no empty index slot")


def empty_slot(seg: Segment, region: Region, home: int) -> int:
    """The first empty index slot from ``home`` (an insert's place)."""
    mask = region.mask
    i = home & mask
    for _ in range(region.cap + 1):
        if not slot_value(seg, region, i):
            return i
        i = (i + 1) & mask
    raise corrupt(seg, region, "no empty index slot")


def read(seg: Segment, off: int) -> tuple[float, State]:
    """The expiry and state of the entry at ``off``."""
    mm = seg.mm
    expires, n = BODY_HEAD.unpack_from(mm, off + E_BODY)
    if n > seg.floats:
        raise SharedMemoryError(f"{seg.path} is corrupt (an entry of {n} numbers, at most {seg.floats}); "
                                f"stop every process using it and remove it (rm {seg.path}), or use another name")
    return expires, seg.states[n].unpack_from(mm, off + E_FLOATS)


def later(seg: Segment, off: int, expires: float) -> float:
    """``expires``, or the entry's own expiry if later: a check never moves an expiry earlier (a caller
    whose clock reads slightly late must not shorten a newer window's lifetime)."""
    current: float = F64.unpack_from(seg.mm, off + E_BODY)[0]
    return current if current > expires else expires


def write(seg: Segment, region: Region, off: int, expires: float, state: State) -> None:
    """Rewrite the entry at ``off`` (dirty while it is written), keeping the region's next_expiry a
    lower bound of its entries' expiries (``has_room`` sweeps a full region once it has passed; the
    one-key check's inlined copy, ``slots.charge_one``, and ``_native.c``'s ``commit`` keep it too)."""
    mm = seg.mm
    mm[off] = WRITING
    seg.bodies[len(state)].pack_into(mm, off + E_BODY, expires, len(state), *state)
    mm[off] = CLEAN
    nxt = region.base + R_NEXT_EXPIRY
    if expires < F64.unpack_from(mm, nxt)[0]:
        FIELDS.f64(mm, nxt, expires)


def insert(seg: Segment, region: Region, digest: bytes, home: int, hold: float, expires: float, state: State) -> None:
    """Append an entry and index it; recorded in the region header until done."""
    mm = seg.mm
    base = region.base
    pos = count(seg, region)
    if pos >= region.cap:
        raise corrupt(seg, region, "an insert into a full region")
    i = empty_slot(seg, region, home)  # before the op is recorded: a corrupt index changes nothing
    off = entry(seg, region, pos)
    fields = FIELDS
    fields.u32(mm, base + R_OP, OP_INSERT)
    mm[off] = WRITING
    F64.pack_into(mm, off + E_HOLD, hold)
    mm[off + E_DIGEST : off + E_DIGEST + 16] = digest
    seg.bodies[len(state)].pack_into(mm, off + E_BODY, expires, len(state), *state)
    fields.u32(mm, region.index + 4 * i, pos + 1)
    fields.u32(mm, base, pos + 1)
    mm[off] = CLEAN
    fields.u32(mm, base + R_OP, OP_NONE)
    if expires < F64.unpack_from(mm, base + R_NEXT_EXPIRY)[0]:
        fields.f64(mm, base + R_NEXT_EXPIRY, expires)


def _home_of(seg: Segment, region: Region, pos: int) -> int:
    return int(DIGEST.unpack_from(seg.mm, entry(seg, region, pos) + E_DIGEST)[1])


def _slot_of(seg: Segment, region: Region, pos: int) -> int:
    mm = seg.mm
    mask = region.mask
    i = _home_of(seg, region, pos) & mask
    for _ in range(region.cap + 1):
        if U32.unpack_from(mm, region.index + 4 * i)[0] == pos + 1:
            return i
        i = (i + 1) & mask
    raise corrupt(seg, region, f"entry {pos} is not in the index")


def delete(seg: Segment, region: Region, pos: int) -> None:
    """Remove entry ``pos``: unlink it from the index, move the last entry into its place."""
    mm = seg.mm
    base = region.base
    esize = seg.esize
    last = count(seg, region) - 1
    fields = FIELDS
    # The operands first (nothing reads them while the op is none), then the op: from there on a
    # crash is finished by recover().
    fields.u32(mm, base + R_OP_A, pos)
    fields.u32(mm, base + R_OP_B, last)
    fields.u32(mm, base + R_OP, OP_DELETE)
    # Backward-shift deletion keeps every probe sequence unbroken without tombstones.
    mask = region.mask
    index = region.index
    i = _slot_of(seg, region, pos)
    j = i
    for _ in range(region.cap + 1):
        j = (j + 1) & mask
        v = slot_value(seg, region, j)
        if v == 0:
            break
        h = _home_of(seg, region, v - 1) & mask
        if (i <= j and (h <= i or h > j)) or (i > j and h <= i and h > j):
            fields.u32(mm, index + 4 * i, v)
            i = j
    else:  # the op stays recorded: the next lock holder rebuilds the index (recover)
        raise corrupt(seg, region, "no empty index slot")
    fields.u32(mm, index + 4 * i, 0)
    if pos != last:
        slot = _slot_of(seg, region, last)
        src = entry(seg, region, last)
        dst = entry(seg, region, pos)
        mm[dst : dst + esize] = mm[src : src + esize]
        fields.u32(mm, index + 4 * slot, pos + 1)
    fields.u32(mm, base, last)
    fields.u32(mm, base + R_OP, OP_NONE)


def recover(seg: Segment, region: Region) -> None:
    """Finish the insert or delete a dead process left half-done, then rebuild the index."""
    mm = seg.mm
    base = region.base
    esize = seg.esize
    n, _, op, a, b, _ = RHEAD.unpack_from(mm, base)
    fields = FIELDS
    if op == OP_DELETE and n == b + 1 and b < region.cap:
        if a != b and a < region.cap:  # the source entry is untouched until the count drops: redo the move
            src = entry(seg, region, b)
            dst = entry(seg, region, a)
            mm[dst : dst + esize] = mm[src : src + esize]
        n = b
    # An insert that was counted keeps its entry (its dirty byte makes that key conservative);
    # one that was not is dropped when the index is rebuilt from the counted entries.
    n = min(n, region.cap)  # never more than an insert admits (a larger count is garbage)
    fields.u32(mm, base, n)  # a crash from here on redoes only the rebuild: the op stays set until the end
    mm[region.index : region.entries] = bytes(region.entries - region.index)
    for pos in range(n):
        fields.u32(mm, region.index + 4 * empty_slot(seg, region, _home_of(seg, region, pos)), pos + 1)
    fields.u32(mm, base + R_CURSOR, 0)
    fields.f64(mm, base + R_NEXT_EXPIRY, -math.inf)
    fields.u32(mm, base + R_OP, OP_NONE)
    log.warning("shared-memory table %s: recovered a region left half-written by a dead process", seg.path)


def settle(seg: Segment, off: int, now: float) -> bool:
    """Give a crashed entry a trustworthy expiry; True if the entry is dirty (its writer died)."""
    mm = seg.mm
    flag = mm[off]
    if flag == CLEAN:
        return False
    if flag == WRITING:
        hold = F64.unpack_from(mm, off + E_HOLD)[0]
        if not hold > 0 or not math.isfinite(hold):
            hold = 86400.0 * 366
        BODY_HEAD.pack_into(mm, off + E_BODY, now + hold, 0)
        mm[off] = CRASHED
        log.warning("shared-memory table %s: a worker died while writing a key; that key counts as "
                    "fully used until its period passes", seg.path)
    return True


def sweep(seg: Segment, region: Region, steps: int, now: float) -> None:
    """Inspect ``steps`` entries from the region's cursor, deleting expired ones."""
    mm = seg.mm
    base = region.base
    for _ in range(steps):
        n = count(seg, region)
        if n == 0:
            return
        cursor = U32.unpack_from(mm, base + R_CURSOR)[0]
        if cursor >= n:
            cursor = 0
        off = entry(seg, region, cursor)
        settle(seg, off, now)
        if F64.unpack_from(mm, off + E_BODY)[0] <= now:
            delete(seg, region, cursor)
        else:
            cursor += 1
        FIELDS.u32(mm, base + R_CURSOR, cursor)


def sweep_all(seg: Segment, region: Region, now: float) -> None:
    """Delete every expired entry of the region and record its earliest remaining expiry."""
    mm = seg.mm
    pos = 0
    earliest = math.inf
    while pos < count(seg, region):
        off = entry(seg, region, pos)
        settle(seg, off, now)
        expires = F64.unpack_from(mm, off + E_BODY)[0]
        if expires <= now:
            delete(seg, region, pos)
        else:
            earliest = min(earliest, expires)
            pos += 1
    FIELDS.f64(mm, region.base + R_NEXT_EXPIRY, earliest)


def has_room(seg: Segment, region: Region, pending: int, now: float) -> bool:
    """Whether ``pending`` more entries fit in the region (sweeping it if some may have expired)."""
    if count(seg, region) + pending < region.cap:
        return True
    if now >= F64.unpack_from(seg.mm, region.base + R_NEXT_EXPIRY)[0]:
        sweep_all(seg, region, now)
        return count(seg, region) + pending < region.cap
    return False


def clear(seg: Segment) -> None:
    """Empty every region (their locks held)."""
    mm = seg.mm
    for region in [*seg.regions, seg.overflow]:
        mm[region.base : region.base + MUTEX] = bytes(MUTEX)  # not the (held) mutex
        mm[region.index : region.entries] = bytes(region.entries - region.index)
        FIELDS.f64(mm, region.base + R_NEXT_EXPIRY, math.inf)
