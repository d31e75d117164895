"""The table file's binary layout: header, regions, entries, and how a state is encoded.

Every process maps the same bytes, so these offsets and formats are the file format (bump
``LAYOUT_VERSION`` when one changes). A state, whatever its algorithm, is a tuple of float64s
stored after its expiry and length; ``state_codecs`` builds the ``struct`` formats once per table.
"""

from __future__ import annotations

import mmap
import struct
from typing import Final

from ..._mypyc import mypyc_attr
from ...limits import Limit

MAGIC: Final = b"RWSHMTB\x00"
LAYOUT_VERSION: Final = 2
DEFAULT_MAX_KEYS: Final = 65_536
DEFAULT_LOG_SIZE: Final = 128
OVERFLOW_CAP: Final = 256  # distinct limits that can share an overflow allowance at once
LOCKS = {"mutex": 1, "lockf": 2}

# Header: magic, layout version, max_keys, stripes, entry floats, entry size, index size,
# region size, overflow cap, lock kind, ready flag.
HEADER = struct.Struct("<8sIIIIIIQIII")
HEADER_SIZE: Final = 4096
# Region header: count, cursor, op, op_a, op_b, (pad), next_expiry; the region's mutex at +64.
RHEAD = struct.Struct("<IIIII4xd")
RHEAD_SIZE: Final = 128
R_CURSOR: Final = 4
R_OP: Final = R_CURSOR + 4  # the insert or delete under way, so a crashed one can be finished
OP_NONE: Final = 0
OP_INSERT: Final = 1
OP_DELETE: Final = 2
R_OP_A: Final = R_OP + 4
R_OP_B: Final = R_OP_A + 4
R_NEXT_EXPIRY: Final = R_OP_B + 8  # after 4 bytes of padding
MUTEX: Final = 64  # room for a pthread_mutex_t (40 bytes on x86-64 glibc, 48 on arm64)
U32 = struct.Struct("<I")
F64 = struct.Struct("<d")
# Entry: dirty byte (+7 pad), hold (seconds a crashed write stays conservative), digest,
# expires_at, state length (+4 pad), then the state's float64s.
E_DIRTY: Final = 0
CLEAN: Final = 0
WRITING: Final = 1
CRASHED: Final = 2
E_HOLD: Final = E_DIRTY + 8
DIGEST = struct.Struct("<QQ")
E_DIGEST: Final = E_HOLD + 8
E_BODY: Final = E_DIGEST + DIGEST.size
BODY_HEAD = struct.Struct("<dI")  # an entry's expiry and state length
E_FLOATS: Final = E_BODY + 16  # BODY_HEAD padded to 8 bytes
# Lock bytes live far beyond the data; POSIX record locks need not cover real bytes.
LOCK_BASE: Final = 1 << 40
INIT_LOCK: Final = LOCK_BASE - 1


@mypyc_attr(allow_interpreted_subclasses=True)
class Fields:
    """Writes the table's 32-bit fields (a region's count, op and cursor, index slots) and its
    times in one copy of their final bytes.

    Not ``struct.pack_into``: it zeroes its bytes before writing the value, so a process killed
    in between would leave, e.g., a region's count at 0, and every key of that region lost (the
    next check starts them afresh, admitting up to a second limit). A copy of 4 or 8 bytes leaves
    the old value or the new one. Entry states are still packed in place: their dirty byte covers them.
    """

    def u32(self, mm: mmap.mmap, offset: int, value: int) -> None:
        mm[offset : offset + 4] = U32.pack(value)

    def f64(self, mm: mmap.mmap, offset: int, value: float) -> None:
        mm[offset : offset + 8] = F64.pack(value)


@mypyc_attr(allow_interpreted_subclasses=True)
class Region:
    """Offsets of one region (the overflow region has the same shape)."""

    __slots__ = ("addr", "base", "cap", "entries", "index", "lock", "mask", "number")

    def __init__(self, base: int, cap: int, index_size: int, lock: int) -> None:
        self.base = base
        self.cap = cap
        self.index = base + RHEAD_SIZE
        self.mask = index_size - 1
        self.entries = self.index + 4 * index_size
        self.lock = lock  # lockf: the byte locked
        self.number = lock - LOCK_BASE  # its place in the table (the overflow region is last)
        self.addr = 0  # mutex: its address in this process


def stripes_for(max_keys: int) -> int:
    """How many regions a table of ``max_keys`` has."""
    # Small tables keep one region, so the bound is exactly MemoryStore's; large ones spread the
    # lock over up to 64 regions (each region's share of max_keys fills within ~2% of the others).
    return max(1, min(64, max_keys // 2048))


def index_size(cap: int) -> int:
    """The index slots for ``cap`` entries: a power of two, at most half full."""
    size = 8
    while size < 2 * cap:
        size *= 2
    return size


def state_codecs(floats: int) -> tuple[list[struct.Struct], list[struct.Struct]]:
    """Per state length n: the entry body's format (expiry, n, the floats) and the state's own."""
    bodies = [struct.Struct(f"<dI4x{n}d") for n in range(floats + 1)]
    states = [struct.Struct(f"<{n}d") for n in range(floats + 1)]
    return bodies, states


def hold_of(limit: Limit) -> float:
    """An upper bound on how long any state of ``limit`` stays meaningful."""
    rate = limit.rate
    return rate.period * (2.0 + (rate.capacity + rate.max_debt) / rate.limit)
