"""``MemcachedStore.hit_blocking`` (and ``peek_blocking``, ``adjust_blocking``, ``reset_blocking``):
the store's operations for synchronous code (WSGI apps, threads), on a synchronous client of its
own (pymemcache), never on an event loop.

It is the multi-key check of ``cas`` run in the calling thread, on the same stored state and
encoding, so the synchronous and asynchronous paths share keys:

* one ``gets`` of every key, the algorithm of each limit on its state at ``self.clock()`` (read
  after the reply, as the async path reads it; the algorithms clamp a late reading themselves),
  and, only if all allow, a ``cas`` per key (``add`` for a new key), each with the expiry of
  ``encoding.expiry``;
* a lost race puts back the keys already written (compare and swap again), waits ``backoff``
  and retries, at most ``retries`` times, so a check stays all or nothing;
* a write that gets no answer (timeout, lost connection) fails the check at once; what it wrote
  is put back by a thread of its own, still holding the keys, once the write has landed (or
  ``UNDO_TIMEOUT`` passed): a check that got no answer charges nothing (its commands time out
  after at least ``UNDO_COMMAND_TIMEOUT``, and a failed attempt is tried again until
  ``UNDO_TIMEOUT``, as ``putbacks`` does). Checks waiting for such a key fail after ``timeout``.

Threads of this process take their keys (all at once, so two multi-key checks never deadlock)
and a connection before they send anything: a key has one contender per process, as on the
async path, and the connections are at most ``pool_size``. Waiting for them is not timed, but a
waiter fails as soon as a command times out (memcached went silent), or after a whole ``timeout``
while memcached stays silent. A command fails after ``timeout`` with no byte from memcached
(pymemcache's socket timeout, per read), so a silent memcached fails a check within about
``timeout``, one waiting for it within about twice that. Failures are ``StoreError`` with the
async path's reasons: ``timeout`` (no reply), ``unreachable`` (refused, reset, closed), ``error``.

``peek_blocking``, ``reset_blocking`` and ``adjust_blocking`` are the async ones in the calling
thread (``adjust`` holding its keys), on the same pure steps (``peek_decisions``, ``adjusted_write``).

The store's rejection cache (``RejectionCache``, safe from threads and the event loop at once)
answers a check first, as ``MemcachedStore.hit`` does (``cached_rejections`` counts it), and a
denial read here fills it as ``cas`` fills it (each key's state before the check, until the retry
time). An adjust or a reset invalidates the keys before and after its commands, so no denial read
before it survives it.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...decision import Decision
from ...limits import Limit
from ..base import Store, StoreError, combine, no_reply
from ..insurance import Ledger
from ..rejections import RejectionCache
from .cas import adjusted_write, backoff, evaluate, peek_decisions, writes
from .encoding import decode, expiry, memcached_key
from .protocol import Read
from .putbacks import UNDO_COMMAND_TIMEOUT, UNDO_TIMEOUT, Undo

try:
    from pymemcache.client.base import Client as _PyClient  # type: ignore[import-untyped, unused-ignore]
    from pymemcache.exceptions import (  # type: ignore[import-untyped, unused-ignore]
        MemcacheError,
        MemcacheUnexpectedCloseError,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MemcachedStore.hit_blocking needs pymemcache: pip install 'ratewarden[memcached]'") from exc

__all__ = ["Blocking", "adjusted_write", "peek_decisions"]

_T = TypeVar("_T")
_POLL = 0.01  # seconds between looks at a write that got no answer, to see whether it landed


class _Interrupted(Exception):
    """A write got no answer, or a put-back failed: ``written`` is to be put back by a thread of
    its own, holding the keys (after the last write landed, when it may still land: ``landing``,
    compared with the key's ``token`` before it)."""

    def __init__(self, written: list[Undo], token: int | None, landing: bool) -> None:
        super().__init__("interrupted")
        self.written = written
        self.token = token
        self.landing = landing


class Blocking(Store):
    """The synchronous client of ``MemcachedStore`` and its ``hit_blocking``."""

    timeout: float
    retries: int
    cache_rejections: bool
    clock: Callable[[], float]
    cas_conflicts: int
    _client: Any  # the async client: ``closed`` once the store is closed
    _rejections: RejectionCache
    ledger: Ledger

    def _init_blocking(self, host: str, port: int, size: int) -> None:
        """Remember where the synchronous connections go; nothing is opened before a check."""
        self._sync_server = (host, port)
        self._sync_size = size
        self._sync_reset()

    def _sync_reset(self) -> None:
        """No connection, no key held (also in a forked child: its parent's sockets are not its own)."""
        self._sync_cond = threading.Condition()
        self._sync_held: set[bytes] = set()  # keys a thread of this process is checking
        self._sync_settling: set[bytes] = set()  # keys whose unanswered write is being put back
        self._sync_free: list[Any] = []  # idle pymemcache clients
        self._sync_out = 0  # clients in use
        self._sync_silent = False  # a command timed out and nothing was heard since
        self._sync_silences = 0  # commands that timed out
        self._sync_undoing: set[threading.Thread] = set()
        self._sync_forks = _forks

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        rejections = self._rejections
        if len(rejections):
            cached = rejections.lookup(keys, costs, self.clock())
            if cached is not None:
                rejections.counted()
                return cached
        ledger = self.ledger
        if ledger.owed:  # charged back first, so this check counts them
            error = ledger.settle_blocking(self)
            if error is not None:
                raise error
        epoch = rejections.epoch  # before the round trip: an invalidation meanwhile keeps its denial out
        mkeys = [memcached_key(k) for k in keys]
        held = set(mkeys)
        client = self._sync_take(held)
        handed: _Interrupted | None = None
        try:
            decision = self._sync_check(client, keys, mkeys, limits, costs, epoch)
        except _Interrupted as exc:
            handed = exc
            raise self._sync_failed(exc.__cause__ or exc) from exc.__cause__
        except (OSError, MemcacheError) as exc:
            raise self._sync_failed(exc) from exc
        finally:
            self._sync_give(held, client, handed)
        ledger.note_check(keys, limits, decision)
        return decision

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` in the calling thread: one ``get`` of every key, charging nothing.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """
        mkeys = [memcached_key(k) for k in keys]
        if not mkeys:
            return []
        found = self._sync_run("peek", mkeys, False, lambda client: client.get_many(list(dict.fromkeys(mkeys))))
        return peek_decisions([found.get(k) for k in mkeys], limits, self.clock())

    def reset_blocking(self, keys: Sequence[str]) -> None:
        """``reset`` in the calling thread: a ``delete`` per key.

        Args:
            keys: The storage keys to forget.
        """
        self._rejections.invalidate(keys)
        mkeys = [memcached_key(k) for k in keys]
        try:
            if mkeys:
                self._sync_run("reset", mkeys, False, lambda client: [self._sync_heard(client.delete(k, noreply=False)) for k in mkeys])
        finally:  # nor a denial read while it was under way
            self._rejections.invalidate(keys)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` in the calling thread, holding its keys: ``cas``'s loop, one key at a time.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units per key: positive charges, negative refunds.
        """
        self._rejections.invalidate(keys)
        mkeys = [memcached_key(k) for k, _, _ in zip(keys, limits, amounts, strict=True)]  # ValueError, as adjust
        try:
            return self._sync_run("adjust", mkeys, True, lambda client: self._sync_adjust(client, mkeys, limits, amounts))
        finally:
            self._rejections.invalidate(keys)

    def _sync_adjust(self, client: Any, mkeys: list[bytes], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        out: list[Decision] = []
        for key, limit, amount in zip(mkeys, limits, amounts, strict=True):
            for attempt in range(self.retries):
                ((value, token),) = self._sync_read(client, [key])
                data, ttl, decision = adjusted_write(limit, value, token, self.clock(), amount)
                if data is None:
                    break
                exptime = expiry(ttl, time.time())  # then add (a new key) or compare and swap
                if token is None:
                    done = client.add(key, data, expire=exptime, noreply=False, flags=0)
                else:
                    done = client.cas(key, data, token, expire=exptime, noreply=False, flags=0)
                if self._sync_heard(done) is True:
                    break
                with self._sync_cond:
                    self.cas_conflicts += 1
                time.sleep(backoff(attempt))
            else:
                raise StoreError(f"{self!r}: adjust: gave up after {self.retries} compare-and-swap conflicts")
            out.append(decision)
        return out

    def _sync_run(self, operation: str, mkeys: list[bytes], hold: bool, command: Callable[[Any], _T]) -> _T:
        """``command(client)`` on a connection (holding ``mkeys`` if ``hold``), failing as ``StoreError``."""
        held = set(mkeys) if hold else set()
        client = self._sync_take(held, operation)
        try:
            return command(client)
        except (OSError, MemcacheError) as exc:
            raise self._sync_failed(exc, operation) from exc
        finally:
            self._sync_give(held, client, None)

    def _sync_failed(self, exc: BaseException, operation: str = "hit") -> StoreError:
        if isinstance(exc, TimeoutError):  # memcached went silent: wake the waiters (they fail)
            with self._sync_cond:
                self._sync_silent = True
                self._sync_silences += 1
                self._sync_cond.notify_all()
        return self._sync_mapped(exc, operation)

    def _sync_mapped(self, exc: BaseException, operation: str) -> StoreError:
        """``exc`` as the async path reports it: a timeout is ``no reply within ...``, a closed
        connection ``ConnectionResetError`` (reason ``unreachable``)."""
        if isinstance(exc, TimeoutError):
            return no_reply(repr(self), operation, self.timeout)
        if isinstance(exc, MemcacheUnexpectedCloseError):
            reset = ConnectionResetError("memcached closed the connection")
            reset.__cause__ = exc
            return self.store_error(operation, reset)
        return self.store_error(operation, exc)

    # -- the check ---------------------------------------------------------------------------

    def _sync_check(
        self, client: Any, keys: Sequence[str], mkeys: list[bytes], limits: Sequence[Limit], costs: Sequence[float],
        epoch: int,
    ) -> Decision:
        for attempt in range(self.retries):
            read = self._sync_read(client, mkeys)
            now = self.clock()
            decisions, befores, states = evaluate(read, limits, costs, now)
            if not all(d.allowed for d in decisions):
                decided = combine(decisions)
                if self.cache_rejections and 0 < decided.retry_after < math.inf:  # as ``cas`` fills it
                    until = now + decided.retry_after
                    for i, key in enumerate(keys):
                        self._rejections.remember(key, costs[i], until, decisions[i], befores[i], limits[i], now, epoch)
                return decided
            written: list[Undo] = []
            for undo, token, exptime in writes(mkeys, read, states, decisions, limits):
                mkey, _, data, _ = undo
                written.append(undo)
                if not self._sync_write(client, mkey, data, token, exptime, written):
                    with self._sync_cond:
                        self.cas_conflicts += 1
                    written.pop()
                    try:
                        self._sync_undo(client, written)
                    except (OSError, MemcacheError) as exc:
                        raise _Interrupted(written, None, False) from exc
                    time.sleep(backoff(attempt))
                    break
            else:
                return combine(decisions)
        raise StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts")

    def _sync_read(self, client: Any, mkeys: list[bytes]) -> list[Read]:
        """Every key's (value, token), in one ``gets``."""
        found: dict[bytes, tuple[bytes, bytes]] = self._sync_heard(client.gets_many(list(dict.fromkeys(mkeys))))
        out: list[Read] = []
        for key in mkeys:
            hit = found.get(key)
            out.append((None, None) if hit is None else (hit[0], int(hit[1])))
        return out

    def _sync_write(self, client: Any, key: bytes, data: bytes, token: int | None, exptime: int, written: list[Undo]) -> bool:
        """``add`` (no token) or ``cas``: whether it was stored. A write that gets no answer hands
        ``written`` (this write last) to a put-back thread that keeps the keys, and raises
        ``_Interrupted``."""
        try:
            if token is None:
                stored = client.add(key, data, expire=exptime, noreply=False, flags=0)
            else:
                stored = client.cas(key, data, token, expire=exptime, noreply=False, flags=0)
        except (OSError, MemcacheError) as exc:
            raise _Interrupted(list(written), token, isinstance(exc, TimeoutError)) from exc
        self._sync_heard(None)
        return stored is True

    def _sync_undo(self, client: Any, writes: list[Undo]) -> None:
        """Put back keys this check wrote, unless someone changed them since (``putbacks._undo``);
        a restored state expires when it would have."""
        for key, old, ours, limit in writes:
            ((value, token),) = self._sync_read(client, [key])
            if value != ours or token is None:
                continue
            if old is None:
                client.delete(key, noreply=False)
            else:
                _, decision = limit.fn(decode(old), self.clock(), 0.0, limit.rate)
                client.cas(key, old, token, expire=expiry(decision.reset_after, time.time()), noreply=False, flags=0)
            self._sync_heard(None)

    # -- put-backs of writes that got no answer ----------------------------------------------

    def _sync_settle_and_undo(self, written: list[Undo], token: int | None, landing: bool, keys: set[bytes]) -> None:
        """Put back ``written`` (see ``_Interrupted``), then let go of ``keys``."""
        client = self._sync_new_client(UNDO_COMMAND_TIMEOUT)
        try:
            deadline = time.monotonic() + UNDO_TIMEOUT
            key, _old, ours, _ = written[-1]
            while landing and time.monotonic() < deadline:
                try:
                    ((value, now_token),) = self._sync_read(client, [key])
                except (OSError, MemcacheError):
                    time.sleep(_POLL)
                    continue
                if value == ours or now_token != token:  # landed, or the key moved on without it
                    break
                time.sleep(_POLL)
            # A failed attempt is tried again (a key put back reads as changed) until UNDO_TIMEOUT
            # more; one that still fails leaves that charge (``putbacks._undo``).
            deadline = time.monotonic() + UNDO_TIMEOUT
            attempt = 0
            while True:
                try:
                    self._sync_undo(client, written)
                    break
                except (OSError, MemcacheError):
                    if time.monotonic() >= deadline:
                        break
                client.close()
                client = self._sync_new_client(UNDO_COMMAND_TIMEOUT)
                time.sleep(random.uniform(0.0, min(0.02, 0.001 * 2.0**attempt)))
                attempt += 1
        finally:
            client.close()
            with self._sync_cond:
                self._sync_settling -= keys
                self._sync_held -= keys
                self._sync_undoing.discard(threading.current_thread())
                self._sync_cond.notify_all()

    # -- keys, connections, silence ------------------------------------------------------------

    def _sync_new_client(self, least: float = 0.0) -> Any:
        """A pymemcache client whose commands time out after ``timeout`` (at least ``least``)."""
        return _PyClient(
            self._sync_server, connect_timeout=max(1.0, self.timeout), timeout=max(self.timeout, least),
            no_delay=True, default_noreply=False,
        )

    def _sync_take(self, keys: set[bytes], operation: str = "hit") -> Any:
        """Hold ``keys`` and a connection (see the module docstring)."""
        if self._sync_forks != _forks:  # a forked worker (gunicorn --preload) starts afresh
            self._sync_reset()
        cond = self._sync_cond
        with cond:
            silences = self._sync_silences
            since = time.monotonic()
            while self._sync_held & keys or (not self._sync_free and self._sync_out >= self._sync_size):
                if self._sync_silences != silences:
                    raise no_reply(repr(self), operation, self.timeout)
                left = since + self.timeout - time.monotonic()
                if left <= 0:
                    if self._sync_silent or self._sync_settling & keys:
                        raise no_reply(repr(self), operation, self.timeout)
                    since, left = time.monotonic(), self.timeout
                cond.wait(left)
            self._sync_held |= keys
            self._sync_out += 1
            client = self._sync_free.pop() if self._sync_free else None
        return client if client is not None else self._sync_new_client()

    def _sync_give(self, keys: set[bytes], client: Any, handed: _Interrupted | None) -> None:
        """Let go of ``client`` and ``keys``, but for those ``handed`` to a put-back thread."""
        if getattr(self._client, "closed", False):
            client.close()  # a closed store keeps no connection
        settling = {w[0] for w in handed.written} if handed is not None and handed.written else set()
        with self._sync_cond:
            self._sync_out -= 1
            self._sync_free.append(client)
            self._sync_held -= keys - settling
            self._sync_settling |= settling
            if settling:
                assert handed is not None
                thread = threading.Thread(
                    target=self._sync_settle_and_undo, args=(handed.written, handed.token, handed.landing, settling),
                    name="ratewarden-memcached-putback", daemon=True,
                )
                self._sync_undoing.add(thread)
                thread.start()
            self._sync_cond.notify_all()

    def _sync_heard(self, reply: Any) -> Any:
        """``reply``, a command's: memcached is heard from."""
        if self._sync_silent:
            with self._sync_cond:
                self._sync_silent = False
        return reply

    def close_blocking(self, wait: float = UNDO_TIMEOUT * 2) -> None:
        """Close the synchronous connections, once the put-backs under way are done. The store
        stays usable: a later check connects again.

        Args:
            wait: The longest to wait for the put-backs under way, in seconds.
        """
        deadline = time.monotonic() + wait
        for thread in list(self._sync_undoing):
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._sync_cond:
            idle, self._sync_free = self._sync_free, []
        for client in idle:
            client.close()

    async def _close_blocking(self) -> None:
        """``close_blocking`` from ``close``: in a thread only when put-backs are under way."""
        if self._sync_undoing:
            import asyncio

            await asyncio.to_thread(self.close_blocking)
        else:
            self.close_blocking()


# Forks of this process so far (counted in the child). A store compares it with the count at its
# last reset instead of registering a fork hook of its own: a hook per store would pile up, and a
# weak reference to a store (an interpreted subclass of the compiled ``Store``) crashed the
# garbage collector of Python 3.10 in the compiled wheel.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)
