"""``SharedMemoryStore``: the ``Store`` on the shared table: the check, the ``max_keys`` bound and
the overflow allowance a full region charges new keys to; peek, adjust, reset, clear and the
introspection are ``operations.py``, called from here.

``hit_one`` (``hit_now`` on one key) is the hot path: it takes the region's lock itself (``seg.locks``, the
lock kind chosen once when the file is mapped) and hands the probe and the state rewrite to
``slots.charge_one``, or to the C helpers (``_native.c``) when built; ``locks.py`` and ``table.py``
hold the general versions every other path uses.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Final

from ..._mypyc import mypyc_attr
from ...algorithms import State
from ...caches import remember
from ...decision import Decision
from ...errors import ArgumentError, ConfigurationError
from ...limits import Limit
from ..base import LocalStoreBase, combine
from ..urls import parse_local_url
from . import operations
from .errors import SharedMemoryError
from .layout import DEFAULT_LOG_SIZE, DEFAULT_MAX_KEYS, DIGEST, LOCKS, R_OP, Region
from .locks import held, lock_failed, taken
from .locks import lock as lock_region
from .locks import unlock as unlock_region
from .segment import Segment, attach, detach, segment_path
from .slots import Slot, charge_all, charge_one, charge_overflow

log = logging.getLogger("ratewarden.stores.shared_memory")

_OVERFLOW = "\x00overflow:"


@mypyc_attr(allow_interpreted_subclasses=True)
class Forks:
    """Forks seen by this process's lineage: a store compares ``FORKS.count`` with its own copy on
    every check instead of calling getpid() (a system call, ~0.2 µs: a third of a compiled check)."""

    def __init__(self) -> None:
        self.count = 0

    def seen(self) -> None:
        self.count += 1


FORKS: Final = Forks()
os.register_at_fork(after_in_child=FORKS.seen)


@mypyc_attr(allow_interpreted_subclasses=True)
class SharedMemoryStore(LocalStoreBase):
    """An exact store shared by every process on this host that opens the same ``name``.

    Every process must open a name with the same sizes. ``close()`` unmaps this process's view
    and keeps the file (and counters) for the other workers; ``unlink()`` removes the file.

    Args:
        name: The shared table's name (its file name).
        max_keys: Live states it holds at most (as ``MemoryStore``).
        directory: Where the file lives; the default ``None`` is ``/dev/shm``, else the temporary
            directory.
        log_size: Timestamps a ``sliding_log`` key keeps; a sliding-log limit above it is refused at its
            first check.
        clock: Seconds since the epoch; replace it to test with a fake clock.
        lock: ``"mutex"`` (process-shared robust mutexes, Linux), ``"lockf"``, or ``"auto"``: the mutexes
            where the platform has them.
        lock_timeout: Seconds a check waits for a lock (default 0.5; a holder keeps one for
            microseconds) before it fails with ``SharedMemoryError`` (``reason="timeout"``): a
            process stopped while holding it, or a table whose bytes were overwritten, never hangs
            a worker. Every store of one table in a process uses the same value.
    """

    client_errors: ClassVar[tuple[type[BaseException], ...]] = (OSError,)  # what the file's locks raise when the kernel refuses them

    def __init__(
        self,
        name: str,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        directory: str | os.PathLike[str] | None = None,
        log_size: int = DEFAULT_LOG_SIZE,
        clock: Callable[[], float] = time.time,
        lock: str = "auto",
        lock_timeout: float = 0.5,
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ConfigurationError(f"max_keys must be a positive integer, got {max_keys!r}")
        if max_keys > 1 << 28:
            raise ConfigurationError(f"max_keys must be at most {1 << 28}, got {max_keys}")
        if isinstance(log_size, bool) or not isinstance(log_size, int) or not 0 <= log_size <= 65536:
            raise ConfigurationError(f"log_size must be an integer from 0 to 65536, got {log_size!r}")
        if lock != "auto" and lock not in LOCKS:
            raise ConfigurationError(f"lock must be 'auto', 'mutex' or 'lockf', got {lock!r}")
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not 0 < lock_timeout <= 3600:
            raise ConfigurationError(f"lock_timeout must be a number of seconds above 0, at most 3600, got {lock_timeout!r}")
        self.name = name
        self.lock = lock
        self.lock_timeout = float(lock_timeout)
        self.path = segment_path(name, directory)
        self.max_keys = max_keys
        self.log_size = log_size
        self.clock = clock
        self.overflowed = 0  # new keys this process charged to a shared overflow state
        self._overflow_logged = False
        self._seg: Segment | None = attach(self.path, max_keys, log_size, lock, self.lock_timeout)
        self._pid = os.getpid()
        self._forks = FORKS.count
        self._checked: set[str] = set()
        self._where: dict[str, tuple[bytes, int, Region]] = {}

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> SharedMemoryStore:
        """``shm://<name>?max_keys=65536&log_size=128&directory=/dev/shm``; keyword arguments
        (e.g. ``clock``) override the URL's options.

        Args:
            url: The ``shm://`` URL.
            **overrides: Override the URL's options (e.g. ``clock``).
        """
        kind, name, options = parse_local_url(url)
        if kind != "shm":
            raise ConfigurationError(f"SharedMemoryStore needs an shm://<name> URL, got {url!r}")
        options.update(overrides)
        return cls(name, **options)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"SharedMemoryStore({self.name!r}, max_keys={self.max_keys}, path={str(self.path)!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _segment(self) -> Segment:
        seg = self._seg
        if seg is None:
            raise SharedMemoryError(f"{self!r} is closed")
        if self._pid != os.getpid():  # forked: map the file again in this process
            self._seg = seg = attach(self.path, self.max_keys, self.log_size, self.lock, self.lock_timeout)
            self._pid = os.getpid()
            self._where.clear()
        self._forks = FORKS.count
        return seg

    def _check_limit(self, limit: Limit) -> None:
        if limit.suffix in self._checked:
            return
        if limit.algorithm == "sliding_log" and limit.rate.limit > max(3, self.log_size):
            raise ConfigurationError(
                f"sliding_log limit {limit.rate} needs {limit.rate.limit} timestamps per key, but "
                f"SharedMemoryStore {self.name!r} keeps at most {max(3, self.log_size)} (log_size): create "
                f"the store with log_size>={limit.rate.limit}, or use sliding_window/gcra for large limits"
            )
        if len(self._checked) > 10_000:
            self._checked.clear()
        self._checked.add(limit.suffix)

    def check_limits(self, limits: Sequence[Limit]) -> None:
        """Raise ``ConfigurationError`` (a ``ValueError``) now for any limit this table cannot hold (call at start-up).

        Args:
            limits: The limits it will be asked to check.
        """
        for limit in limits:
            self._check_limit(limit)

    def _locate(self, seg: Segment, key: str) -> tuple[bytes, int, Region]:
        """The key's digest, index home and region, remembered for recent keys."""
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        high, low = DIGEST.unpack(digest)
        where = (digest, low, seg.regions[high % seg.stripes])
        remember(self._where, key, where, 65_536, 32 << 20)  # 512 bytes an entry at most
        return where

    def _slot(self, seg: Segment, key: str) -> Slot:
        where = self._where.get(key)
        if where is None:
            where = self._locate(seg, key)
        return Slot(*where)

    def _overflow_slot(self, seg: Segment, limit: Limit) -> Slot:
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
        return Slot(digest, DIGEST.unpack(digest)[1], seg.overflow)

    # -- checks -------------------------------------------------------------------------------

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        if len(keys) == 1:
            return self.hit_one(keys[0], limits[0], costs[0])
        seg = self._seg
        if seg is None or self._forks != FORKS.count:
            seg = self._segment()
        return self._hit_many(seg, keys, limits, costs, self.clock())

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        """``hit_now`` of one key (the middleware's check of a one-limit rule), with no lists to
        build or index: the hot path, and the one copy of the one-key check (``hit_now`` calls it).

        Args:
            key: The storage key.
            limit: The limit checked on it.
            cost: What the request costs.
        """
        seg = self._seg
        if seg is None or self._forks != FORKS.count:
            seg = self._segment()
        now = self.clock()
        if limit.suffix not in self._checked:
            self._check_limit(limit)
        where = self._where.get(key)
        if where is None:
            where = self._locate(seg, key)
        digest, home, region = where
        native = seg.native
        locks = seg.locks
        # locks.lock/unlock inlined, with the thread lock (the one copy): calling them (through
        # lock/unlock wrappers for one key) cost a hot-key check ~0.17 µs in the interpreter
        # (2.17 -> 2.34 µs, ctypes mutex; measured). A robust mutex excludes
        # this process's threads too; an fcntl lock belongs to the process, so threads first take
        # the process's thread lock.
        if native is None:
            if not seg.mutex and not seg.tlock.acquire(timeout=seg.lock_timeout):
                raise lock_failed(seg, errno.ETIMEDOUT, None)
            try:
                got = locks.lock(region, seg.lock_timeout)
            except BaseException:
                if not seg.mutex:
                    seg.tlock.release()
                raise
        else:
            # The C helpers (_native.c): one call locks the region and reads the key's state if
            # its entry is there and clean, another writes the new state and unlocks.
            state = native.begin(region.number, digest, now, seg.lock_timeout)
            if not isinstance(state, int):
                try:
                    new_state, decision = limit.fn(state, now, cost, limit.rate)
                    decision.policy = limit.name
                except BaseException:
                    native.unlock(region.number)
                    raise
                native.commit(region.number, now + decision.reset_after, new_state)
                return decision
            got = state  # held (unless an error): the key needs the general path below
        if got or seg.mm[region.base + R_OP]:  # a dead holder's lock or half-done write
            try:
                taken(seg, region, got)  # raises with the region unlocked
            except BaseException:
                if not seg.mutex:
                    seg.tlock.release()
                raise
        try:
            charged = charge_one(seg, digest, home, region, limit, cost, now)
            return charged if charged is not None else self._hit_overflow(seg, limit, cost, now)
        finally:
            locks.unlock(region)
            if not seg.mutex:
                seg.tlock.release()

    def _hit_overflow(self, seg: Segment, limit: Limit, cost: float, now: float) -> Decision:
        slot = self._overflow_slot(seg, limit)
        lock_region(seg, slot.region)
        try:
            return charge_overflow(seg, slot, limit, cost, now, commit=True)[1]
        finally:
            unlock_region(seg, slot.region)

    def _hit_many(
        self, seg: Segment, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], now: float
    ) -> Decision:
        for limit in limits:
            self._check_limit(limit)
        slots = [self._slot(seg, key) for key in keys]
        with held(seg, [s.region for s in slots]):
            decisions = charge_all(seg, slots, limits, costs, now, self._overflow_slot)
        return combine(decisions)

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Current decisions for a zero-cost request; charges nothing."""
        seg = self._segment()
        return operations.peek(seg, [self._slot(seg, key) for key in keys], limits, self.clock())

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) without denying, as ``MemoryStore`` does.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units per key: positive charges, negative refunds.
        """
        if not len(keys) == len(limits) == len(amounts):
            raise ArgumentError(f"adjust: {len(keys)} keys, {len(limits)} limits and {len(amounts)} amounts must match")
        self.check_limits(limits)
        seg = self._segment()
        return operations.adjust(seg, [self._slot(seg, key) for key in keys], limits, amounts, self.clock())

    def reset_now(self, keys: Sequence[str]) -> None:
        """Synchronous ``reset``.

        Args:
            keys: The storage keys to forget.
        """
        seg = self._segment()
        operations.reset(seg, [self._slot(seg, key) for key in keys])

    def clear_now(self) -> None:
        operations.clear(self._segment())
        self.overflowed = 0

    # The Store API: the synchronous methods, with an OS failure (a lock the kernel refused) as
    # ``StoreError``. The ``*_now`` methods (and ``hit_one``) raise it as is: ``hit_one`` is the inlined hot path.

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        try:
            return self.hit_now(keys, limits, costs)
        except self.client_errors as exc:
            raise self.store_error("hit", exc) from exc

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        try:
            return self.peek_now(keys, limits)
        except self.client_errors as exc:
            raise self.store_error("peek", exc) from exc

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        try:
            return self.adjust_now(keys, limits, amounts)
        except self.client_errors as exc:
            raise self.store_error("adjust", exc) from exc

    async def reset(self, keys: Sequence[str]) -> None:
        try:
            self.reset_now(keys)
        except self.client_errors as exc:
            raise self.store_error("reset", exc) from exc

    async def clear(self) -> None:
        try:
            self.clear_now()
        except self.client_errors as exc:
            raise self.store_error("clear", exc) from exc

    async def close(self) -> None:
        """Unmap this process's view; the file and its counters stay for the other workers."""
        seg, self._seg = self._seg, None
        if seg is not None and self._pid == os.getpid():
            detach(seg)

    def unlink(self) -> None:
        """Remove the file (stop every worker first: one that keeps running keeps the old table,
        while a process opening the name afterwards gets a new, empty one)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # -- introspection ------------------------------------------------------------------------

    def __len__(self) -> int:
        return operations.live_keys(self._segment())

    def state_of(self, key: str) -> State | None:
        """The live state stored under ``key`` (for tests and stats).

        Args:
            key: A storage key.
        """
        seg = self._segment()
        return operations.state_of(seg, self._slot(seg, key), self.clock())
