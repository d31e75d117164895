"""Taking a region's lock, of the kind the table uses (``Segment.locks``, chosen once when the file
is mapped: a robust mutex in the file, through the C helpers ``_native.c`` when built, else
``ctypes``; or an ``fcntl`` byte-range lock on the region's byte, dropped by the kernel when its
holder dies). The next holder after a crash takes the lock over and finishes the region's
half-done write.

Every path but the one-key check locks through ``lock``/``unlock`` (holding the process's thread
lock, which ``fcntl`` locks need: they belong to the process). ``SharedMemoryStore.hit_one`` calls
``seg.locks`` itself (the reason is measured there) and goes on with ``taken``, as it does after
the C helpers' ``begin``, which locks and probes in one call.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator, Sequence

from .errors import SharedMemoryError
from .layout import OP_NONE, R_OP, U32, Region
from .segment import Segment
from .table import recover

log = logging.getLogger("ratewarden.stores.shared_memory")


def lock(seg: Segment, region: Region) -> None:
    """Take the region's lock, then finish any insert or delete a dead holder left half-done."""
    taken(seg, region, seg.locks.lock(region))


def taken(seg: Segment, region: Region, rc: int) -> None:
    """After a lock call that returned ``rc`` (0, -1: held; else ``pthread_mutex_lock``'s error):
    take over a dead holder's lock (or raise), then finish its half-done insert or delete (the lock
    is released if that fails: a corrupt region)."""
    if rc > 0:
        owner_died(seg, rc, region)
    if U32.unpack_from(seg.mm, region.base + R_OP)[0] != OP_NONE:
        try:
            recover(seg, region)
        except BaseException:
            seg.locks.unlock(region)
            raise


def unlock(seg: Segment, region: Region) -> None:
    seg.locks.unlock(region)


def owner_died(seg: Segment, rc: int, region: Region) -> None:
    """``pthread_mutex_lock`` failed: a holder that died leaves us the lock (EOWNERDEAD)."""
    if rc == errno.EOWNERDEAD:
        seg.locks.consistent(region)
        log.warning("shared-memory table %s: took over a lock whose holder died", seg.path)
        return
    raise SharedMemoryError(f"{seg.path}: cannot lock a region: {os.strerror(rc)}")


@contextlib.contextmanager
def locked(seg: Segment, regions: Sequence[Region]) -> Iterator[None]:
    """Hold the regions' locks, taken in ascending order (the overflow region last)."""
    held: list[Region] = []
    try:
        for region in sorted(set(regions), key=lambda r: r.lock):
            lock(seg, region)
            held.append(region)
        yield
    finally:
        for region in reversed(held):
            unlock(seg, region)
