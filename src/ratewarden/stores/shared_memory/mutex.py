"""Process-shared robust mutexes through ``ctypes`` (glibc, musl on Linux).

Uncontended locking stays in user space, and when a holder dies the next locker is told
(``EOWNERDEAD``) and takes over. Where they are missing the table uses ``fcntl`` locks instead.

A mutex lives in a file other processes write: ``lock_within`` never waits past its deadline
(``ETIMEDOUT``), and the C library is called only on a mutex whose attribute words are those of a
freshly initialised one (``signature``): bytes overwritten with garbage can make ``pthread``
wait forever or abort the process (a "priority-inheritance" kind with no such owner).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import time
from typing import Any

from ..._mypyc import mypyc_attr
from .errors import SharedMemoryError

__all__ = ["Pthread", "robust_mutexes"]


@mypyc_attr(allow_interpreted_subclasses=True)
class Pthread:
    """The C library's mutex functions (``lock``, ``unlock`` take the mutex's address)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)
        self.lock: Any = lib.pthread_mutex_lock
        self.unlock: Any = lib.pthread_mutex_unlock
        self.consistent: Any = lib.pthread_mutex_consistent
        self.init: Any = lib.pthread_mutex_init
        self.attr_init: Any = lib.pthread_mutexattr_init
        self.setpshared: Any = lib.pthread_mutexattr_setpshared
        self.setrobust: Any = lib.pthread_mutexattr_setrobust
        self.trylock: Any = lib.pthread_mutex_trylock
        for fn in (self.lock, self.unlock, self.consistent, self.trylock):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
        # glibc 2.30+: a deadline on the monotonic clock; else (musl) trylock and short sleeps.
        self.clocklock: Any = getattr(lib, "pthread_mutex_clocklock", None)
        if self.clocklock is not None:
            self.clocklock.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
            self.clocklock.restype = ctypes.c_int
        self.signature = self._signature()

    def _signature(self) -> list[tuple[int, bytes]]:
        """The words a freshly initialised mutex has non-zero (its kind: glibc's ``__kind``, musl's
        ``_m_type``), with their bytes: they never change while the mutex is in use."""
        fresh = ctypes.create_string_buffer(64)
        self.initialise(ctypes.addressof(fresh))
        raw = fresh.raw
        return [(at, raw[at : at + 4]) for at in range(0, 64, 4) if raw[at : at + 4] != bytes(4)]

    def lock_within(self, address: int, timeout: float) -> int:
        """Lock the mutex at ``address`` within ``timeout`` seconds: 0, ``ETIMEDOUT``, or
        ``pthread_mutex_lock``'s error (held on ``EOWNERDEAD``)."""
        rc: int = self.trylock(address)
        if rc != errno.EBUSY:
            return rc
        deadline = time.clock_gettime(time.CLOCK_MONOTONIC) + timeout
        if self.clocklock is not None:
            at = (ctypes.c_long * 2)(int(deadline), int(deadline % 1.0 * 1e9))
            return int(self.clocklock(address, time.CLOCK_MONOTONIC, at))
        pause = 0.0001
        while rc == errno.EBUSY:
            if time.clock_gettime(time.CLOCK_MONOTONIC) >= deadline:
                return errno.ETIMEDOUT
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
            rc = self.trylock(address)
        return rc

    def initialise(self, address: int) -> None:
        """Make the bytes at ``address`` a process-shared robust mutex."""
        attr = ctypes.create_string_buffer(64)
        for rc in (
            self.attr_init(attr),
            self.setpshared(attr, 1),  # PTHREAD_PROCESS_SHARED
            self.setrobust(attr, 1),  # PTHREAD_MUTEX_ROBUST
            self.init(ctypes.c_void_p(address), attr),
        ):
            if rc:
                raise SharedMemoryError(f"cannot initialise a process-shared mutex: {os.strerror(rc)}")


# The one Pthread of this process, made on first use (a list, not a rebound global).
_loaded: list[Pthread] = []


def robust_mutexes() -> Pthread | None:
    """The robust-mutex functions, or None where there are none (then ``fcntl`` locks are used)."""
    if not _loaded and sys.platform.startswith("linux"):
        try:
            _loaded.append(Pthread())
        except (OSError, AttributeError):
            return None
    return _loaded[0] if _loaded else None
