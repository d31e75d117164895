"""Memcached store: the pure algorithms run here, state is swapped in with ``gets``/``cas``.

* A check reads every key with ``gets``, runs the algorithms locally and, only if all allow,
  writes each new state with ``cas`` (``add`` for a new key). A lost race re-reads and retries;
  if a later key of a multi-key check loses, the keys already written are put back (compare
  and swap again) before the retry, so a check stays all or nothing.
* Concurrent checks of one key inside this process queue on a local lock, so CAS races happen
  only between processes (few), not between the hundreds of requests of one event loop.
* Every operation (checks, ``peek``, ``reset``, ``clear``) is bounded by ``timeout``. A command
  interrupted by the timeout or a cancelled caller closes its connection (its reply may be
  unread, and would be read by the next command). A check interrupted while writing lets the
  write in flight finish, then puts back what it wrote, so a check that did not answer charges
  nothing.
* Memcached has no clock command: time is this host's ``time.time()``. Hosts sharing a
  memcached must keep their clocks in sync (NTP); a skew of ``s`` seconds shifts windows by ``s``.
* Expiry: ``ceil(reset_after) + 1`` seconds (memcached counts whole seconds, so the extra
  second stops a state from expiring early); above 30 days it is sent as an absolute Unix time.
* Keys over 250 bytes, or with spaces, control or non-ASCII characters, are hashed (BLAKE2b).
* State: the algorithm's tuple of floats as ``repr`` values joined by commas (lossless).
* ``adjust`` (refunds and penalties) uses the same read, compute, compare-and-swap loop, one
  key at a time; a state whose whole limit is available again is written as the algorithm's
  "nothing used" state (memcached has no compare-and-delete), which reads the same as no key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..algorithms import State
from ..decision import Decision
from ..errors import ConfigurationError
from ..limits import Limit
from .base import Store, StoreError, combine, no_reply
from .deadline import wait_for_store
from .urls import parse_store_url

try:
    import aiomcache
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MemcachedStore needs aiomcache: pip install 'ratewarden[memcached]'") from exc

__all__ = ["MemcachedStore", "memcached_key"]

_T = TypeVar("_T")
_Undo = tuple[bytes, "bytes | None", bytes, Limit]  # key, value before, value written, its limit

THIRTY_DAYS = 30 * 86400
UNDO_TIMEOUT = 5.0  # seconds a put-back of an interrupted check may take (it runs in the background)
_MAX_KEY = 250


def memcached_key(key: str) -> bytes:
    """``key`` as memcached accepts it: hashed when too long or not plain printable ASCII."""
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= _MAX_KEY and raw.isascii() and all(32 < b < 127 for b in raw):
        return raw
    prefix = key.split(":", 1)[0][:16] if ":" in key else "rw"
    safe_prefix = "".join(c for c in prefix if 32 < ord(c) < 127) or "rw"
    return f"{safe_prefix}:h:{hashlib.blake2b(raw, digest_size=20).hexdigest()}".encode()


def expiry(reset_after: float, wall: float) -> int:
    """Memcached ``exptime`` for a state meaningful for ``reset_after`` seconds."""
    seconds = max(1, math.ceil(reset_after) + 1) if reset_after < 1e12 else THIRTY_DAYS * 1000
    return seconds if seconds <= THIRTY_DAYS else int(wall) + seconds


def encode(state: State) -> bytes:
    return ",".join(map(repr, state)).encode()


def decode(value: bytes) -> State:
    if not value:
        return ()
    return tuple(float(x) for x in value.split(b","))


def _closing_on_interrupt(method: Any) -> Any:
    """An aiomcache command that closes its connection instead of returning it to the pool when
    it does not complete (timeout, cancellation): aiomcache returns it on ``CancelledError`` with
    the reply unread, and the next command on it reads that reply as its own. Also once the
    client is closed: aiomcache's ``close`` closes the idle connections only, so a command in
    flight (or a later one) would leave its connection, and those it opened to fill the pool, open."""
    raw = method.__wrapped__

    async def command(self: Any, *args: Any) -> Any:
        conn = await self._pool.acquire()
        try:
            return await raw(self, conn, *args)
        except BaseException as exc:
            conn.reader.set_exception(exc if isinstance(exc, Exception) else ConnectionAbortedError("interrupted"))
            raise
        finally:
            if self.closed and conn.reader.exception() is None:
                conn.reader.set_exception(ConnectionAbortedError("the store was closed"))
            self._pool.release(conn)  # closes it when its reader holds an exception
            if self.closed:  # and those its acquire opened for the pool meanwhile
                await self._pool.clear()

    return command


class _Client(aiomcache.Client):
    closed = False  # then a command closes its connection when done
    gets = _closing_on_interrupt(aiomcache.Client.gets)
    get = _closing_on_interrupt(aiomcache.Client.get)
    add = _closing_on_interrupt(aiomcache.Client.add)
    cas = _closing_on_interrupt(aiomcache.Client.cas)
    delete = _closing_on_interrupt(aiomcache.Client.delete)
    flush_all = _closing_on_interrupt(aiomcache.Client.flush_all)


class MemcachedStore(Store):
    """Limits kept in memcached, built from ``memcached://host:port``.

    Keyword arguments override the URL's query options of the same name.

    Args:
        url: ``memcached://host:port``, with options in its query.
        timeout: Seconds per check (default 0.05).
        pool_size: Connections (default 8).
        retries: CAS attempts before ``StoreError``.
        clock: Seconds since the epoch; replace it in tests.
    """

    can_adjust = True
    client_errors = (OSError, aiomcache.exceptions.ClientException, RuntimeError)  # RuntimeError: another loop

    def __init__(
        self,
        url: str = "memcached://127.0.0.1:11211",
        *,
        timeout: float | None = None,
        pool_size: int | None = None,
        retries: int = 50,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cfg = parse_store_url(url, ("memcached",))
        if len(cfg.hosts) != 1:
            raise ConfigurationError(
                f"store URL {cfg.text!r}: MemcachedStore takes exactly one host:port, got {len(cfg.hosts)}"
            )
        self.url = cfg.text
        self.timeout = float(timeout if timeout is not None else cfg.option("timeout", 0.05))  # type: ignore[arg-type]
        size = int(pool_size if pool_size is not None else cfg.option("pool_size", 8))  # type: ignore[call-overload]
        if not self.timeout > 0:
            raise ConfigurationError(f"{self!r}: timeout must be positive, got {self.timeout!r} seconds")
        if size < 1:
            raise ConfigurationError(f"{self!r}: pool_size must be at least 1, got {size}")
        if retries < 1:
            raise ConfigurationError(f"{self!r}: retries must be at least 1, got {retries}")
        self.retries = retries
        self.clock = clock
        host, port = cfg.hosts[0]
        self._client = _Client(host, port, pool_size=size)
        self._locks: dict[bytes, list[Any]] = {}  # key -> [asyncio.Lock, users]
        self._undoing: set[asyncio.Task[None]] = set()  # put-backs of interrupted checks
        self.cas_conflicts = 0  # lost compare-and-swap races (retried)

    def __repr__(self) -> str:
        return f"MemcachedStore({self.url!r})"

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        mkeys = [memcached_key(k) for k in keys]
        return await self._run(mkeys, lambda: self._cas_hit(mkeys, limits, costs), "hit")

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) ``amounts[i]`` on ``keys[i]`` without a limit
        check, exactly as ``ratewarden.charges.adjusted_state`` computes it."""
        if not len(keys) == len(limits) == len(amounts):
            raise ValueError("adjust: keys, limits and amounts must have the same length")
        mkeys = [memcached_key(k) for k in keys]
        return await self._run(mkeys, lambda: self._cas_adjust(mkeys, limits, amounts), "adjust")

    async def _run(self, mkeys: list[bytes], operation: Callable[[], Awaitable[_T]], name: str) -> _T:
        """``operation`` (called ``name`` in errors) under this process's per-key locks, with the
        timeout and error mapping."""
        return await self._bounded(self._locked(mkeys, operation), name)

    async def _bounded(self, awaitable: Awaitable[_T], operation: str) -> _T:
        """``awaitable`` within the timeout, every failure as ``StoreError`` naming ``operation``."""
        try:
            return await wait_for_store(awaitable, self.timeout)
        except asyncio.TimeoutError:
            raise no_reply(repr(self), operation, self.timeout) from None
        except self.client_errors as exc:
            raise self.store_error(operation, exc) from exc

    async def _locked(self, mkeys: list[bytes], operation: Callable[[], Awaitable[_T]]) -> _T:
        ordered = sorted(set(mkeys))
        users: list[bytes] = []  # keys whose lock entry counts us
        acquired: list[asyncio.Lock] = []  # locks we hold (a waiter cancelled holds none)
        try:
            for key in ordered:
                entry = self._locks.get(key)
                if entry is None:
                    entry = self._locks[key] = [asyncio.Lock(), 0]
                entry[1] += 1
                users.append(key)
                await entry[0].acquire()
                acquired.append(entry[0])
            return await operation()
        finally:
            for lock in acquired:
                lock.release()
            for key in users:
                entry = self._locks[key]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    async def _cas_adjust(
        self, mkeys: list[bytes], limits: Sequence[Limit], amounts: Sequence[float]
    ) -> list[Decision]:
        from ..charges import adjusted_state  # charges imports the stores package

        client = self._client
        out: list[Decision] = []
        for key, limit, amount in zip(mkeys, limits, amounts, strict=True):
            for _ in range(self.retries):
                value, token = await client.gets(key)
                state = decode(value) if value is not None else None
                now = self.clock()
                new_state, decision = adjusted_state(limit, state, now, amount)
                decision.policy = limit.name
                if new_state is state or (new_state is None and token is None):
                    break  # nothing changes
                ttl = decision.reset_after
                if new_state is None:
                    # Whole limit available: write the algorithm's empty state (reads as no key).
                    new_state, empty = limit.fn(None, now, 0.0, limit.rate)
                    if new_state is None:  # pragma: no cover - a zero-cost request is always allowed
                        await client.delete(key)
                        break
                    ttl = empty.reset_after
                data = encode(new_state)
                exptime = expiry(ttl, time.time())
                ok = await (client.add(key, data, exptime) if token is None else client.cas(key, data, token, exptime))
                if ok:
                    break
                self.cas_conflicts += 1
            else:
                raise StoreError(f"{self!r}: adjust: gave up after {self.retries} compare-and-swap conflicts")
            out.append(decision)
        return out

    async def _cas_hit(self, mkeys: list[bytes], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        client = self._client
        for _ in range(self.retries):
            read = [await client.gets(k) for k in mkeys]
            now = self.clock()
            decisions: list[Decision] = []
            states: list[State | None] = []
            for (value, _token), limit, cost in zip(read, limits, costs, strict=False):
                state = decode(value) if value is not None else None
                new_state, decision = limit.fn(state, now, cost, limit.rate)
                decision.policy = limit.name
                decisions.append(decision)
                states.append(new_state)
            if not all(d.allowed for d in decisions):
                return combine(decisions)
            wall = time.time()
            written: list[_Undo] = []  # includes the write in flight: it may have landed
            landing: asyncio.Future[bool] | None = None  # the write in flight
            try:
                for i, key in enumerate(mkeys):
                    new_state = states[i]
                    if new_state is None:
                        continue
                    value, token = read[i]
                    data = encode(new_state)
                    exptime = expiry(decisions[i].reset_after, wall)
                    written.append((key, value, data, limits[i]))
                    landing = asyncio.ensure_future(
                        client.add(key, data, exptime) if token is None else client.cas(key, data, token, exptime)
                    )
                    # Shielded: an interruption must know whether this write landed before it
                    # puts anything back, so the write completes (and its reply is read) anyway.
                    ok = await asyncio.shield(landing)
                    if not ok:
                        self.cas_conflicts += 1
                        written.pop()
                        await self._undo(written)
                        break
                else:
                    return combine(decisions)
            except BaseException:
                # Interrupted (timeout, cancelled caller, lost connection) while writing: the
                # caller gets no answer, so nothing may stay charged.
                await self._undo_interrupted(written, landing)
                raise
        raise StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts")

    async def _undo_interrupted(self, writes: list[_Undo], landing: asyncio.Future[bool] | None) -> None:
        """Put back ``writes`` in a task of its own (this one is being cancelled), once the write
        in flight (``landing``) is done, still holding the key locks until then, so no local check
        builds on the state being put back."""
        if not writes:
            return
        task = asyncio.ensure_future(wait_for_store(self._settle_and_undo(writes, landing), UNDO_TIMEOUT))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        with contextlib.suppress(BaseException):  # a second cancellation: the task goes on alone
            await asyncio.shield(task)

    async def _settle_and_undo(self, writes: list[_Undo], landing: asyncio.Future[bool] | None) -> None:
        if landing is not None:
            with contextlib.suppress(Exception):  # landed or not: ``_undo`` reads which
                await landing
        await self._undo(writes)

    def _undone(self, task: asyncio.Task[None]) -> None:
        self._undoing.discard(task)
        if not task.cancelled():
            task.exception()  # a put-back that failed leaves that charge: nothing else to do

    async def _undo(self, writes: list[_Undo]) -> None:
        """Put back keys this check wrote, unless someone changed them since; a restored state
        expires when it would have (memcached cannot read an expiry back, so it is computed)."""
        for key, old, ours, limit in writes:
            value, token = await self._client.gets(key)
            if value != ours or token is None:
                continue
            if old is None:
                await self._client.delete(key)
            else:
                _, decision = limit.fn(decode(old), self.clock(), 0.0, limit.rate)
                await self._client.cas(key, old, token, expiry(decision.reset_after, time.time()))

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        values = await self._bounded(self._get_all([memcached_key(k) for k in keys]), "peek")
        now = self.clock()
        out = []
        for value, limit in zip(values, limits, strict=False):
            _, decision = limit.fn(decode(value) if value is not None else None, now, 0.0, limit.rate)
            decision.policy = limit.name
            out.append(decision)
        return out

    async def _get_all(self, mkeys: list[bytes]) -> list[bytes | None]:
        return [await self._client.get(k) for k in mkeys]

    async def reset(self, keys: Sequence[str]) -> None:
        await self._bounded(self._delete_all([memcached_key(k) for k in keys]), "reset")

    async def _delete_all(self, mkeys: list[bytes]) -> None:
        for key in mkeys:
            await self._client.delete(key)

    async def clear(self) -> None:
        """Memcached cannot list keys, so this empties the whole instance (``flush_all``):
        give ratewarden a memcached of its own if you use it."""
        await self._bounded(self._client.flush_all(), "clear")

    async def close(self) -> None:
        for task in list(self._undoing):  # give pending put-backs their (bounded) time
            with contextlib.suppress(BaseException):
                await task
        self._client.closed = True
        with contextlib.suppress(OSError, aiomcache.exceptions.ClientException):
            await self._client.close()
