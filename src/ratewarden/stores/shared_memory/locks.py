"""Taking a region's lock, of the kind the table uses (``Segment.locks``, chosen once when the file
is mapped: a robust mutex in the file, through the C helpers ``_native.c`` when built, else
``ctypes``; or an ``fcntl`` byte-range lock on the region's byte, dropped by the kernel when its
holder dies). The next holder after a crash takes the lock over and finishes the region's
half-done write.

Every path but the one-key check locks through ``held`` (the process's thread lock, which ``fcntl``
locks need: they belong to the process, then the regions' locks). ``SharedMemoryStore.hit_one``
calls ``seg.locks`` itself (the reason is measured there) and goes on with ``taken``, as it does
after the C helpers' ``begin``, which locks and probes in one call.

No lock is waited for longer than the table's ``lock_timeout``: a holder stopped or stuck, or a
lock whose bytes were overwritten, fails the call with ``SharedMemoryError`` (``reason="timeout"``)
instead of hanging the worker; the limiter's insurance limiter then decides the check.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator, Sequence

from .errors import SharedMemoryError
from .layout import OP_NONE, R_OP, U32, Region
from .segment import Segment
from .table import recover

log = logging.getLogger("ratewarden.stores.shared_memory")


def lock(seg: Segment, region: Region, timeout: float = -1.0) -> None:
    """Take the region's lock within ``timeout`` seconds (the table's ``lock_timeout`` unless
    given), then finish any insert or delete a dead holder left half-done."""
    taken(seg, region, seg.locks.lock(region, seg.lock_timeout if timeout < 0 else timeout))


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
    raise lock_failed(seg, rc, region)


def lock_failed(seg: Segment, rc: int, region: Region | None) -> SharedMemoryError:
    """The error for a lock not taken (``rc``: ``ETIMEDOUT``, ``EINVAL`` or another lock error)."""
    where = "the thread lock" if region is None else f"region {region.number}'s lock"
    if rc == errno.ETIMEDOUT:
        return SharedMemoryError(
            f"{seg.path}: {where} was not free within {seg.lock_timeout} s: the shared memory table is "
            "corrupt or a process held its lock too long (stopped, or stuck)",
            reason="timeout",
        )
    if rc == errno.EINVAL:
        return SharedMemoryError(
            f"{seg.path}: {where} is not a lock (its bytes were overwritten): the shared memory table is "
            f"corrupt; stop every process using it and remove it (rm {seg.path}), or use another name"
        )
    return SharedMemoryError(f"{seg.path}: cannot lock a region: {os.strerror(rc)}")


@contextlib.contextmanager
def held(seg: Segment, regions: Sequence[Region]) -> Iterator[None]:
    """Hold the process's thread lock and the regions' locks (in ascending order, the overflow
    region last), all taken within the table's ``lock_timeout``."""
    deadline = time.monotonic() + seg.lock_timeout
    if not seg.tlock.acquire(timeout=seg.lock_timeout):
        raise lock_failed(seg, errno.ETIMEDOUT, None)
    try:
        with locked(seg, regions, deadline):
            yield
    finally:
        seg.tlock.release()


@contextlib.contextmanager
def locked(seg: Segment, regions: Sequence[Region], deadline: float = -1.0) -> Iterator[None]:
    """Hold the regions' locks, taken in ascending order (the overflow region last), by the
    monotonic ``deadline`` (the table's ``lock_timeout`` from now unless given)."""
    if deadline < 0:
        deadline = time.monotonic() + seg.lock_timeout
    held: list[Region] = []
    try:
        for region in sorted(set(regions), key=lambda r: r.lock):
            lock(seg, region, max(0.0, deadline - time.monotonic()))
            held.append(region)
        yield
    finally:
        for region in reversed(held):
            unlock(seg, region)
