"""Taking a region's lock, of either kind: a robust mutex in the file (through the C helpers,
``_native.c``, when built, else ``ctypes``: ``mutex.py``) or an ``fcntl`` byte-range lock on the
region's byte (dropped by the kernel when its holder dies).
The next holder after a crash takes the lock over and finishes the region's half-done write.

``SharedMemoryStore.hit_now`` inlines ``lock``/``unlock`` for one key (the hot path).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence

from .errors import SharedMemoryError
from .layout import OP_NONE, R_OP, U32, Region
from .mutex import robust_mutexes
from .segment import Segment
from .table import recover

log = logging.getLogger("ratewarden.stores.shared_memory")


def lock(seg: Segment, region: Region) -> None:
    """Take the region's lock, then finish any insert or delete a dead holder left half-done."""
    if seg.mutex:
        native = seg.native
        if native is not None:
            rc = native.lock(region.number)
        else:
            pthread = robust_mutexes()
            assert pthread is not None
            rc = pthread.lock(region.addr)
        if rc:
            owner_died(seg, rc, region)
    else:
        fcntl.lockf(seg.fd, fcntl.LOCK_EX, 1, region.lock)
    if U32.unpack_from(seg.mm, region.base + R_OP)[0] != OP_NONE:
        recover(seg, region)


def unlock(seg: Segment, region: Region) -> None:
    if seg.mutex:
        native = seg.native
        if native is not None:
            native.unlock(region.number)
        else:
            pthread = robust_mutexes()
            assert pthread is not None
            pthread.unlock(region.addr)
    else:
        fcntl.lockf(seg.fd, fcntl.LOCK_UN, 1, region.lock)


def owner_died(seg: Segment, rc: int, region: Region) -> None:
    """``pthread_mutex_lock`` failed: a holder that died leaves us the lock (EOWNERDEAD)."""
    if rc == errno.EOWNERDEAD:
        native = seg.native
        if native is not None:
            native.consistent(region.number)
        else:
            pthread = robust_mutexes()
            assert pthread is not None
            pthread.consistent(region.addr)
        log.warning("shared-memory table %s: took over a lock whose holder died", seg.path)
        return
    raise SharedMemoryError(f"{seg.path}: cannot lock a region: {os.strerror(rc)}")


@contextlib.contextmanager
def locked(seg: Segment, regions: Sequence[Region]) -> Iterator[None]:
    """Hold the regions' locks, taken in ascending order (the overflow region last)."""
    taken: list[Region] = []
    try:
        for region in sorted(set(regions), key=lambda r: r.lock):
            lock(seg, region)
            taken.append(region)
        yield
    finally:
        for region in reversed(taken):
            unlock(seg, region)
