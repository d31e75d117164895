"""``SharedMemoryStore``: one exact table shared by every worker process on a host.

The table lives in a file-backed ``mmap`` (``/dev/shm/ratewarden-<name>.shm`` by default), so
any process that opens the same ``name`` sees the same counters: forked or spawned workers need
no set-up in the parent. The algorithms are the same pure functions ``MemoryStore`` runs; only
where their state lives differs, so every decision equals ``MemoryStore``'s.

Layout: a header (magic, layout version, sizes), then ``stripes`` regions. A key's 16-byte
BLAKE2b digest picks its region; each region holds a dense array of fixed-size entries (state as
float64s, its expiry, the digest) and an open-addressed index (linear probing, backward-shift
deletion, so no tombstones), and has its own lock: a process-shared robust mutex in the file
(Linux, through ``ctypes``; the next locker is told when a holder died) or else an ``fcntl``
byte-range lock on one byte (dropped by the kernel when its holder dies), so a SIGKILLed worker
never blocks the others.
A check on several keys locks their regions in ascending order (all-or-nothing, no deadlock).

Crash safety: an entry is marked dirty before its state is written and clean after; an insert or
delete records itself in the region header first and is completed (or its index rebuilt) by the
next lock holder. A dirty entry found later belonged to a writer that died mid-write: its key is
treated as having used its whole limit from that moment (never more admitted because of a crash).

Bounds are as ``MemoryStore``'s: at most ``max_keys`` states (split evenly between the regions),
a full region charges new keys to one shared overflow state per limit instead of evicting a live
counter, and expired states are reclaimed on the way (a cursor sweep per insert and a full-region
sweep when the region is full and its earliest expiry has passed): no background scanner.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import logging
import math
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .._mypyc import mypyc_attr
from ..algorithms import State
from ..decision import Decision
from ..limits import Limit
from .base import Store, StoreError, combine

__all__ = ["SharedMemoryError", "SharedMemoryStore", "segment_path"]

log = logging.getLogger("ratewarden.stores.shared_memory")

MAGIC = b"RWSHMTB\x00"
LAYOUT_VERSION = 2
DEFAULT_MAX_KEYS = 65_536
DEFAULT_LOG_SIZE = 128
OVERFLOW_CAP = 256  # distinct limits that can share an overflow allowance at once
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_OVERFLOW = "\x00overflow:"

# Header: magic, layout version, max_keys, stripes, entry floats, entry size, index size,
# region size, overflow cap, lock kind, ready flag.
_HEADER = struct.Struct("<8sIIIIIIQIII")
_HEADER_SIZE = 4096
# Region header: count, cursor, op, op_a, op_b, (pad), next_expiry; the region's mutex at +64.
_RHEAD = struct.Struct("<IIIII4xd")
_RHEAD_SIZE = 128
_MUTEX = 64  # room for a pthread_mutex_t (40 bytes on x86-64 glibc, 48 on arm64)
LOCKS = {"mutex": 1, "lockf": 2}
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_DIGEST = struct.Struct("<QQ")
# Entry: dirty byte (+7 pad), hold (seconds a crashed write stays conservative), digest,
# expires_at, state length (+4 pad), then the state's float64s.
_E_DIRTY = 0
_E_HOLD = 8
_E_DIGEST = 16
_E_BODY = 32
_E_FLOATS = 48
_CLEAN, _WRITING, _CRASHED = 0, 1, 2
_OP_NONE, _OP_INSERT, _OP_DELETE = 0, 1, 2
# Lock bytes live far beyond the data; POSIX record locks need not cover real bytes.
_LOCK_BASE = 1 << 40
_INIT_LOCK = _LOCK_BASE - 1


@mypyc_attr(allow_interpreted_subclasses=True)
class SharedMemoryError(StoreError):
    """The shared-memory file cannot be used (wrong owner, permissions, layout), or the store is
    closed; a ``StoreError``, so a request that meets it follows the limiter's ``on_error``."""


def segment_path(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where the table called ``name`` lives: ``<directory>/ratewarden-<name>.shm``
    (``directory`` defaults to ``/dev/shm`` when it exists, else the temporary directory)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"shared-memory store name must be 1-100 letters, digits, '_', '-' or '.', got {name!r}"
        )
    if directory is None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return Path(directory) / f"ratewarden-{name}.shm"


def _stripes_for(max_keys: int) -> int:
    # Small tables keep one region, so the bound is exactly MemoryStore's; large ones spread the
    # lock over up to 64 regions (each region's share of max_keys fills within ~2% of the others).
    return max(1, min(64, max_keys // 2048))


def _index_size(cap: int) -> int:
    size = 8
    while size < 2 * cap:
        size *= 2
    return size


def _hold_of(limit: Limit) -> float:
    """An upper bound on how long any state of ``limit`` stays meaningful."""
    rate = limit.rate
    return rate.period * (2.0 + (rate.capacity + rate.max_debt) / rate.limit)


class _Pthread:
    """Process-shared robust mutexes through ``ctypes`` (glibc, musl): uncontended locking stays
    in user space, and when a holder dies the next locker is told (``EOWNERDEAD``) and takes over."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)
        self.lock = lib.pthread_mutex_lock
        self.unlock = lib.pthread_mutex_unlock
        self.consistent = lib.pthread_mutex_consistent
        self.init = lib.pthread_mutex_init
        self.attr_init = lib.pthread_mutexattr_init
        self.setpshared = lib.pthread_mutexattr_setpshared
        self.setrobust = lib.pthread_mutexattr_setrobust
        for fn in (self.lock, self.unlock, self.consistent):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int

    def initialise(self, address: int) -> None:
        attr = ctypes.create_string_buffer(64)
        for rc in (
            self.attr_init(attr),
            self.setpshared(attr, 1),  # PTHREAD_PROCESS_SHARED
            self.setrobust(attr, 1),  # PTHREAD_MUTEX_ROBUST
            self.init(ctypes.c_void_p(address), attr),
        ):
            if rc:
                raise SharedMemoryError(f"cannot initialise a process-shared mutex: {os.strerror(rc)}")


_pthread: _Pthread | None = None


def _robust_mutexes() -> _Pthread | None:
    """The robust-mutex functions, or None where there are none (then ``fcntl`` locks are used)."""
    global _pthread
    if _pthread is None and sys.platform.startswith("linux"):
        try:
            _pthread = _Pthread()
        except (OSError, AttributeError):
            return None
    return _pthread


class _Region:
    """Offsets of one region (the overflow region has the same shape)."""

    __slots__ = ("addr", "base", "cap", "entries", "index", "lock", "mask")

    def __init__(self, base: int, cap: int, index_size: int, lock: int) -> None:
        self.base = base
        self.cap = cap
        self.index = base + _RHEAD_SIZE
        self.mask = index_size - 1
        self.entries = self.index + 4 * index_size
        self.lock = lock  # lockf: the byte locked
        self.addr = 0  # mutex: its address in this process


class _Segment:
    """One process's open mapping of a table file, shared by every store object in the process
    (POSIX record locks belong to the process, so two mappings would not exclude each other)."""

    def __init__(self, path: Path, max_keys: int, log_size: int, lock: str) -> None:
        self.path = path
        self.pid = os.getpid()
        self.users = 0
        # Excludes this process's threads (fcntl locks belong to the process); with mutexes it
        # costs ~0.1 µs and keeps one code path.
        self.tlock = threading.Lock()
        floats = max(3, log_size)
        stripes = _stripes_for(max_keys)
        cap_max = -(-max_keys // stripes)
        isize = _index_size(cap_max)
        esize = _E_FLOATS + 8 * floats
        rsize = _RHEAD_SIZE + 4 * isize + cap_max * esize
        osize = _index_size(OVERFLOW_CAP)
        total = _HEADER_SIZE + stripes * rsize + _RHEAD_SIZE + 4 * osize + OVERFLOW_CAP * esize
        self.max_keys = max_keys
        self.floats = floats
        self.esize = esize
        self.stripes = stripes
        self.regions = [
            _Region(
                _HEADER_SIZE + r * rsize,
                max_keys // stripes + (1 if r < max_keys % stripes else 0),
                isize,
                _LOCK_BASE + r,
            )
            for r in range(stripes)
        ]
        self.overflow = _Region(_HEADER_SIZE + stripes * rsize, OVERFLOW_CAP, osize, _LOCK_BASE + stripes)
        self.fd = self._open()
        self._anchor: ctypes.c_char | None = None
        try:
            self.lock_kind = self._initialise(max_keys, stripes, floats, esize, isize, rsize, total, lock)
        except BaseException:
            if self._anchor is not None:
                self._anchor = None
                self.mm.close()
            os.close(self.fd)
            raise
        self.mutex = self.lock_kind == "mutex"
        self.bodies = [struct.Struct(f"<dI4x{n}d") for n in range(floats + 1)]
        self.states = [struct.Struct(f"<{n}d") for n in range(floats + 1)]

    # -- opening ------------------------------------------------------------------------------

    def _open(self) -> int:
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
                raise
        except FileNotFoundError:
            raise SharedMemoryError(f"cannot create {path}: its directory does not exist") from None
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
        return fd

    def _map(self, total: int) -> None:
        self.mm = mmap.mmap(self.fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # An exported view pins the mapping; close() drops it before unmapping.
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        address = ctypes.addressof(self._anchor)
        for region in [*self.regions, self.overflow]:
            region.addr = address + region.base + _MUTEX

    def _initialise(
        self, max_keys: int, stripes: int, floats: int, esize: int, isize: int, rsize: int, total: int, lock: str
    ) -> str:
        """Write the header (and the mutexes) if nobody has, under the init lock, else check the
        header matches; map the file. Returns the lock kind the table uses."""
        fd = self.fd
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, _INIT_LOCK)
        try:
            size = os.fstat(fd).st_size
            raw = os.pread(fd, _HEADER.size, 0) if size >= _HEADER.size else b""
            if size == 0 or (len(raw) == _HEADER.size and raw[:8] == MAGIC and _HEADER.unpack(raw)[-1] == 0):
                kind = lock if lock != "auto" else ("mutex" if _robust_mutexes() else "lockf")
                pthread = _robust_mutexes() if kind == "mutex" else None
                if kind == "mutex" and pthread is None:
                    raise SharedMemoryError("lock='mutex' needs process-shared robust mutexes (Linux); use 'lockf'")
                want = (MAGIC, LAYOUT_VERSION, max_keys, stripes, floats, esize, isize, rsize, OVERFLOW_CAP, LOCKS[kind])
                os.ftruncate(fd, total)  # sparse: pages are allocated when first written
                os.pwrite(fd, _HEADER.pack(*want, 0), 0)
                self._map(total)
                if pthread is not None:
                    for region in [*self.regions, self.overflow]:
                        pthread.initialise(region.addr)
                os.pwrite(fd, _HEADER.pack(*want, 1), 0)
                return kind
            got = _HEADER.unpack(raw) if len(raw) == _HEADER.size else None
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
            if kind == "mutex" and _robust_mutexes() is None:
                raise SharedMemoryError(f"{self.path} uses robust mutexes, which this platform lacks; {how}")
            self._map(total)
            return kind
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, _INIT_LOCK)

    def close(self) -> None:
        self._anchor = None
        self.mm.close()
        os.close(self.fd)

    # -- locking ------------------------------------------------------------------------------

    def lock(self, region: _Region) -> None:
        if self.mutex:
            rc = _mutex_lock(region.addr)
            if rc:
                self.owner_died(rc, region)
        else:
            fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, region.lock)
        if _U32.unpack_from(self.mm, region.base + 8)[0] != _OP_NONE:
            self._recover(region)

    def unlock(self, region: _Region) -> None:
        if self.mutex:
            _mutex_unlock(region.addr)
        else:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, region.lock)

    def owner_died(self, rc: int, region: _Region) -> None:
        """``pthread_mutex_lock`` failed: a holder that died leaves us the lock (EOWNERDEAD)."""
        if rc == errno.EOWNERDEAD:
            pthread = _robust_mutexes()
            assert pthread is not None
            pthread.consistent(region.addr)
            log.warning("shared-memory table %s: took over a lock whose holder died", self.path)
            return
        raise SharedMemoryError(f"{self.path}: cannot lock a region: {os.strerror(rc)}")

    @contextlib.contextmanager
    def locked(self, regions: Sequence[_Region]) -> Iterator[None]:
        """Hold the regions' locks, taken in ascending order (the overflow region last)."""
        taken: list[_Region] = []
        try:
            for region in sorted(set(regions), key=lambda r: r.lock):
                self.lock(region)
                taken.append(region)
            yield
        finally:
            for region in reversed(taken):
                self.unlock(region)

    # -- entries ------------------------------------------------------------------------------

    def entry(self, region: _Region, pos: int) -> int:
        return region.entries + pos * self.esize

    def find(self, region: _Region, digest: bytes, home: int) -> int:
        """The entry position holding ``digest`` in ``region``, or -1."""
        mm = self.mm
        mask = region.mask
        index = region.index
        i = home & mask
        while True:
            v = _U32.unpack_from(mm, index + 4 * i)[0]
            if v == 0:
                return -1
            off = region.entries + (v - 1) * self.esize + _E_DIGEST
            if mm[off : off + 16] == digest:
                return int(v) - 1
            i = (i + 1) & mask

    def read(self, off: int) -> tuple[float, State]:
        mm = self.mm
        expires, n = _BODY_HEAD.unpack_from(mm, off + _E_BODY)
        return expires, self.states[n].unpack_from(mm, off + _E_FLOATS)

    def write(self, region: _Region, off: int, expires: float, state: State) -> None:
        mm = self.mm
        mm[off] = _WRITING
        self.bodies[len(state)].pack_into(mm, off + _E_BODY, expires, len(state), *state)
        mm[off] = _CLEAN
        nxt = region.base + 24
        if expires < _F64.unpack_from(mm, nxt)[0]:
            _F64.pack_into(mm, nxt, expires)

    def count(self, region: _Region) -> int:
        return int(_U32.unpack_from(self.mm, region.base)[0])

    def insert(self, region: _Region, digest: bytes, home: int, hold: float, expires: float, state: State) -> None:
        mm = self.mm
        base = region.base
        pos = self.count(region)
        off = self.entry(region, pos)
        _U32.pack_into(mm, base + 8, _OP_INSERT)
        mm[off] = _WRITING
        _F64.pack_into(mm, off + _E_HOLD, hold)
        mm[off + _E_DIGEST : off + _E_DIGEST + 16] = digest
        self.bodies[len(state)].pack_into(mm, off + _E_BODY, expires, len(state), *state)
        mask = region.mask
        i = home & mask
        while _U32.unpack_from(mm, region.index + 4 * i)[0]:
            i = (i + 1) & mask
        _U32.pack_into(mm, region.index + 4 * i, pos + 1)
        _U32.pack_into(mm, base, pos + 1)
        mm[off] = _CLEAN
        _U32.pack_into(mm, base + 8, _OP_NONE)
        if expires < _F64.unpack_from(mm, base + 24)[0]:
            _F64.pack_into(mm, base + 24, expires)

    def _home_of(self, region: _Region, pos: int) -> int:
        return int(_DIGEST.unpack_from(self.mm, self.entry(region, pos) + _E_DIGEST)[1])

    def _slot_of(self, region: _Region, pos: int) -> int:
        mm = self.mm
        mask = region.mask
        i = self._home_of(region, pos) & mask
        while _U32.unpack_from(mm, region.index + 4 * i)[0] != pos + 1:
            i = (i + 1) & mask
        return i

    def delete(self, region: _Region, pos: int) -> None:
        """Remove entry ``pos``: unlink it from the index, move the last entry into its place."""
        mm = self.mm
        base = region.base
        last = self.count(region) - 1
        _RHEAD.pack_into(mm, base, last + 1, _U32.unpack_from(mm, base + 4)[0], _OP_DELETE, pos, last,
                         _F64.unpack_from(mm, base + 24)[0])
        # Backward-shift deletion keeps every probe sequence unbroken without tombstones.
        mask = region.mask
        index = region.index
        i = self._slot_of(region, pos)
        j = i
        while True:
            j = (j + 1) & mask
            v = _U32.unpack_from(mm, index + 4 * j)[0]
            if v == 0:
                break
            h = self._home_of(region, v - 1) & mask
            if (i <= j and (h <= i or h > j)) or (i > j and h <= i and h > j):
                _U32.pack_into(mm, index + 4 * i, v)
                i = j
        _U32.pack_into(mm, index + 4 * i, 0)
        if pos != last:
            slot = self._slot_of(region, last)
            src = self.entry(region, last)
            dst = self.entry(region, pos)
            mm[dst : dst + self.esize] = mm[src : src + self.esize]
            _U32.pack_into(mm, index + 4 * slot, pos + 1)
        _U32.pack_into(mm, base, last)
        _U32.pack_into(mm, base + 8, _OP_NONE)

    def _recover(self, region: _Region) -> None:
        """Finish the insert or delete a dead process left half-done, then rebuild the index."""
        mm = self.mm
        base = region.base
        count, _, op, a, b, _ = _RHEAD.unpack_from(mm, base)
        if op == _OP_DELETE and count == b + 1:
            if a != b:  # the source entry is untouched until the count drops: redo the move
                src = self.entry(region, b)
                dst = self.entry(region, a)
                mm[dst : dst + self.esize] = mm[src : src + self.esize]
            count = b
        # An insert that was counted keeps its entry (its dirty byte makes that key conservative);
        # one that was not is dropped when the index is rebuilt from the counted entries.
        count = min(count, region.cap + 1)
        mm[region.index : region.entries] = bytes(region.entries - region.index)
        mask = region.mask
        for pos in range(count):
            i = self._home_of(region, pos) & mask
            while _U32.unpack_from(mm, region.index + 4 * i)[0]:
                i = (i + 1) & mask
            _U32.pack_into(mm, region.index + 4 * i, pos + 1)
        _RHEAD.pack_into(mm, base, count, 0, _OP_NONE, 0, 0, -math.inf)
        log.warning("shared-memory table %s: recovered a region left half-written by a dead process", self.path)

    def settle(self, region: _Region, off: int, now: float) -> bool:
        """Give a crashed entry a trustworthy expiry; True if the entry is dirty (its writer died)."""
        mm = self.mm
        flag = mm[off]
        if flag == _CLEAN:
            return False
        if flag == _WRITING:
            hold = _F64.unpack_from(mm, off + _E_HOLD)[0]
            if not hold > 0 or not math.isfinite(hold):
                hold = 86400.0 * 366
            _BODY_HEAD.pack_into(mm, off + _E_BODY, now + hold, 0)
            mm[off] = _CRASHED
            log.warning("shared-memory table %s: a worker died while writing a key; that key counts as "
                        "fully used until its period passes", self.path)
        return True

    def sweep(self, region: _Region, count: int, now: float) -> None:
        """Inspect ``count`` entries from the region's cursor, deleting expired ones."""
        mm = self.mm
        base = region.base
        for _ in range(count):
            n = self.count(region)
            if n == 0:
                return
            cursor = _U32.unpack_from(mm, base + 4)[0]
            if cursor >= n:
                cursor = 0
            off = self.entry(region, cursor)
            self.settle(region, off, now)
            if _F64.unpack_from(mm, off + _E_BODY)[0] <= now:
                self.delete(region, cursor)
            else:
                cursor += 1
            _U32.pack_into(mm, base + 4, cursor)

    def sweep_all(self, region: _Region, now: float) -> None:
        """Delete every expired entry of the region and record its earliest remaining expiry."""
        mm = self.mm
        pos = 0
        earliest = math.inf
        while pos < self.count(region):
            off = self.entry(region, pos)
            self.settle(region, off, now)
            expires = _F64.unpack_from(mm, off + _E_BODY)[0]
            if expires <= now:
                self.delete(region, pos)
            else:
                earliest = min(earliest, expires)
                pos += 1
        _F64.pack_into(mm, region.base + 24, earliest)

    def has_room(self, region: _Region, pending: int, now: float) -> bool:
        if self.count(region) + pending < region.cap:
            return True
        if now >= _F64.unpack_from(self.mm, region.base + 24)[0]:
            self.sweep_all(region, now)
            return self.count(region) + pending < region.cap
        return False

    def clear(self) -> None:
        mm = self.mm
        for region in [*self.regions, self.overflow]:
            mm[region.base : region.base + _MUTEX] = bytes(_MUTEX)  # not the (held) mutex
            mm[region.index : region.entries] = bytes(region.entries - region.index)
            _F64.pack_into(mm, region.base + 24, math.inf)


_BODY_HEAD = struct.Struct("<dI")
_body_head_from = _BODY_HEAD.unpack_from
_u32_from = _U32.unpack_from
_lockf = fcntl.lockf
_mutex_lock: Callable[[int], int] = lambda address: 0  # noqa: E731 - set on first use of a mutex table
_mutex_unlock: Callable[[int], int] = lambda address: 0  # noqa: E731
_LOCK_EX = fcntl.LOCK_EX
_LOCK_UN = fcntl.LOCK_UN
_getpid = os.getpid
_segments: dict[tuple[int, str], _Segment] = {}
_segments_lock = threading.Lock()


def _attach(path: Path, max_keys: int, log_size: int, lock: str) -> _Segment:
    pid = os.getpid()
    with _segments_lock:
        for key in [k for k in _segments if k[0] != pid]:
            # Inherited across fork: this process holds no lock on it, so closing is safe.
            stale = _segments.pop(key)
            with contextlib.suppress(Exception):
                stale.close()
        seg = _segments.get((pid, str(path)))
        if seg is None:
            seg = _Segment(path, max_keys, log_size, lock)
            if seg.mutex:
                global _mutex_lock, _mutex_unlock
                pthread = _robust_mutexes()
                assert pthread is not None
                _mutex_lock, _mutex_unlock = pthread.lock, pthread.unlock
            _segments[(pid, str(path))] = seg
        elif seg.max_keys != max_keys or seg.floats != max(3, log_size) or lock not in ("auto", seg.lock_kind):
            raise SharedMemoryError(
                f"{path} is already open in this process with max_keys={seg.max_keys}, "
                f"log_size={seg.floats}, lock={seg.lock_kind!r}; open it with the same settings"
            )
        seg.users += 1
        return seg


def _detach(seg: _Segment) -> None:
    with _segments_lock:
        seg.users -= 1
        if seg.users <= 0 and _segments.get((seg.pid, str(seg.path))) is seg:
            del _segments[(seg.pid, str(seg.path))]
            seg.close()


class _Slot:
    """One key of a check: where its state lives and what the algorithm made of it."""

    __slots__ = ("digest", "home", "new", "region", "state")

    def __init__(self, digest: bytes, home: int, region: _Region) -> None:
        self.digest = digest
        self.home = home
        self.region = region
        self.state: State | None = None
        self.new = False


@mypyc_attr(allow_interpreted_subclasses=True)
class SharedMemoryStore(Store):
    """An exact store shared by every process on this host that opens the same ``name``.

    ``max_keys`` bounds the live states (as ``MemoryStore``); ``log_size`` bounds the timestamps
    a ``sliding_log`` key keeps (a sliding-log limit above it is refused at its first check);
    ``directory`` is where the file lives (default ``/dev/shm``, else the temporary directory).
    Every process must open a name with the same sizes. ``close()`` unmaps this process's view
    and keeps the file (and counters) for the other workers; ``unlink()`` removes the file.
    """

    local = True
    can_adjust = True

    def __init__(
        self,
        name: str,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        directory: str | os.PathLike[str] | None = None,
        log_size: int = DEFAULT_LOG_SIZE,
        clock: Callable[[], float] = time.time,
        lock: str = "auto",
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be a positive integer, got {max_keys!r}")
        if max_keys > 1 << 28:
            raise ValueError(f"max_keys must be at most {1 << 28}, got {max_keys}")
        if isinstance(log_size, bool) or not isinstance(log_size, int) or not 0 <= log_size <= 65536:
            raise ValueError(f"log_size must be an integer from 0 to 65536, got {log_size!r}")
        if lock != "auto" and lock not in LOCKS:
            raise ValueError(f"lock must be 'auto', 'mutex' or 'lockf', got {lock!r}")
        self.name = name
        self.lock = lock
        self.path = segment_path(name, directory)
        self.max_keys = max_keys
        self.log_size = log_size
        self.clock = clock
        self.overflowed = 0  # new keys this process charged to a shared overflow state
        self._overflow_logged = False
        self._seg: _Segment | None = _attach(self.path, max_keys, log_size, lock)
        self._pid = os.getpid()
        self._checked: set[str] = set()
        self._where: dict[str, tuple[bytes, int, _Region]] = {}

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> SharedMemoryStore:
        """``shm://<name>?max_keys=65536&log_size=128&directory=/dev/shm``; keyword arguments
        (e.g. ``clock``) override the URL's options."""
        from .urls import parse_local_url

        kind, name, options = parse_local_url(url)
        if kind != "shm":
            raise ValueError(f"SharedMemoryStore needs an shm://<name> URL, got {url!r}")
        options.update(overrides)
        return cls(name, **options)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"SharedMemoryStore({self.name!r}, max_keys={self.max_keys}, path={str(self.path)!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _segment(self) -> _Segment:
        seg = self._seg
        if seg is None:
            raise SharedMemoryError(f"{self!r} is closed")
        if self._pid != os.getpid():  # forked: map the file again in this process
            self._seg = seg = _attach(self.path, self.max_keys, self.log_size, self.lock)
            self._pid = os.getpid()
            self._where.clear()
        return seg

    def _check_limit(self, limit: Limit) -> None:
        if limit.suffix in self._checked:
            return
        if limit.algorithm == "sliding_log" and limit.rate.limit > max(3, self.log_size):
            raise ValueError(
                f"sliding_log limit {limit.rate} needs {limit.rate.limit} timestamps per key, but "
                f"SharedMemoryStore {self.name!r} keeps at most {max(3, self.log_size)} (log_size): create "
                f"the store with log_size>={limit.rate.limit}, or use sliding_window/gcra for large limits"
            )
        if len(self._checked) > 10_000:
            self._checked.clear()
        self._checked.add(limit.suffix)

    def check_limits(self, limits: Sequence[Limit]) -> None:
        """Raise ``ValueError`` now for any limit this table cannot hold (call at start-up)."""
        for limit in limits:
            self._check_limit(limit)

    def _locate(self, seg: _Segment, key: str) -> tuple[bytes, int, _Region]:
        """The key's digest, index home and region, remembered for recent keys."""
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        high, low = _DIGEST.unpack(digest)
        where = (digest, low, seg.regions[high % seg.stripes])
        if len(self._where) >= 65_536:
            self._where.clear()
        self._where[key] = where
        return where

    def _slot(self, seg: _Segment, key: str) -> _Slot:
        where = self._where.get(key)
        if where is None:
            where = self._locate(seg, key)
        return _Slot(*where)

    def _overflow_slot(self, seg: _Segment, limit: Limit) -> _Slot:
        self.overflowed += 1
        if not self._overflow_logged:
            self._overflow_logged = True
            log.warning(
                "shared-memory store %r is full (%d live keys): new keys share an overflow allowance "
                "until entries expire; raise max_keys if this is legitimate traffic",
                self.name,
                self.max_keys,
            )
        digest = hashlib.blake2b((_OVERFLOW + limit.suffix).encode(), digest_size=16).digest()
        return _Slot(digest, _DIGEST.unpack(digest)[1], seg.overflow)

    def _load(self, seg: _Segment, slot: _Slot, limit: Limit, now: float) -> int:
        """Read ``slot``'s live state; returns its entry offset, or -1 if absent."""
        region = slot.region
        pos = seg.find(region, slot.digest, slot.home)
        if pos < 0:
            return -1
        off = seg.entry(region, pos)
        if seg.settle(region, off, now):
            # Its writer died mid-write: the key counts as fully used from now on.
            from ..charges import adjusted_state

            state, decision = adjusted_state(limit, None, now, float(limit.rate.capacity))
            seg.write(region, off, now + decision.reset_after, state or ())
        expires, state = seg.read(off)
        slot.state = state if expires > now else None
        return off

    # -- checks -------------------------------------------------------------------------------

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        seg = self._seg
        if seg is None or self._pid != _getpid():
            seg = self._segment()
        now = self.clock()
        if len(keys) != 1:
            return self._hit_many(seg, keys, limits, costs, now)
        limit = limits[0]
        if limit.suffix not in self._checked:
            self._check_limit(limit)
        key = keys[0]
        where = self._where.get(key)
        if where is None:
            where = self._locate(seg, key)
        digest, home, region = where
        mm = seg.mm
        mutex = seg.mutex
        # A robust mutex belongs to a thread, so it excludes this process's threads too; an fcntl
        # lock belongs to the process, so threads first take the process's thread lock.
        if mutex:
            rc = _mutex_lock(region.addr)
            if rc:
                seg.owner_died(rc, region)
        else:
            seg.tlock.acquire()
            try:
                _lockf(seg.fd, _LOCK_EX, 1, region.lock)
            except BaseException:
                seg.tlock.release()
                raise
        try:
            if mm[region.base + 8]:  # an insert or delete left half-done by a dead process
                seg._recover(region)
            # The common case inlined: find the entry, run the algorithm, rewrite the state.
            mask = region.mask
            index = region.index
            i = home & mask
            while True:
                v = _u32_from(mm, index + 4 * i)[0]
                if v == 0:
                    off = -1
                    break
                off = region.entries + (v - 1) * seg.esize
                if mm[off + _E_DIGEST : off + _E_DIGEST + 16] == digest:
                    break
                i = (i + 1) & mask
            if off >= 0 and not mm[off]:
                expires, n = _body_head_from(mm, off + _E_BODY)
                state = seg.states[n].unpack_from(mm, off + _E_FLOATS) if expires > now else None
                new_state, decision = limit.fn(state, now, costs[0], limit.rate)
                decision.policy = limit.name
                if new_state is not None:
                    # A check never moves an expiry earlier, so the region's next_expiry stays a bound.
                    mm[off] = _WRITING
                    seg.bodies[len(new_state)].pack_into(
                        mm, off + _E_BODY, now + decision.reset_after, len(new_state), *new_state
                    )
                    mm[off] = _CLEAN
                return decision
            slot = _Slot(digest, home, region)
            off = self._load(seg, slot, limit, now)
            if off < 0:
                if not seg.has_room(region, 0, now):
                    return self._hit_overflow(seg, limit, costs[0], now)
                slot.new = True
            new_state, decision = limit.fn(slot.state, now, costs[0], limit.rate)
            decision.policy = limit.name
            if new_state is not None:
                expires = now + decision.reset_after
                if off >= 0:
                    seg.write(region, off, expires, new_state)
                else:
                    seg.sweep(region, 2, now)
                    seg.insert(region, slot.digest, slot.home, _hold_of(limit), expires, new_state)
            return decision
        finally:
            if mutex:
                _mutex_unlock(region.addr)
            else:
                _lockf(seg.fd, _LOCK_UN, 1, region.lock)
                seg.tlock.release()

    def _hit_overflow(self, seg: _Segment, limit: Limit, cost: float, now: float) -> Decision:
        slot = self._overflow_slot(seg, limit)
        seg.lock(slot.region)
        try:
            return self._charge_overflow(seg, slot, limit, cost, now, write=True)[1]
        finally:
            seg.unlock(slot.region)

    def _charge_overflow(
        self, seg: _Segment, slot: _Slot, limit: Limit, cost: float, now: float, write: bool
    ) -> tuple[State | None, Decision]:
        region = slot.region
        off = self._load(seg, slot, limit, now)
        state = slot.state
        if off < 0 and not seg.has_room(region, 0, now):
            # Every overflow state is live: be strict rather than admit more than a limit.
            from ..charges import adjusted_state

            state, _ = adjusted_state(limit, None, now, float(limit.rate.capacity))
        new_state, decision = limit.fn(state, now, cost, limit.rate)
        decision.policy = limit.name
        if write and new_state is not None:
            self._store(seg, slot, limit, new_state, now + decision.reset_after)
        return new_state, decision

    def _store(self, seg: _Segment, slot: _Slot, limit: Limit, state: State, expires: float) -> None:
        region = slot.region
        pos = seg.find(region, slot.digest, slot.home)
        if pos >= 0:
            seg.write(region, seg.entry(region, pos), expires, state)
        elif seg.count(region) < region.cap:
            seg.insert(region, slot.digest, slot.home, _hold_of(limit), expires, state)

    def _hit_many(
        self, seg: _Segment, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], now: float
    ) -> Decision:
        for limit in limits:
            self._check_limit(limit)
        slots = [self._slot(seg, key) for key in keys]
        regions = [s.region for s in slots]
        with seg.tlock, seg.locked(regions):
            overflow_locked = False
            pending: dict[int, int] = {}
            results: list[tuple[_Slot, State | None, Decision]] = []
            allowed = True
            try:
                for slot, limit, cost in zip(slots, limits, costs, strict=True):
                    if self._load(seg, slot, limit, now) < 0:
                        region = slot.region
                        waiting = pending.get(id(region), 0)
                        if seg.has_room(region, waiting, now):
                            slot.new = True
                            pending[id(region)] = waiting + 1
                        else:
                            if not overflow_locked:  # the overflow lock is always taken last
                                seg.lock(seg.overflow)
                                overflow_locked = True
                            over = self._overflow_slot(seg, limit)
                            new_state, decision = self._charge_overflow(seg, over, limit, cost, now, False)
                            allowed = allowed and decision.allowed
                            results.append((over, new_state, decision))
                            continue
                    new_state, decision = limit.fn(slot.state, now, cost, limit.rate)
                    decision.policy = limit.name
                    allowed = allowed and decision.allowed
                    results.append((slot, new_state, decision))
                if allowed:
                    swept: set[int] = set()
                    for (slot, new_state, decision), limit in zip(results, limits, strict=True):
                        if new_state is None:
                            continue
                        if slot.new and id(slot.region) not in swept:
                            swept.add(id(slot.region))
                            seg.sweep(slot.region, 2, now)
                        self._store(seg, slot, limit, new_state, now + decision.reset_after)
            finally:
                if overflow_locked:
                    seg.unlock(seg.overflow)
        return combine([r[2] for r in results])

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Current decisions for a zero-cost request; charges nothing."""
        seg = self._segment()
        now = self.clock()
        slots = [self._slot(seg, key) for key in keys]
        out = []
        with seg.tlock, seg.locked([s.region for s in slots]):
            for slot, limit in zip(slots, limits, strict=True):
                self._load(seg, slot, limit, now)
                _, decision = limit.fn(slot.state, now, 0.0, limit.rate)
                decision.policy = limit.name
                out.append(decision)
        return out

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) without denying, as ``MemoryStore`` does."""
        from ..charges import adjusted_state

        if not len(keys) == len(limits) == len(amounts):
            raise ValueError(f"adjust: {len(keys)} keys, {len(limits)} limits and {len(amounts)} amounts must match")
        seg = self._segment()
        now = self.clock()
        slots = [self._slot(seg, key) for key in keys]
        out = []
        with seg.tlock, seg.locked([s.region for s in slots]):
            for slot, limit, amount in zip(slots, limits, amounts, strict=True):
                self._check_limit(limit)
                region = slot.region
                off = self._load(seg, slot, limit, now)
                state = slot.state
                new_state, decision = adjusted_state(limit, state, now, amount)
                decision.policy = limit.name
                if new_state is None:
                    if off >= 0:
                        seg.delete(region, seg.find(region, slot.digest, slot.home))
                elif new_state is not state:
                    expires = now + decision.reset_after
                    if off >= 0:
                        seg.write(region, off, expires, new_state)
                    elif seg.count(region) < region.cap:
                        seg.insert(region, slot.digest, slot.home, _hold_of(limit), expires, new_state)
                out.append(decision)
        return out

    def reset_now(self, keys: Sequence[str]) -> None:
        seg = self._segment()
        slots = [self._slot(seg, key) for key in keys]
        with seg.tlock, seg.locked([s.region for s in slots]):
            for slot in slots:
                pos = seg.find(slot.region, slot.digest, slot.home)
                if pos >= 0:
                    seg.delete(slot.region, pos)

    def clear_now(self) -> None:
        seg = self._segment()
        with seg.tlock, seg.locked([*seg.regions, seg.overflow]):
            seg.clear()
        self.overflowed = 0

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.peek_now(keys, limits)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.adjust_now(keys, limits, amounts)

    async def reset(self, keys: Sequence[str]) -> None:
        self.reset_now(keys)

    async def clear(self) -> None:
        self.clear_now()

    async def close(self) -> None:
        """Unmap this process's view; the file and its counters stay for the other workers."""
        seg, self._seg = self._seg, None
        if seg is not None and self._pid == os.getpid():
            _detach(seg)

    def unlink(self) -> None:
        """Remove the file (stop every worker first: one that keeps running keeps the old table,
        while a process opening the name afterwards gets a new, empty one)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # -- introspection ------------------------------------------------------------------------

    def __len__(self) -> int:
        seg = self._segment()
        return sum(seg.count(region) for region in seg.regions)

    def state_of(self, key: str) -> State | None:
        """The live state stored under ``key`` (for tests and stats)."""
        seg = self._segment()
        slot = self._slot(seg, key)
        now = self.clock()
        with seg.tlock, seg.locked([slot.region]):
            pos = seg.find(slot.region, slot.digest, slot.home)
            if pos < 0:
                return None
            expires, state = seg.read(seg.entry(slot.region, pos))
            return state if expires > now else None
