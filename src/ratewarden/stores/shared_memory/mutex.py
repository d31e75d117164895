"""Process-shared robust mutexes through ``ctypes`` (glibc, musl on Linux).

Uncontended locking stays in user space, and when a holder dies the next locker is told
(``EOWNERDEAD``) and takes over. Where they are missing the table uses ``fcntl`` locks instead.
"""

from __future__ import annotations

import ctypes
import os
import sys
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
        for fn in (self.lock, self.unlock, self.consistent):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int

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
