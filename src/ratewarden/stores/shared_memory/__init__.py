"""``SharedMemoryStore``: one exact table shared by every worker process on a host.

The table lives in a file-backed ``mmap`` (``/dev/shm/ratewarden-<name>.shm`` by default), so
any process that opens the same ``name`` sees the same counters: forked or spawned workers need
no set-up in the parent. The algorithms are the same pure functions ``MemoryStore`` runs; only
where their state lives differs, so every decision equals ``MemoryStore``'s.

Layout (``layout.py``): a header (magic, layout version, sizes), then ``stripes`` regions. A
key's 16-byte BLAKE2b digest picks its region; each region holds a dense array of fixed-size
entries (state as float64s, its expiry, the digest) and an open-addressed index (linear probing,
backward-shift deletion, so no tombstones: ``table.py``), and has its own lock (``locks.py``): a
process-shared robust mutex in the file (Linux, through the C helpers ``_native.c`` when built,
which also do a one-key check's probe and state copy, else ``ctypes``: ``mutex.py``; the next
locker is told when a holder died) or else an ``fcntl`` byte-range lock on one byte (dropped by the
kernel when its holder dies), so a SIGKILLed worker never blocks the others.
A check on several keys locks their regions in ascending order (all-or-nothing, no deadlock).

Crash safety: an entry is marked dirty before its state is written and clean after; an insert or
delete records itself in the region header first and is completed (or its index rebuilt) by the
next lock holder. A dirty entry found later belonged to a writer that died mid-write: its key is
treated as having used its whole limit from that moment (never more admitted because of a crash).

Bounds are as ``MemoryStore``'s (``store.py``): at most ``max_keys`` states (split evenly between
the regions), a full region charges new keys to one shared overflow state per limit instead of
evicting a live counter, and expired states are reclaimed on the way (a cursor sweep per insert
and a full-region sweep when the region is full and its earliest expiry has passed): no
background scanner. The file itself (creation, permissions, header checks) is ``segment.py``.
"""

from __future__ import annotations

from .errors import SharedMemoryError
from .layout import DEFAULT_LOG_SIZE, DEFAULT_MAX_KEYS, LAYOUT_VERSION, LOCKS, MAGIC, OVERFLOW_CAP
from .segment import segment_path
from .store import SharedMemoryStore, log

__all__ = [
    "DEFAULT_LOG_SIZE",
    "DEFAULT_MAX_KEYS",
    "LAYOUT_VERSION",
    "LOCKS",
    "MAGIC",
    "OVERFLOW_CAP",
    "SharedMemoryError",
    "SharedMemoryStore",
    "log",
    "segment_path",
]
