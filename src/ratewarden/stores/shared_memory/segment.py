"""The table file: its path, creation with owner-only permissions, the header written once and
checked by every later opener (an incompatible layout is an error naming the fix), the mapping,
and the one open mapping per process and file that every store object in the process shares (a
file unlinked or replaced since is not shared with new stores: they open the file now at the path)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..._mypyc import mypyc_attr
from ...errors import ConfigurationError
from .errors import SharedMemoryError
from .layout import (
    E_FLOATS,
    HEADER,
    HEADER_SIZE,
    INIT_LOCK,
    LAYOUT_VERSION,
    LOCK_BASE,
    LOCKS,
    MAGIC,
    MUTEX,
    OVERFLOW_CAP,
    RHEAD_SIZE,
    Region,
    index_size,
    state_codecs,
    stripes_for,
)
from .mutex import robust_mutexes

if TYPE_CHECKING:
    from ._native import Table

__all__ = ["CtypesMutexes", "FileLocks", "NativeMutexes", "RegionLocks", "Segment", "attach", "detach", "segment_path"]

# Matched whole (fullmatch: "$" would accept a trailing newline); ASCII only.
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def segment_path(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where the table called ``name`` lives: ``<directory>/ratewarden-<name>.shm``.

    Args:
        name: The table's name: 1 to 100 letters, digits, ``_``, ``-`` or ``.``.
        directory: The directory; the default ``None`` is ``/dev/shm`` when it exists, else the temporary
            directory.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigurationError(
            "shared-memory store name must be 1-100 letters, digits, '_', '-' or '.' (ASCII; no spaces, "
            f"slashes, newlines or other control characters), got {name!r}"
        )
    if directory is None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return Path(directory) / f"ratewarden-{name}.shm"


@mypyc_attr(allow_interpreted_subclasses=True)
class RegionLocks:
    """A table's region locks, of the kind its file records, chosen once when it is mapped
    (``Segment.locks``): ``lock`` returns 0, ``ETIMEDOUT`` (not free within ``timeout`` seconds:
    a holder stuck, or a lock word overwritten), ``EINVAL`` (the mutex's bytes are not a mutex's),
    or ``pthread_mutex_lock``'s error (the lock is held only on ``EOWNERDEAD``, then ``consistent``
    takes it over). ``locks.py`` holds what surrounds them (a dead holder's half-done write, the
    thread lock ``fcntl`` locks need)."""

    mutex = False  # a robust mutex (belongs to a thread), not an fcntl lock (belongs to the process)

    def lock(self, region: Region, timeout: float) -> int:
        raise NotImplementedError

    def unlock(self, region: Region) -> None:
        raise NotImplementedError

    def consistent(self, region: Region) -> int:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class FileLocks(RegionLocks):
    """An ``fcntl`` byte-range lock on the region's byte (dropped by the kernel when its holder
    dies), asked for without waiting, again after short sleeps until the deadline. ``lockf`` is an
    attribute so a benchmark can swap it (e.g. for ``flock``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lockf: Callable[[int, int, int, int], object] = fcntl.lockf

    def lock(self, region: Region, timeout: float) -> int:
        if self._try(region):
            return 0
        deadline = time.monotonic() + timeout
        pause = 0.00005
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
            if self._try(region):
                return 0
        return errno.ETIMEDOUT

    def _try(self, region: Region) -> bool:
        try:
            self.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, region.lock)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def unlock(self, region: Region) -> None:
        self.lockf(self.fd, fcntl.LOCK_UN, 1, region.lock)

    def consistent(self, region: Region) -> int:
        return 0


@mypyc_attr(allow_interpreted_subclasses=True)
class CtypesMutexes(RegionLocks):
    """The region's robust mutex through ``ctypes`` (``mutex.py``): where the C helpers are not
    built. A mutex whose kind words are not a fresh mutex's (overwritten) is never handed to the
    C library (``EINVAL``)."""

    mutex = True

    def __init__(self, mm: mmap.mmap) -> None:
        pthread = robust_mutexes()
        if pthread is None:
            raise SharedMemoryError("this platform has no process-shared robust mutexes")
        self.mm = mm
        self.signature = [(MUTEX + at, value) for at, value in pthread.signature]
        self.lock_within: Callable[[int, float], int] = pthread.lock_within
        self.mutex_unlock: Callable[[int], int] = pthread.unlock
        self.mutex_consistent: Callable[[int], int] = pthread.consistent

    def lock(self, region: Region, timeout: float) -> int:
        mm = self.mm
        base = region.base
        for at, value in self.signature:
            if mm[base + at : base + at + 4] != value:
                return errno.EINVAL
        return self.lock_within(region.addr, timeout)

    def unlock(self, region: Region) -> None:
        self.mutex_unlock(region.addr)

    def consistent(self, region: Region) -> int:
        return self.mutex_consistent(region.addr)


@mypyc_attr(allow_interpreted_subclasses=True)
class NativeMutexes(RegionLocks):
    """The region's robust mutex through the C helpers (``_native.c``), which also do the one-key
    check's probe and state copy (``Segment.native``)."""

    mutex = True

    def __init__(self, native: Table) -> None:
        self.native = native

    def lock(self, region: Region, timeout: float) -> int:
        return self.native.lock(region.number, timeout)

    def unlock(self, region: Region) -> None:
        self.native.unlock(region.number)

    def consistent(self, region: Region) -> int:
        return self.native.consistent(region.number)


@mypyc_attr(allow_interpreted_subclasses=True)
class Segment:
    """One process's open mapping of a table file, shared by every store object in the process
    (POSIX record locks belong to the process, so two mappings would not exclude each other)."""

    def __init__(self, path: Path, max_keys: int, log_size: int, lock: str, lock_timeout: float = 0.5) -> None:
        self.path = path
        # Seconds a lock (the thread lock, then the region's) may take before the call fails.
        self.lock_timeout = lock_timeout
        self.pid = os.getpid()
        self.users = 0
        # Excludes this process's threads (fcntl locks belong to the process); with mutexes it
        # costs ~0.1 µs and keeps one code path.
        self.tlock = threading.Lock()
        floats = max(3, log_size)
        stripes = stripes_for(max_keys)
        cap_max = -(-max_keys // stripes)
        isize = index_size(cap_max)
        esize = E_FLOATS + 8 * floats
        rsize = RHEAD_SIZE + 4 * isize + cap_max * esize
        osize = index_size(OVERFLOW_CAP)
        total = HEADER_SIZE + stripes * rsize + RHEAD_SIZE + 4 * osize + OVERFLOW_CAP * esize
        self.max_keys = max_keys
        self.floats = floats
        self.esize = esize
        self.stripes = stripes
        self.regions = [
            Region(
                HEADER_SIZE + r * rsize,
                max_keys // stripes + (1 if r < max_keys % stripes else 0),
                isize,
                LOCK_BASE + r,
            )
            for r in range(stripes)
        ]
        self.overflow = Region(HEADER_SIZE + stripes * rsize, OVERFLOW_CAP, osize, LOCK_BASE + stripes)
        self.fd = self._open()
        self._anchor: ctypes.c_char | None = None
        self.native: Table | None = None
        try:
            self.lock_kind = self._initialise(max_keys, stripes, floats, esize, isize, rsize, total, lock)
            self.mutex = self.lock_kind == "mutex"
            self.native = self._native() if self.mutex else None
            # The region locks, chosen once: every lock and unlock goes through them (locks.py).
            self.locks: RegionLocks = (
                FileLocks(self.fd) if not self.mutex
                else CtypesMutexes(self.mm) if self.native is None
                else NativeMutexes(self.native)
            )
        except BaseException:
            if self._anchor is not None:
                self._anchor = None
                self.mm.close()
            os.close(self.fd)
            raise
        self.bodies, self.states = state_codecs(floats)

    def _native(self) -> Table | None:
        """The C helpers' view of this mapping (robust mutexes without ``ctypes``, the one-key
        check's probe and state copy), or None: not built (a pure-Python install, not Linux),
        or switched off with ``RATEWARDEN_SHM_NATIVE=0`` (the ``ctypes`` path, same file)."""
        if os.environ.get("RATEWARDEN_SHM_NATIVE", "").strip().lower() in ("0", "false", "no", "off"):
            return None
        try:
            from . import _native
        except ImportError:
            return None
        if _native.LAYOUT_VERSION != LAYOUT_VERSION or getattr(_native, "TIMED", 0) != 1 or sys.byteorder != "little":
            return None
        spans = [(r.base, r.index, r.entries, r.mask) for r in [*self.regions, self.overflow]]
        return _native.Table(self.mm, self.esize, self.floats, spans)

    def _open(self) -> int:
        """Create the file (owner-only) or open the one there; anything else at the path, or a path
        that cannot be created, is a ``SharedMemoryError`` naming the path and what is wrong."""
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        path = str(self.path)
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                fd = os.open(path, flags)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SharedMemoryError(f"{path} is a symbolic link; refusing to open it") from None
                if exc.errno == errno.EISDIR:
                    raise SharedMemoryError(
                        f"{path} is a directory, not a shared-memory table; remove it or choose another name"
                    ) from None
                raise SharedMemoryError(f"cannot open {path}: {exc.strerror or exc}") from None
        except FileNotFoundError:
            raise SharedMemoryError(f"cannot create {path}: its directory does not exist") from None
        except OSError as exc:
            raise SharedMemoryError(f"cannot create {path}: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryError(f"{path} is not a regular file; remove it or choose another name")
            if info.st_uid != os.geteuid():
                raise SharedMemoryError(
                    f"{path} belongs to uid {info.st_uid}, not to this process (uid {os.geteuid()}); "
                    "refusing to share rate-limit state with another user: choose another name or directory"
                )
            if info.st_mode & 0o022:
                raise SharedMemoryError(
                    f"{path} is group- or world-writable (mode {stat.S_IMODE(info.st_mode):o}); "
                    f"anyone could rewrite the counters: remove it (rm {path}) and let ratewarden recreate it"
                )
        except BaseException:
            os.close(fd)
            raise
        self.inode = (info.st_dev, info.st_ino)
        return fd

    def current(self) -> bool:
        """Whether the file at the path is still the one mapped (not unlinked, nor replaced)."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self.inode

    def _map(self, total: int) -> None:
        self.mm = mmap.mmap(self.fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # An exported view pins the mapping; close() drops it before unmapping.
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        address = ctypes.addressof(self._anchor)
        for region in [*self.regions, self.overflow]:
            region.addr = address + region.base + MUTEX

    def _initialise(
        self, max_keys: int, stripes: int, floats: int, esize: int, isize: int, rsize: int, total: int, lock: str
    ) -> str:
        """Write the header (and the mutexes) if nobody has, under the init lock, else check the
        header matches; map the file. Returns the lock kind the table uses."""
        fd = self.fd
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, INIT_LOCK)
        try:
            size = os.fstat(fd).st_size
            raw = os.pread(fd, HEADER.size, 0) if size >= HEADER.size else b""
            if size == 0 or (len(raw) == HEADER.size and raw[:8] == MAGIC and HEADER.unpack(raw)[-1] == 0):
                kind = lock if lock != "auto" else ("mutex" if robust_mutexes() else "lockf")
                pthread = robust_mutexes() if kind == "mutex" else None
                if kind == "mutex" and pthread is None:
                    raise SharedMemoryError("lock='mutex' needs process-shared robust mutexes (Linux); use 'lockf'")
                want = (MAGIC, LAYOUT_VERSION, max_keys, stripes, floats, esize, isize, rsize, OVERFLOW_CAP, LOCKS[kind])
                os.ftruncate(fd, total)  # sparse: pages are allocated when first written
                os.pwrite(fd, HEADER.pack(*want, 0), 0)
                self._map(total)
                if pthread is not None:
                    for region in [*self.regions, self.overflow]:
                        pthread.initialise(region.addr)
                os.pwrite(fd, HEADER.pack(*want, 1), 0)
                return kind
            got = HEADER.unpack(raw) if len(raw) == HEADER.size else None
            how = f"stop every process using it and remove it (rm {self.path}), or use another name"
            if got is None or got[0] != MAGIC:
                raise SharedMemoryError(f"{self.path} is not a ratewarden shared-memory table; {how}")
            if got[1] != LAYOUT_VERSION:
                raise SharedMemoryError(
                    f"{self.path} was written with table layout {got[1]}, this ratewarden uses layout "
                    f"{LAYOUT_VERSION}; {how}"
                )
            if got[2] != max_keys or got[4] != floats:
                raise SharedMemoryError(
                    f"{self.path} was created with max_keys={got[2]}, log_size={got[4]}; this store asks "
                    f"for max_keys={max_keys}, log_size={floats}: open it with the same sizes, or {how}"
                )
            if got[3:9] != (stripes, floats, esize, isize, rsize, OVERFLOW_CAP) or size < total:
                raise SharedMemoryError(f"{self.path} has an incompatible layout; {how}")
            kind = next((k for k, v in LOCKS.items() if v == got[9]), "?")
            if kind == "?" or (lock != "auto" and lock != kind):
                raise SharedMemoryError(f"{self.path} uses {kind} locks, not {lock}; {how}")
            if kind == "mutex" and robust_mutexes() is None:
                raise SharedMemoryError(f"{self.path} uses robust mutexes, which this platform lacks; {how}")
            self._map(total)
            return kind
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, INIT_LOCK)

    def close(self) -> None:
        if self.mm.closed:
            return
        if self.native is not None:
            self.native.close()  # refused while this process holds or awaits a lock through it
            self.native = None
        self._anchor = None
        self.mm.close()
        os.close(self.fd)


_segments: dict[tuple[int, str], Segment] = {}
_segments_lock = threading.Lock()


def attach(path: Path, max_keys: int, log_size: int, lock: str, lock_timeout: float = 0.5) -> Segment:
    """This process's mapping of ``path`` (opened on first use, and again after a fork)."""
    pid = os.getpid()
    with _segments_lock:
        for key in [k for k in _segments if k[0] != pid]:
            # Inherited across fork: this process holds no lock on it, so closing is safe.
            stale = _segments.pop(key)
            with contextlib.suppress(Exception):
                stale.close()
        seg = _segments.get((pid, str(path)))
        if seg is not None and not seg.current():
            # Unlinked (or replaced) since: its store objects keep it until closed (detach), new
            # ones map the file now at the path, the one other processes open.
            del _segments[(pid, str(path))]
            seg = None
        if seg is None:
            seg = Segment(path, max_keys, log_size, lock, lock_timeout)
            _segments[(pid, str(path))] = seg
        elif (
            seg.max_keys != max_keys or seg.floats != max(3, log_size) or lock not in ("auto", seg.lock_kind)
            or seg.lock_timeout != lock_timeout
        ):
            raise SharedMemoryError(
                f"{path} is already open in this process with max_keys={seg.max_keys}, "
                f"log_size={seg.floats}, lock={seg.lock_kind!r}, lock_timeout={seg.lock_timeout}; "
                "open it with the same settings"
            )
        seg.users += 1
        return seg


def detach(seg: Segment) -> None:
    """One store object is done with ``seg``; the last one unmaps it."""
    with _segments_lock:
        seg.users -= 1
        if seg.users <= 0:
            if _segments.get((seg.pid, str(seg.path))) is seg:
                del _segments[(seg.pid, str(seg.path))]
            seg.close()  # also one no longer in the registry (its file was unlinked)
