"""Memcached store: the pure algorithms run here, state is swapped in with ``gets``/``cas``.

* Checks of one key made at the same time in this process are coalesced: one task holds the key
  (its local lock), takes every check queued on it, reads the state once (``gets``), runs the
  algorithm for each check in arrival order (each decision is the one it would get alone, one
  after the other) and writes the final state with one ``cas`` (``add`` for a new key). A lost
  race with another process re-reads and retries the whole batch after a jittered backoff. So a
  flood of one key costs two round trips per batch, and a key has one contender per process.
* A multi-key check reads every key with one ``gets`` and, only if all allow, writes each new
  state with ``cas``; if a later key loses its race, the keys already written are put back
  (compare and swap again) before the retry, so a check stays all or nothing. It holds its keys'
  local locks (in a fixed order), as ``adjust`` does.
* ``timeout`` bounds memcached's answers, not our own queues: it starts when a command is
  written, and when it fires with bytes from memcached arrived on that connection since (counted
  as the connection's reader is fed, or waiting unread in the kernel), it is re-armed: the reply
  is there, our loop has not read it yet. A command fails after a whole ``timeout`` with no byte
  from memcached. Waiting for a key's turn, a pool connection or our loop is not timed, but a
  waiter fails as soon as a command of the store times out (memcached went silent), and while
  memcached stays silent. So a hung memcached fails a check within about ``timeout``.
* A denied key is remembered (its state, limit and cost) until its retry time: it is answered
  from that cache without a round trip, with the decision the algorithm gives for that state
  (``cached_rejection``, ``cached_rejections``; ``cache=False`` turns it off).
* A command that does not complete (timeout, cancellation, a closed store) closes its
  connection: its reply may be unread. A check whose write does not complete lets it finish
  (within ``UNDO_TIMEOUT``), then puts back what it wrote, still holding its keys, so a check
  that got no answer charges nothing. (A caller that goes away while its batch's write is in
  flight may stay charged, at most once.)
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
import random
import select
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..algorithms import State
from ..charges import adjusted_state
from ..decision import Decision
from ..errors import ConfigurationError
from ..limits import Limit
from .base import Store, StoreError, combine, no_reply
from .rejections import RejectionCache
from .urls import parse_store_url

try:
    import aiomcache
    from aiomcache.pool import Connection, MemcachePool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MemcachedStore needs aiomcache: pip install 'ratewarden[memcached]'") from exc

__all__ = ["MemcachedStore", "memcached_key"]

_T = TypeVar("_T")
_Undo = tuple[bytes, "bytes | None", bytes, Limit]  # key, value before, value written, its limit
_Read = tuple["bytes | None", "int | None"]  # a value and its CAS token (None: no such key)

THIRTY_DAYS = 30 * 86400
UNDO_TIMEOUT = 5.0  # seconds a put-back of an interrupted check may take (it runs in the background)
LATE = 0.002  # a timer this late was held up by our own loop: it gets one more timeout
BACKOFF = 0.0005  # seconds: the first CAS-conflict backoff's upper bound, doubled per conflict
BACKOFF_MAX = 0.02
_MAX_KEY = 250
_STORAGE_REPLIES = (b"STORED", b"NOT_STORED", b"EXISTS", b"NOT_FOUND")


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


# -- the protocol (text): commands and their replies ------------------------------------------


def _storage(command: bytes, key: bytes, data: bytes, exptime: int, token: int | None = None) -> bytes:
    head = b"%s %s 0 %d %d" % (command, key, exptime, len(data))
    if token is not None:
        head += b" %d" % token
    return head + b"\r\n" + data + b"\r\n"


def _write_command(key: bytes, data: bytes, token: int | None, exptime: int) -> bytes:
    """``add`` for a key not there (no token), else ``cas``."""
    return _storage(b"add", key, data, exptime) if token is None else _storage(b"cas", key, data, exptime, token)


async def _line(reader: asyncio.StreamReader) -> bytes:
    line = await reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionResetError("memcached closed the connection")
    return line[:-2]


def _values_reader(keys: Sequence[bytes]) -> Callable[[asyncio.StreamReader], Awaitable[list[_Read]]]:
    """The reader of a ``get``/``gets`` reply for ``keys``: their (value, token) in that order."""

    async def read(reader: asyncio.StreamReader) -> list[_Read]:
        found: dict[bytes, _Read] = {}
        while True:
            line = await _line(reader)
            if line == b"END":
                return [found.get(k, (None, None)) for k in keys]
            terms = line.split()
            if len(terms) < 4 or terms[0] != b"VALUE":
                raise aiomcache.exceptions.ClientException("get failed", line)
            data = await reader.readexactly(int(terms[3]) + 2)
            found[terms[1]] = (data[:-2], int(terms[4]) if len(terms) > 4 else None)

    return read


async def _stored(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line not in _STORAGE_REPLIES:
        raise aiomcache.exceptions.ClientException("store failed", line)
    return line == b"STORED"


async def _deleted(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line not in (b"DELETED", b"NOT_FOUND"):
        raise aiomcache.exceptions.ClientException("delete failed", line)
    return line == b"DELETED"


async def _ok(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line != b"OK":
        raise aiomcache.exceptions.ClientException("flush_all failed", line)
    return True


# -- connections: arrivals counted, opening bounded ------------------------------------------


class _Heard:
    """How many times data arrived (on one connection, or on all of a store's)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def _heard_on(conn: Connection, store_heard: _Heard) -> _Heard:
    """The arrival counter of ``conn``, hooked into its reader's ``feed_data`` on first use."""
    reader = conn.reader
    heard: _Heard | None = getattr(reader, "_rw_heard", None)
    if heard is None:
        heard = _Heard()
        own = heard
        feed = reader.feed_data

        def counted(data: bytes) -> None:
            own.count += 1
            store_heard.count += 1
            feed(data)

        setattr(reader, "feed_data", counted)  # noqa: B010 - an instance attribute over the method
        setattr(reader, "_rw_heard", heard)  # noqa: B010
    return heard


def _readable(conn: Connection) -> bool:
    """Whether bytes wait unread in the kernel for ``conn`` (our loop has not read them yet)."""
    sock = conn.writer.transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        fd = sock.fileno()
        if fd < 0:
            return False
        if hasattr(select, "poll"):  # no FD_SETSIZE limit (a busy server has fds above 1024)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


class _Pool(MemcachePool):
    """aiomcache's pool, with connecting bounded (a connect is not a command, so not re-armed)."""

    connect_timeout = 1.0

    async def _create_new_conn(self) -> Connection | None:
        return await asyncio.wait_for(super()._create_new_conn(), self.connect_timeout)


class _Client(aiomcache.Client):
    closed = False  # then a command closes its connection when done


class _Sent:
    """A command written on ``conn``, its reply read by ``task``."""

    __slots__ = ("conn", "heard", "seen", "task")

    def __init__(self, conn: Connection, heard: _Heard, task: asyncio.Future[Any]) -> None:
        self.conn = conn
        self.heard = heard
        self.seen = heard.count
        self.task = task


class _Check:
    """A single-key check queued for its key's batch."""

    __slots__ = ("cost", "future", "limit")

    def __init__(self, limit: Limit, cost: float, future: asyncio.Future[Decision]) -> None:
        self.limit = limit
        self.cost = cost
        self.future = future


class _Queue:
    """The checks waiting for one key's next batch, and the task running its batches."""

    __slots__ = ("key", "leader", "settling", "waiting")

    def __init__(self, key: str) -> None:
        self.key = key
        self.waiting: list[_Check] = []
        self.leader: asyncio.Future[None] | None = None
        self.settling = False  # a write that got no answer is being settled (and put back)


def _releaser(lock: asyncio.Lock) -> Callable[[bool], None]:
    return lambda _: lock.release()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class MemcachedStore(Store):
    """Limits kept in memcached, built from ``memcached://host:port``.

    Keyword arguments override the URL's query options of the same name.

    Args:
        url: ``memcached://host:port``, with options in its query.
        timeout: Seconds memcached may stay silent on a command (default 0.05).
        pool_size: Connections (default 8).
        retries: CAS attempts before ``StoreError``.
        cache: Answer rejections known to hold from a local cache, without a round trip (default on).
        clock: Seconds since the epoch; replace it in tests.
    """

    can_adjust = True
    # RuntimeError: another loop; EOFError: a reply cut short (asyncio.IncompleteReadError)
    client_errors = (OSError, aiomcache.exceptions.ClientException, RuntimeError, EOFError)

    def __init__(
        self,
        url: str = "memcached://127.0.0.1:11211",
        *,
        timeout: float | None = None,
        pool_size: int | None = None,
        retries: int = 50,
        cache: bool | None = None,
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
        self.cache_rejections = bool(cache if cache is not None else cfg.option("cache", 1))
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
        self._pool = self._client._pool = _Pool(host, port, minsize=size, maxsize=size)
        self._pool.connect_timeout = max(1.0, self.timeout)
        self._locks: dict[bytes, list[Any]] = {}  # key -> [asyncio.Lock, users]
        self._queues: dict[bytes, _Queue] = {}  # key -> checks waiting for its next batch
        self._leaders: set[asyncio.Future[None]] = set()  # tasks running batches
        self._undoing: set[asyncio.Future[None]] = set()  # put-backs of interrupted checks
        self._rejections = RejectionCache()
        self.cached_rejections = 0  # checks answered from the rejection cache
        self._heard = _Heard()  # data arrivals on every connection
        self._silent_at = -1  # ``_heard.count`` when a command last timed out (-1: not silent)
        self._silence: asyncio.Future[None] | None = None  # resolved when a command times out
        self.cas_conflicts = 0  # lost compare-and-swap races (retried)

    def __repr__(self) -> str:
        return f"MemcachedStore({self.url!r})"

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        if not len(self._rejections):
            return None
        cached = self._rejections.lookup(keys, costs, self.clock())
        if cached is not None:
            self.cached_rejections += 1
        return cached

    # -- the check -------------------------------------------------------------------------

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        if len(self._rejections):
            cached = self._rejections.lookup(keys, costs, self.clock())
            if cached is not None:
                self.cached_rejections += 1
                return cached
        if len(keys) == 1:
            return await self._coalesced(keys[0], limits[0], costs[0])
        mkeys = [memcached_key(k) for k in keys]
        return await self._run(mkeys, lambda: self._cas_hit(keys, mkeys, limits, costs), "hit")

    async def _coalesced(self, key: str, limit: Limit, cost: float) -> Decision:
        """A single-key check, decided in its key's next batch."""
        mkey = memcached_key(key)
        queue = self._queues.get(mkey)
        if queue is None:
            queue = self._queues[mkey] = _Queue(key)
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        queue.waiting.append(_Check(limit, cost, future))
        if queue.leader is None:
            leader = queue.leader = asyncio.ensure_future(self._lead(mkey, queue))
            self._leaders.add(leader)
            leader.add_done_callback(self._leaders.discard)
        if queue.settling:  # the key waits for a write memcached did not answer
            done, _ = await asyncio.wait((future,), timeout=self.timeout)
            if not done:
                future.set_exception(no_reply(repr(self), "hit", self.timeout))
        return await future

    async def _lead(self, mkey: bytes, queue: _Queue) -> None:
        """Run ``queue``'s batches, each holding the key's local lock, until no check waits."""
        try:
            while queue.waiting:
                try:
                    await self._locked([mkey], lambda: self._batch(mkey, queue))
                except BaseException as exc:  # the lock wait failed (memcached silent) or the store closes
                    self._fail(queue.waiting, exc)
                    queue.waiting = []
                    if not isinstance(exc, Exception):
                        raise
        finally:
            queue.leader = None
            if queue.waiting:  # pragma: no cover - only a cancelled leader leaves checks behind
                self._fail(queue.waiting, asyncio.CancelledError())
                queue.waiting = []
            if self._queues.get(mkey) is queue:
                del self._queues[mkey]

    async def _batch(self, mkey: bytes, queue: _Queue) -> None:
        """Decide every check waiting on ``queue``: one read, the algorithm per check in arrival
        order, one write of the final state (the whole batch again on a lost CAS race)."""
        checks = [c for c in queue.waiting if not c.future.done()]
        queue.waiting = []
        for attempt in range(self.retries):
            if not checks:
                return
            try:
                ((value, token),) = await self._command(b"gets " + mkey + b"\r\n", _values_reader((mkey,)))
            except BaseException as exc:
                self._fail(checks, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            checks = [c for c in checks if not c.future.done()]  # callers gone meanwhile
            now = self.clock()
            before = decode(value) if value is not None else None
            state = before
            decisions: list[Decision] = []
            deciding: Decision | None = None  # the allowance that made the final state
            limit = checks[0].limit if checks else None
            for check in checks:
                new_state, decision = check.limit.fn(state, now, check.cost, check.limit.rate)
                decision.policy = check.limit.name
                decisions.append(decision)
                if decision.allowed and new_state is not None:
                    state, deciding, limit = new_state, decision, check.limit
            if deciding is None or state is None or limit is None:  # nothing to write
                self._decided(queue.key, checks, decisions, state, now)
                return
            data = encode(state)
            payload = _write_command(mkey, data, token, expiry(deciding.reset_after, time.time()))
            try:
                ok = await self._write(payload, [(mkey, value, data, limit)], queue)
            except BaseException as exc:
                self._fail(checks, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            if ok:
                self._decided(queue.key, checks, decisions, state, now)
                return
            self.cas_conflicts += 1
            await asyncio.sleep(random.uniform(0.0, min(BACKOFF_MAX, BACKOFF * 2.0**attempt)))
            checks = [c for c in checks if not c.future.done()]
        self._fail(checks, StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts"))

    def _decided(
        self, key: str, checks: list[_Check], decisions: list[Decision], state: State | None, now: float
    ) -> None:
        """Answer a batch's checks; remember the key when its last check of a cost was denied."""
        self._rejections.forget((key,))
        denied: _Check | None = None
        for check, decision in zip(checks, decisions, strict=True):
            if not check.future.done():
                check.future.set_result(decision)
            if not decision.allowed:
                denied = check
        if denied is not None and self.cache_rejections:
            _, decision = denied.limit.fn(state, now, denied.cost, denied.limit.rate)
            decision.policy = denied.limit.name
            if not decision.allowed and 0 < decision.retry_after < math.inf:
                self._rejections.remember(
                    key, denied.cost, now + decision.retry_after, decision, state, denied.limit, now
                )

    def _fail(self, checks: list[_Check], exc: BaseException) -> None:
        """Fail ``checks`` with ``exc`` as the store reports it (``StoreError``)."""
        error: BaseException
        if isinstance(exc, asyncio.TimeoutError):
            error = no_reply(repr(self), "hit", self.timeout)
        elif isinstance(exc, self.client_errors):
            error = self.store_error("hit", exc)
        else:
            error = exc
        for check in checks:
            if not check.future.done():
                if isinstance(error, asyncio.CancelledError):
                    check.future.cancel()
                else:
                    check.future.set_exception(error)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) ``amounts[i]`` on ``keys[i]`` without a limit
        check, exactly as ``ratewarden.charges.adjusted_state`` computes it."""
        if not len(keys) == len(limits) == len(amounts):
            raise ValueError("adjust: keys, limits and amounts must have the same length")
        self._rejections.forget(keys)
        mkeys = [memcached_key(k) for k in keys]
        try:
            return await self._run(mkeys, lambda: self._cas_adjust(mkeys, limits, amounts), "adjust")
        finally:
            self._rejections.forget(keys)

    async def _run(self, mkeys: list[bytes], operation: Callable[[], Awaitable[_T]], name: str) -> _T:
        """``operation`` (called ``name`` in errors) under this process's per-key locks, with the
        error mapping."""
        return await self._mapped(self._locked(mkeys, operation), name)

    async def _mapped(self, awaitable: Awaitable[_T], operation: str) -> _T:
        """``awaitable``, every failure as ``StoreError`` naming ``operation``."""
        try:
            return await awaitable
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
                lock: asyncio.Lock = entry[0]
                if lock.locked():
                    await self._wait_ours(asyncio.ensure_future(lock.acquire()), _releaser(lock))
                else:
                    await lock.acquire()
                acquired.append(lock)
            return await operation()
        finally:
            for held in acquired:
                held.release()
            for key in users:
                entry = self._locks[key]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    async def _cas_adjust(
        self, mkeys: list[bytes], limits: Sequence[Limit], amounts: Sequence[float]
    ) -> list[Decision]:
        out: list[Decision] = []
        for key, limit, amount in zip(mkeys, limits, amounts, strict=True):
            for attempt in range(self.retries):
                ((value, token),) = await self._command(b"gets " + key + b"\r\n", _values_reader((key,)))
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
                        await self._command(b"delete " + key + b"\r\n", _deleted)
                        break
                    ttl = empty.reset_after
                data = encode(new_state)
                if await self._command(_write_command(key, data, token, expiry(ttl, time.time())), _stored):
                    break
                self.cas_conflicts += 1
                await asyncio.sleep(random.uniform(0.0, min(BACKOFF_MAX, BACKOFF * 2.0**attempt)))
            else:
                raise StoreError(f"{self!r}: adjust: gave up after {self.retries} compare-and-swap conflicts")
            out.append(decision)
        return out

    async def _read_all(self, mkeys: list[bytes]) -> list[_Read]:
        """Every key's (value, token), in one ``gets``."""
        unique = list(dict.fromkeys(mkeys))
        found = dict(zip(unique, await self._command(b"gets " + b" ".join(unique) + b"\r\n", _values_reader(unique)), strict=True))
        return [found[k] for k in mkeys]

    async def _cas_hit(
        self, keys: Sequence[str], mkeys: list[bytes], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        for attempt in range(self.retries):
            read = await self._read_all(mkeys)
            now = self.clock()
            decisions: list[Decision] = []
            befores: list[State | None] = []
            states: list[State | None] = []
            for (value, _token), limit, cost in zip(read, limits, costs, strict=False):
                state = decode(value) if value is not None else None
                new_state, decision = limit.fn(state, now, cost, limit.rate)
                decision.policy = limit.name
                decisions.append(decision)
                befores.append(state)
                states.append(new_state)
            if not all(d.allowed for d in decisions):
                decided = combine(decisions)
                if self.cache_rejections and 0 < decided.retry_after < math.inf:
                    until = now + decided.retry_after
                    for i, key in enumerate(keys):
                        self._rejections.remember(key, costs[i], until, decisions[i], befores[i], limits[i], now)
                return decided
            self._rejections.forget(keys)
            wall = time.time()
            written: list[_Undo] = []
            for i, mkey in enumerate(mkeys):
                new_state = states[i]
                if new_state is None:
                    continue
                value, token = read[i]
                data = encode(new_state)
                payload = _write_command(mkey, data, token, expiry(decisions[i].reset_after, wall))
                written.append((mkey, value, data, limits[i]))
                if not await self._write(payload, written, None):
                    self.cas_conflicts += 1
                    written.pop()
                    await self._undo(written)
                    await asyncio.sleep(random.uniform(0.0, min(BACKOFF_MAX, BACKOFF * 2.0**attempt)))
                    break
            else:
                return combine(decisions)
        raise StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts")

    # -- commands ----------------------------------------------------------------------------

    async def _command(self, payload: bytes, read: Callable[[asyncio.StreamReader], Awaitable[_T]]) -> _T:
        """Send ``payload`` and read its reply with ``read``, within the timeout (see the module
        docstring). A command that does not complete closes its connection."""
        conn = await self._acquire()
        done = False
        try:
            sent = self._send(conn, payload, read)
            try:
                result: _T = await self._answer(sent)
            finally:
                if not sent.task.done():
                    sent.task.cancel()
                    sent.task.add_done_callback(_retrieve)
            done = True
            return result
        finally:
            await self._release(conn, done)

    async def _write(self, payload: bytes, written: list[_Undo], queue: _Queue | None) -> bool:
        """Send a write (``add``/``cas``) whose undo is ``written`` (this write last): whether it
        was stored. A write that gets no answer (timeout, lost connection, cancelled caller) is
        let finish, then put back, in the background but still holding the keys (``queue``, if
        any, is marked settling meanwhile); its error is raised at once."""
        try:
            conn = await self._acquire()
        except BaseException:
            # Never sent (cancelled or failed while waiting for a connection): the keys this check
            # wrote before it are put back, so a check of several keys charges all or nothing.
            if len(written) > 1:
                await self._put_back_unsent(written[:-1], queue)
            raise
        sent = self._send(conn, payload, _stored)
        try:
            ok: bool = await self._answer(sent)
        except BaseException:
            if queue is not None:
                queue.settling = True
            try:
                await self._undo_interrupted(written, asyncio.ensure_future(self._settle(sent)))
            finally:
                if queue is not None:
                    queue.settling = False
            raise
        await self._release(conn, True)
        return ok

    async def _put_back_unsent(self, written: list[_Undo], queue: _Queue | None) -> None:
        """Put back ``written`` (the keys written before a write that was never sent), in the
        background as an interrupted write's are, holding the keys meanwhile."""
        landed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        landed.set_result(None)
        if queue is not None:
            queue.settling = True
        try:
            await self._undo_interrupted(written, landed)
        finally:
            if queue is not None:
                queue.settling = False

    async def _settle(self, sent: _Sent) -> None:
        """Wait (at most ``UNDO_TIMEOUT``) for an unanswered write's reply, then release its connection."""
        done, _ = await asyncio.wait((sent.task,), timeout=UNDO_TIMEOUT)
        if not done:
            sent.task.cancel()
        sent.task.add_done_callback(_retrieve)
        await self._release(sent.conn, bool(done) and sent.task.exception() is None)

    async def _acquire(self) -> Connection:
        """A pool connection; waiting for one is not timed, but fails when memcached goes silent."""
        pool = self._pool
        if not pool._pool.empty() and pool.size() >= pool._minsize:
            return await pool.acquire()  # an idle one (or a reconnect, bounded by connect_timeout)
        conn: Connection = await self._wait_ours(asyncio.ensure_future(pool.acquire()), self._return_unused)
        return conn

    def _return_unused(self, conn: Connection) -> None:
        self._pool.release(conn)

    def _send(self, conn: Connection, payload: bytes, read: Callable[[asyncio.StreamReader], Awaitable[_T]]) -> _Sent:
        heard = _heard_on(conn, self._heard)
        sent = _Sent(conn, heard, asyncio.ensure_future(read(conn.reader)))
        conn.writer.write(payload)
        return sent

    async def _release(self, conn: Connection, done: bool) -> None:
        """Return ``conn`` to the pool, or close it: when its command did not complete (its reply
        may be unread) or the store is closed (and then those the pool opened meanwhile)."""
        closed = self._client.closed
        if (not done or closed) and conn.reader.exception() is None:
            conn.reader.set_exception(ConnectionAbortedError("the store was closed" if closed else "interrupted"))
        self._pool.release(conn)  # closes it when its reader holds an exception
        if closed:
            await self._pool.clear()

    async def _answer(self, sent: _Sent) -> Any:
        """``sent``'s reply. The timeout starts at the write and is re-armed while memcached is
        heard from (bytes arrived on the connection since the last look, or waiting in the kernel),
        once for a timer our loop ran late; else ``asyncio.TimeoutError`` (the reply task runs on)."""
        task = sent.task
        loop = asyncio.get_running_loop()
        seen = sent.seen
        late = 1
        while True:
            timeout = self.timeout
            due = loop.time() + timeout
            done, _ = await asyncio.wait((task,), timeout=timeout)
            if done:
                return task.result()
            heard = sent.heard.count
            if heard != seen or _readable(sent.conn):
                seen = heard
                continue
            if late and loop.time() - due > LATE:
                late -= 1
                continue
            self._went_silent()
            raise asyncio.TimeoutError

    def _went_silent(self) -> None:
        """A command got no byte for a whole timeout: wake every waiter (they fail), and fail those
        waiting while nothing is heard from memcached."""
        self._silent_at = self._heard.count
        signal = self._silence
        self._silence = None
        if signal is not None and not signal.done():
            signal.set_result(None)
        for queue in list(self._queues.values()):
            if queue.waiting:
                self._fail(queue.waiting, asyncio.TimeoutError())
                queue.waiting = []

    def _silent(self) -> bool:
        """Nothing heard from memcached since a command last timed out."""
        if self._silent_at < 0:
            return False
        if self._heard.count != self._silent_at:
            self._silent_at = -1
            return False
        return True

    async def _wait_ours(self, task: asyncio.Future[_T], unused: Callable[[_T], None]) -> _T:
        """``task``, a wait of ours (a key's lock, a pool connection): not timed, but given up with
        ``asyncio.TimeoutError`` when a command of the store times out meanwhile, or once a timeout
        passes while memcached stays silent. What ``task`` gets after it is given up goes to ``unused``."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                signal = self._silence
                if signal is None or signal.done() or signal.get_loop() is not loop:
                    signal = self._silence = loop.create_future()
                await asyncio.wait((task, signal), timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    return task.result()
                if signal.done() or self._silent():
                    raise asyncio.TimeoutError
        except BaseException:
            if not task.done():
                task.cancel()

            def drop(done: asyncio.Future[_T]) -> None:
                if not done.cancelled() and done.exception() is None:
                    unused(done.result())

            task.add_done_callback(drop)
            raise

    # -- put-backs -----------------------------------------------------------------------------

    async def _undo_interrupted(self, writes: list[_Undo], landing: asyncio.Future[None]) -> None:
        """Put back ``writes`` in a task of its own (this one may be cancelled), once the write in
        flight (``landing``) is settled, still holding the key locks until then, so no local check
        builds on the state being put back."""
        task = asyncio.ensure_future(asyncio.wait_for(self._settle_and_undo(writes, landing), UNDO_TIMEOUT * 2))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        with contextlib.suppress(BaseException):  # a second cancellation: the task goes on alone
            await asyncio.shield(task)

    async def _settle_and_undo(self, writes: list[_Undo], landing: asyncio.Future[None]) -> None:
        with contextlib.suppress(Exception):  # landed or not: ``_undo`` reads which
            await landing
        await self._undo(writes)

    def _undone(self, task: asyncio.Future[None]) -> None:
        self._undoing.discard(task)
        if not task.cancelled():
            task.exception()  # a put-back that failed leaves that charge: nothing else to do

    async def _undo(self, writes: list[_Undo]) -> None:
        """Put back keys this check wrote, unless someone changed them since; a restored state
        expires when it would have (memcached cannot read an expiry back, so it is computed)."""
        for key, old, ours, limit in writes:
            ((value, token),) = await self._command(b"gets " + key + b"\r\n", _values_reader((key,)))
            if value != ours or token is None:
                continue
            if old is None:
                await self._command(b"delete " + key + b"\r\n", _deleted)
            else:
                _, decision = limit.fn(decode(old), self.clock(), 0.0, limit.rate)
                await self._command(_storage(b"cas", key, old, expiry(decision.reset_after, time.time()), token), _stored)

    # -- the rest of the Store API -------------------------------------------------------------

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        values = await self._mapped(self._get_all([memcached_key(k) for k in keys]), "peek")
        now = self.clock()
        out = []
        for value, limit in zip(values, limits, strict=False):
            _, decision = limit.fn(decode(value) if value is not None else None, now, 0.0, limit.rate)
            decision.policy = limit.name
            out.append(decision)
        return out

    async def _get_all(self, mkeys: list[bytes]) -> list[bytes | None]:
        if not mkeys:
            return []
        unique = list(dict.fromkeys(mkeys))
        read = await self._command(b"get " + b" ".join(unique) + b"\r\n", _values_reader(unique))
        found = {k: value for k, (value, _) in zip(unique, read, strict=True)}
        return [found[k] for k in mkeys]

    async def reset(self, keys: Sequence[str]) -> None:
        self._rejections.forget(keys)
        await self._mapped(self._delete_all([memcached_key(k) for k in keys]), "reset")

    async def _delete_all(self, mkeys: list[bytes]) -> None:
        for key in mkeys:
            await self._command(b"delete " + key + b"\r\n", _deleted)

    async def clear(self) -> None:
        """Memcached cannot list keys, so this empties the whole instance (``flush_all``):
        give ratewarden a memcached of its own if you use it."""
        self._rejections.clear()
        await self._mapped(self._command(b"flush_all\r\n", _ok), "clear")

    async def close(self) -> None:
        for task in list(self._leaders):  # batches under way end (bounded by their commands)
            with contextlib.suppress(BaseException):
                await task
        for task in list(self._undoing):  # give pending put-backs their (bounded) time
            with contextlib.suppress(BaseException):
                await task
        self._client.closed = True
        with contextlib.suppress(OSError, aiomcache.exceptions.ClientException):
            await self._client.close()
