"""Redis / Valkey store: every check is one server-side Lua script, coalesced into pipelines.

* One ``EVALSHA`` per check evaluates all its limits (any mix of the seven algorithms) all or
  nothing, on the server clock (``TIME``), and returns the deciding limit's full decision, so
  headers need no second call. ``NOSCRIPT`` falls back to ``EVAL``, which reloads the script.
* Checks started in the same event-loop tick go out as one pipeline (``coalesce``); at most
  ``pool_size`` pipelines are in flight, later checks queue into the next one.
* Rejections are remembered locally until their retry time (``cache``): a key known to be over
  its limit is answered without a round trip. Only denials are cached, so it never allows
  anything the server would deny.
* Every check is bounded by ``timeout`` (``2 * timeout`` when the event loop itself ran the
  timer late); failures raise ``StoreError`` naming the URL. Each script carries the moment
  its caller stops waiting (on the server clock): a script that only runs after that, e.g. once
  a paused server resumes, charges nothing, so a check answered as failed is never charged.
* Redis Cluster: keys of one (scope, client key) share a hash tag, so such a check is one
  script on one slot. A check whose keys span slots (rules keyed on different identities)
  first peeks every slot and charges only when all allow; see docs/stores.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from ..decision import Decision
from ..limits import Limit
from .base import Store, StoreError, combine
from .deadline import EXTENSIONS, LATE, wait_for_store
from .urls import StoreURL, parse_store_url

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.crc import key_slot
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError, ReadOnlyError, RedisError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "RedisStore needs the redis client: pip install 'ratewarden[redis]'"
    ) from exc

__all__ = ["SCRIPT", "SCRIPT_SHA", "RedisStore"]

SCRIPT = resources.files("ratewarden.stores").joinpath("lua/check.lua").read_text(encoding="utf-8")
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()

ALGORITHM_IDS = {
    "fixed_window": "1",
    "sliding_window": "2",
    "sliding_log": "3",
    "token_bucket": "4",
    "token_bucket_debt": "5",
    "leaky_bucket": "6",
    "gcra": "7",
}
_ONE = "1"
_CACHE_MAX = 100_000
_LIMIT_CACHE_MAX = 4096  # packed arguments of this many limits; the oldest is evicted when full
_MAX_EXTENSIONS = EXTENSIONS  # a busy loop can stretch a check's wait to at most 2 timeouts
# A script must start within this share of the timeout, leaving the rest for its reply to travel.
_DEADLINE_SHARE = 0.9
_Reply = Any
_V = TypeVar("_V")
# Pre-encoded RESP pieces of the EVALSHA command (standalone and Sentinel send raw bytes).
_SHA_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n" + SCRIPT_SHA.encode() + b"\r\n"
_SCRIPT_B = SCRIPT.encode()
_EVAL_HEAD = b"$4\r\nEVAL\r\n$%d\r\n%s\r\n" % (len(_SCRIPT_B), _SCRIPT_B)
_COST_ONE = b"$1\r\n1\r\n"
_MODES = {m: b"$1\r\n%s\r\n" % m.encode() for m in ("h", "p", "a")}
_MODE_BULKS = tuple(_MODES.values())
_ONE_KEY_HEAD = b"*12\r\n" + _SHA_HEAD + b"$1\r\n1\r\n"  # 12 = EVALSHA sha 1 key h now + 6 per limit
_HIT = _MODES["h"]


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _key_bytes(key: str) -> bytes:
    """A key as UTF-8; lone surrogates (from undecodable client input) pass through as the
    memory and Memcached stores accept them."""
    try:
        return key.encode()
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogatepass")


class _Batch:
    """Checks queued in one event-loop tick, sent as one pipeline. An item's request is the
    packed command tail (standalone, Sentinel) or ``(keys, args)`` (Cluster, via redis-py)."""

    __slots__ = ("clock", "due", "extensions", "items", "started", "task", "timer")

    def __init__(self, due: float, clock: Any) -> None:
        self.items: list[tuple[Any, asyncio.Future[_Reply]]] = []
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.due = due
        self.clock = clock  # the scripts' clock argument (their deadline): bytes packed, str on Cluster
        self.extensions = 0
        self.started = False  # its task began running (cancelling it before would skip its cleanup)


class RedisStore(Store):
    """Limits kept in Redis or Valkey (standalone, Sentinel or Cluster), built from a URL.

    Keyword arguments override the URL's query options: ``timeout`` (seconds per check,
    default 0.025), ``connect_timeout`` (default 1), ``pool_size`` (default 8), ``coalesce``
    and ``cache`` (default on). ``prefix`` is what ``clear`` deletes (``<prefix>:*``).
    ``clock`` replaces the server clock (tests only: it makes time deterministic).
    """

    can_adjust = True
    server_clock = True  # the scripts read the server's TIME (one clock for every process)

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        pool_size: int | None = None,
        coalesce: bool | None = None,
        cache: bool | None = None,
        prefix: str = "rw",
        clock: Callable[[], float] | None = None,
    ) -> None:
        cfg = parse_store_url(url, ("standalone", "sentinel", "cluster"))
        self.url = cfg.text
        self.kind = cfg.kind
        # Cluster pipelines go through redis-py's slot routing (slower than our packed path).
        default_timeout = 0.1 if cfg.kind == "cluster" else 0.025
        self.timeout = float(timeout if timeout is not None else cfg.option("timeout", default_timeout))  # type: ignore[arg-type]
        connect = float(connect_timeout if connect_timeout is not None else cfg.option("connect_timeout", 1.0))  # type: ignore[arg-type]
        self.pool_size = int(pool_size if pool_size is not None else cfg.option("pool_size", 8))  # type: ignore[call-overload]
        self.coalesce = bool(coalesce if coalesce is not None else cfg.option("coalesce", 1))
        self.cache_rejections = bool(cache if cache is not None else cfg.option("cache", 1))
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout!r} seconds")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {self.pool_size}")
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            path = cfg.options.get(name)
            if path is not None and not os.path.isfile(str(path)):
                raise ValueError(f"store URL {self.url!r}: {name} file {path!r} does not exist")
        self.prefix = prefix
        self.clock = clock
        self._cluster = cfg.kind == "cluster"
        self._client: Any = _make_client(cfg, connect, self.pool_size)
        self._limit_args: dict[Limit, list[str]] = {}
        self._skew: float | None = None  # server clock minus ours, measured on connect
        self._limit_packed: dict[Limit, bytes] = {}
        self._idle: list[Any] = []  # our own connections (standalone, Sentinel), one per pipeline in flight
        self._rejected: dict[str, tuple[float, float, Decision]] = {}
        self._batch: _Batch | None = None
        self._inflight = 0
        self.cached_rejections = 0  # checks answered from the rejection cache

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    # -- arguments -------------------------------------------------------------------------

    def _args_of(self, limit: Limit) -> list[str]:
        args = self._limit_args.get(limit)
        if args is None:
            rate = limit.rate
            args = [
                ALGORITHM_IDS[limit.algorithm],
                str(rate.limit),
                repr(float(rate.period)),
                str(rate.capacity),
                repr(float(rate.max_debt)),
            ]
            _remember(self._limit_args, limit, args)
        return args

    def _packed(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], clock: bytes
    ) -> bytes:
        """The whole ``EVALSHA`` command in RESP: numkeys, keys, mode, clock (the batch's
        deadline), then the cached per-limit arguments and each cost."""
        if len(keys) == 1 and mode == "h" and self.clock is None:  # the common check: one format
            packed = self._limit_packed.get(limits[0])
            if packed is not None:
                try:
                    key_b = keys[0].encode()
                except UnicodeEncodeError:
                    key_b = _key_bytes(keys[0])
                cost = costs[0]
                return b"%s$%d\r\n%s\r\n%s%s%s%s" % (
                    _ONE_KEY_HEAD, len(key_b), key_b, _HIT, clock, packed,
                    _COST_ONE if cost == 1 else _bulk(repr(float(cost))),
                )
        parts = [b"*%d\r\n" % (5 + len(keys) + 6 * len(limits)), _SHA_HEAD, b"$%d\r\n%d\r\n" % (len(str(len(keys))), len(keys))]
        for key in keys:
            key_b = _key_bytes(key)
            parts.append(b"$%d\r\n%s\r\n" % (len(key_b), key_b))
        parts.append(_MODES[mode])
        parts.append(clock if self.clock is None else _bulk(repr(float(self.clock()))))
        cache = self._limit_packed
        for limit, cost in zip(limits, costs, strict=False):
            packed = cache.get(limit)
            if packed is None:
                packed = b"".join(_bulk(a) for a in self._args_of(limit))
                _remember(cache, limit, packed)
            parts.append(packed)
            parts.append(_COST_ONE if cost == 1 else _bulk(repr(float(cost))))
        return b"".join(parts)

    def _deadline(self, wall_due: float) -> str:
        """The scripts' clock argument: minus the server time after which a script must not run
        (the caller has stopped waiting by then), or the test clock's time. Empty until the
        server clock's offset is known (measured on connect)."""
        if self.clock is not None:
            return repr(float(self.clock()))
        skew = self._skew
        if skew is None:
            return ""
        return "-%.4f" % (wall_due - (1 - _DEADLINE_SHARE) * self.timeout + skew)

    async def _measure_skew(self, conn: Any = None) -> None:
        """Read the server clock (``TIME``) on ``conn`` (else through the client) and keep its
        offset from ours, to within half a round trip."""
        before = time.time()
        try:
            if conn is None:
                seconds, micros = await self._client.time()
            else:
                await conn.send_command("TIME", check_health=False)
                seconds, micros = await conn.read_response()
        except ResponseError:  # TIME refused (an ACL): scripts go without a deadline
            return
        after = time.time()
        self._skew = int(seconds) + int(micros) / 1e6 - (before + after) / 2

    def _script_args(self, mode: str, limits: Sequence[Limit], costs: Sequence[float], clock: str) -> list[str]:
        args = [mode, clock if self.clock is None else repr(float(self.clock()))]
        for limit, cost in zip(limits, costs, strict=False):
            args += self._args_of(limit)
            args.append(_ONE if cost == 1 else repr(float(cost)))
        return args

    # -- the check -------------------------------------------------------------------------

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        return self._cached(keys, costs) if self._rejected else None

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        rejected = self._rejected
        if rejected:
            cached = self._cached(keys, costs)
            if cached is not None:
                return cached
        if self._cluster and len(keys) > 1 and _spans_slots(keys):
            return await self._hit_across_slots(keys, limits, costs)
        sent_at = self._now()
        reply = await self._request("h", keys, limits, costs)
        try:
            index = reply[5]
            limit = limits[index]
            decision = Decision(
                reply[0] == 1, reply[1], reply[2], float(reply[3]), float(reply[4]), limit.rate.period, limit.name
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise StoreError(f"redis store {self.url}: unexpected script reply {reply!r}") from exc
        if not decision.allowed and self.cache_rejections and 0 < decision.retry_after < math.inf:
            if len(rejected) >= _CACHE_MAX:
                self._prune(sent_at)
            rejected[keys[index]] = (sent_at + decision.retry_after, costs[index], decision)
        return decision

    def _now(self) -> float:
        return time.monotonic() if self.clock is None else self.clock()

    def _cached(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """A remembered rejection that still holds for one of these keys at this same cost."""
        rejected = self._rejected
        now = self._now()
        for key, cost in zip(keys, costs, strict=False):
            entry = rejected.get(key)
            if entry is None:
                continue
            until, cached_cost, d = entry
            if now >= until:
                del rejected[key]
            elif cost == cached_cost:  # another cost may have another retry time
                self.cached_rejections += 1
                left = until - now
                return Decision(
                    False, d.limit, d.remaining, max(0.0, d.reset_after - (d.retry_after - left)), left,
                    d.period, d.policy,
                )
        return None

    def _prune(self, now: float) -> None:
        for key in [k for k, v in self._rejected.items() if v[0] <= now]:
            del self._rejected[key]
        if len(self._rejected) >= _CACHE_MAX:
            self._rejected.clear()

    async def _hit_across_slots(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        """Cluster check whose keys live in several slots: ask every slot whether it would allow
        these costs, and charge (slot by slot, concurrently) only if all would."""
        decisions = await self._peek_at(keys, limits, costs)
        if not all(d.allowed for d in decisions):
            return combine(decisions)
        groups = _slot_groups(keys, True)
        results = await asyncio.gather(
            *(
                self.hit([keys[i] for i in idx], [limits[i] for i in idx], [costs[i] for i in idx])
                for idx in groups
            )
        )
        return combine(results)

    async def _peek_at(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], mode: str = "p"
    ) -> list[Decision]:
        """Every limit's decision for these costs: without charging (``"p"``), or after adjusting
        by them (``"a"``). One script call per slot, coalesced like checks when there is one slot."""
        groups = _slot_groups(keys, self._cluster)
        if len(groups) == 1:
            replies = [await self._request(mode, keys, limits, costs)]
        else:
            clock = self._deadline(time.time() + self.timeout)
            replies = await self._call(
                asyncio.gather(
                    *(
                        self._eval_raw(
                            [keys[i] for i in idx],
                            self._script_args(mode, [limits[i] for i in idx], [costs[i] for i in idx], clock),
                        )
                        for idx in groups
                    )
                )
            )
        out: list[Decision] = [None] * len(keys)  # type: ignore[list-item]
        for idx, reply in zip(groups, replies, strict=False):
            for j, i in enumerate(idx):
                out[i] = self._decode_peek(reply, j, limits[i])
        return out

    def _decode_peek(self, reply: _Reply, j: int, limit: Limit) -> Decision:
        b = 5 * j
        try:
            return Decision(
                reply[b] == 1, reply[b + 1], reply[b + 2], float(reply[b + 3]), float(reply[b + 4]),
                limit.rate.period, limit.name,
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise StoreError(f"redis store {self.url}: unexpected script reply {reply!r}") from exc

    # -- coalescing --------------------------------------------------------------------------

    def _request(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Awaitable[_Reply]:
        """One script call (keys on one slot): queued into the next pipeline when coalescing."""
        if not self.coalesce:
            return self._call(self._eval_one(mode, keys, limits, costs))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Reply] = loop.create_future()
        batch = self._batch
        if batch is None:
            batch = self._new_batch(loop)
        if self._cluster:
            batch.items.append(((keys, self._script_args(mode, limits, costs, batch.clock)), future))
        else:
            batch.items.append((self._packed(mode, keys, limits, costs, batch.clock), future))
        return future

    def _new_batch(self, loop: asyncio.AbstractEventLoop) -> _Batch:
        clock = self._deadline(time.time() + self.timeout)
        batch = self._batch = _Batch(loop.time() + self.timeout, clock if self._cluster else _bulk(clock))
        batch.timer = loop.call_later(self.timeout, self._expire, batch)
        if self._inflight < self.pool_size:
            loop.call_soon(self._send)
        return batch

    def _extend_deadline(self, batch: _Batch) -> None:
        """The batch is sent after its timer was re-armed (a busy loop): move the scripts'
        deadline to the new one."""
        if self.clock is not None:
            return
        old = batch.clock
        clock = self._deadline(time.time() + batch.due - asyncio.get_running_loop().time())
        if self._cluster:
            for request, _ in batch.items:
                request[1][1] = clock
            return
        new = _bulk(clock)
        for n, (command, future) in enumerate(batch.items):
            # The clock slot follows the mode (a letter); after it come only numeric arguments.
            at = max(command.rfind(mode + old) + len(mode) for mode in _MODE_BULKS)
            batch.items[n] = (command[:at] + new + command[at + len(old):], future)

    def _send(self) -> None:
        batch = self._batch
        if batch is None or batch.task is not None:
            return
        self._batch = None
        self._inflight += 1
        batch.task = asyncio.get_running_loop().create_task(self._run(batch))

    def _expire(self, batch: _Batch) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - batch.due > LATE and batch.extensions < _MAX_EXTENSIONS:
            # The timer fired late: the event loop was busy elsewhere (a CPU-bound handler, a
            # backlog of requests), so the reply may already be waiting in the socket, read only
            # after this callback. The timeout bounds the store, not the loop: measure it again.
            batch.extensions += 1
            batch.due = loop.time() + self.timeout
            batch.timer = loop.call_later(self.timeout, self._expire, batch)
            return
        error = StoreError(f"redis store {self.url}: no reply within {self.timeout * 1000:g} ms")
        for _, future in batch.items:
            if not future.done():
                future.set_exception(error)
        if self._batch is batch:  # never sent: drop it, so nothing is charged behind our back
            self._batch = None
        elif batch.task is not None and batch.started:
            batch.task.cancel()
        # else its task has not run yet: it will find every check answered, send nothing, and
        # clean up (a task cancelled before its first step would skip its ``finally``).

    async def _run(self, batch: _Batch) -> None:
        batch.started = True
        items = batch.items
        try:
            if batch.extensions:
                self._extend_deadline(batch)  # rewrites the commands in place
            items = [item for item in items if not item[1].done()]  # callers cancelled: not sent
            if not items:
                return
            if self._cluster:
                replies = await self._execute_cluster([request for request, _ in items])
            else:
                replies = await self._execute([request for request, _ in items])
            for (_, future), reply in zip(items, replies, strict=False):
                if future.done():
                    continue
                if isinstance(reply, BaseException):
                    future.set_exception(self._error(reply))
                else:
                    future.set_result(reply)
        except asyncio.CancelledError:
            pass  # the timer expired: the futures already carry the timeout
        except Exception as exc:
            error = self._error(exc)
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
        finally:
            if batch.timer is not None:
                batch.timer.cancel()
            self._inflight -= 1
            if self._batch is not None and self._batch.task is None:
                self._send()

    async def _execute(self, commands: list[bytes]) -> list[_Reply]:
        """Send packed ``EVALSHA`` commands on one connection of ours and read every reply
        (an error reply is returned as its exception). ``NOSCRIPT`` replies are sent again as
        ``EVAL``. A connection that fails before any reply was read (e.g. left stale by a
        server restart) is reconnected and tried once more, as redis-py's own retry does."""
        conn = self._idle.pop() if self._idle else self._new_connection()
        try:
            for attempt in (0, 1):
                replies: list[_Reply] = []
                try:
                    await self._exchange(conn, commands, replies)
                    break
                except (RedisConnectionError, OSError):
                    await conn.disconnect(nowait=True)
                    if attempt or replies:
                        raise
            if any(isinstance(r, ReadOnlyError) for r in replies):
                await conn.disconnect()  # a demoted primary: reconnecting asks Sentinel again
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if missing:
                again: list[_Reply] = []
                await self._exchange(conn, [commands[i].replace(_SHA_HEAD, _EVAL_HEAD, 1) for i in missing], again)
                for i, reply in zip(missing, again, strict=False):
                    replies[i] = reply
        except BaseException:
            await conn.disconnect(nowait=True)  # replies may be left unread: never reuse it as is
            self._idle.append(conn)
            raise
        self._idle.append(conn)
        return replies

    async def _exchange(self, conn: Any, commands: list[bytes], replies: list[_Reply]) -> None:
        if not conn.is_connected:
            await conn.connect()  # not left to send_packed_command: Sentinel's connect() finds the primary
            await self._measure_skew(conn)  # a new connection may be a new server
        await conn.send_packed_command(commands, check_health=False)
        # The parser itself (hiredis when installed) returns error replies as exception objects,
        # without the connection's per-reply wrapper (timeout context, health bookkeeping): our
        # own timer bounds the exchange, and any failure disconnects the connection.
        parser = getattr(conn, "_parser", None)
        read = conn.read_response if parser is None else parser.read_response
        for _ in commands:
            try:
                replies.append(await read())
            except ResponseError as exc:
                replies.append(exc)

    def _new_connection(self) -> Any:
        conn = self._client.connection_pool.make_connection()
        conn.socket_timeout = None  # every exchange is bounded by our own timer instead
        return conn

    async def _execute_cluster(self, requests: list[tuple[Sequence[str], list[str]]]) -> list[_Reply]:
        if self._skew is None:
            await self._measure_skew()  # once: later batches carry deadlines
        if len(requests) == 1:
            return [await self._eval_raw(*requests[0])]
        pipe = self._client.pipeline(transaction=False)
        for keys, args in requests:
            pipe.execute_command("EVALSHA", SCRIPT_SHA, len(keys), *keys, *args)
        replies: list[_Reply] = await pipe.execute(raise_on_error=False)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            # Once per node, after a restart or failover. Sent as one pipeline (one connection per
            # node), not one call per check, which would exhaust the nodes' connection pools.
            pipe = self._client.pipeline(transaction=False)
            for i in missing:
                keys, args = requests[i]
                pipe.execute_command("EVAL", SCRIPT, len(keys), *keys, *args)
            again = await pipe.execute(raise_on_error=False)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    # -- plain calls -----------------------------------------------------------------------

    async def _eval_one(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> _Reply:
        """One script call through the client (no coalescing), with its deadline."""
        wall_due = time.time() + self.timeout
        if self._skew is None and self.clock is None:
            await self._measure_skew()
        return await self._eval_raw(keys, self._script_args(mode, limits, costs, self._deadline(wall_due)))

    async def _eval_raw(self, keys: Sequence[str], args: list[str]) -> _Reply:
        try:
            return await self._client.execute_command("EVALSHA", SCRIPT_SHA, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.execute_command("EVAL", SCRIPT, len(keys), *keys, *args)

    async def _call(self, coro: Any) -> Any:
        """Await a client call within the timeout, turning every failure into ``StoreError``."""
        try:
            return await wait_for_store(coro, self.timeout)
        except asyncio.TimeoutError:
            raise StoreError(f"redis store {self.url}: no reply within {self.timeout * 1000:g} ms") from None
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: a loop closed under a connection
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        message = f"{type(exc).__name__}: {exc}"
        root = exc  # the reason itself (e.g. the SSL verification error), which older redis-py omits
        while (root.__cause__ or root.__context__) is not None and root is not (root.__cause__ or root.__context__):
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        if root is not exc and str(root) not in message:
            message += f" ({type(root).__name__}: {root})"
        error = StoreError(f"redis store {self.url}: {message}")
        error.__cause__ = exc  # also where the error reaches its callers through a future, not a raise
        return error

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self._peek_at(keys, limits, [0.0] * len(keys))

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Refund (negative) or penalise (positive) ``amounts`` on ``keys`` without denying, with
        the semantics of ``ratewarden.charges.adjusted_state``: a refund never gives back more
        than the whole limit, a penalty stops at the limit. One script call (per slot)."""
        if not keys:
            return []
        if not len(keys) == len(limits) == len(amounts):
            raise ValueError(f"adjust: {len(keys)} keys, {len(limits)} limits and {len(amounts)} amounts must match")
        decisions = await self._peek_at(keys, limits, amounts, "a")
        for key in keys:  # a cached rejection may no longer hold
            self._rejected.pop(key, None)
        return decisions

    async def reset(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._rejected.pop(key, None)
        if not keys:
            return
        if self._cluster:
            await self._call(asyncio.gather(*(self._client.delete(key) for key in keys)))
        else:
            await self._call(self._client.delete(*keys))

    async def clear(self) -> None:
        """Delete every ``<prefix>:*`` key (on every primary of a cluster)."""
        self._rejected.clear()

        async def scan_and_delete() -> None:
            batch: list[Any] = []
            async for key in self._client.scan_iter(match=f"{self.prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    await self._delete_many(batch)
                    batch = []
            if batch:
                await self._delete_many(batch)

        try:
            await scan_and_delete()
        except (RedisError, OSError) as exc:
            raise self._error(exc) from exc

    async def _delete_many(self, keys: list[Any]) -> None:
        if self._cluster:
            await asyncio.gather(*(self._client.delete(k) for k in keys))
        else:
            await self._client.delete(*keys)

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            for conn in self._idle:
                await conn.disconnect()
            self._idle.clear()
            await self._client.aclose()

    @property
    def client(self) -> Any:
        """The underlying redis-py client (for diagnostics such as ``INFO commandstats``)."""
        return self._client


def _slot_groups(keys: Sequence[str], cluster: bool) -> list[list[int]]:
    """Indexes of ``keys`` grouped by hash slot (one group when not on a cluster)."""
    if not cluster:
        return [list(range(len(keys)))]
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(_key_bytes(key)), []).append(i)
    return list(groups.values())


def _spans_slots(keys: Sequence[str]) -> bool:
    first = key_slot(_key_bytes(keys[0]))
    return any(key_slot(_key_bytes(k)) != first for k in keys[1:])


def _remember(cache: dict[Limit, _V], limit: Limit, value: _V) -> None:
    """Cache ``value`` for ``limit``, evicting the oldest entry when the cache is full."""
    if len(cache) >= _LIMIT_CACHE_MAX:
        del cache[next(iter(cache))]
    cache[limit] = value


def _make_client(cfg: StoreURL, connect_timeout: float, pool_size: int) -> Any:
    common: dict[str, Any] = {
        "username": cfg.username,
        "password": cfg.password,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": max(connect_timeout, 1.0),
        "decode_responses": False,
        "encoding_errors": "surrogatepass",  # keys as _key_bytes encodes them
        "client_name": cfg.options.get("client_name"),
    }
    if cfg.tls:
        common["ssl"] = True
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
            if name in cfg.options:
                common[name] = cfg.options[name]
        if "ssl_check_hostname" in cfg.options:
            common["ssl_check_hostname"] = bool(cfg.options["ssl_check_hostname"])
    if cfg.kind == "cluster":
        from redis.asyncio.cluster import ClusterNode

        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cfg.hosts],
            max_connections=max(pool_size, 4) * 4,
            retry=Retry(NoBackoff(), 2),
            **common,
        )
    retry = Retry(NoBackoff(), 1)
    if cfg.kind == "sentinel":
        sentinel_kwargs: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout,
            "socket_timeout": max(connect_timeout, 1.0),
        }
        if "sentinel_password" in cfg.options:
            sentinel_kwargs["password"] = cfg.options["sentinel_password"]
            sentinel_kwargs["username"] = cfg.options.get("sentinel_username")
        if cfg.tls:
            sentinel_kwargs.update({k: v for k, v in common.items() if k.startswith("ssl")})
        sentinel = Sentinel(cfg.hosts, sentinel_kwargs=sentinel_kwargs, **common)  # type: ignore[no-untyped-call]
        return sentinel.master_for(cfg.service, db=cfg.db, retry=retry, max_connections=pool_size * 4)
    host, port = cfg.hosts[0]
    kwargs: dict[str, Any] = {k: v for k, v in common.items() if k != "ssl"}
    kwargs["connection_class"] = _ResolvingSSLConnection if cfg.tls else _ResolvingConnection
    pool = aioredis.BlockingConnectionPool(
        host=host, port=port, db=cfg.db, max_connections=pool_size * 4, timeout=connect_timeout, retry=retry,
        **kwargs,
    )
    return aioredis.Redis(connection_pool=pool)


class _Resolving:
    """Resolve the host name in a daemon thread of its own, not in the event loop's default
    executor: ``asyncio.run`` waits for that executor on exit, so a resolver that hangs (a host
    that never resolves) would hold the program for the resolver's own timeout after ``close``."""

    host: str
    port: int
    socket_connect_timeout: float | None
    _server_hostname: str | None = None

    async def _connect(self) -> None:
        host = self.host
        addresses = await asyncio.wait_for(_resolve(host, self.port), self.socket_connect_timeout)
        self._server_hostname = host
        error: OSError | None = None
        try:
            for address in addresses:
                self.host = address
                try:
                    await super()._connect()  # type: ignore[misc]
                    return
                except OSError as exc:
                    error = exc
        finally:
            self.host = host
        raise error if error is not None else OSError(f"{host} resolved to no address")

    def _connection_arguments(self) -> dict[str, Any]:
        kwargs = dict(super()._connection_arguments())  # type: ignore[misc]
        if kwargs.get("ssl") is not None and self._server_hostname is not None:
            kwargs["server_hostname"] = self._server_hostname  # certificates name the host
        return kwargs


class _ResolvingConnection(_Resolving, aioredis.Connection):
    pass


class _ResolvingSSLConnection(_Resolving, aioredis.SSLConnection):
    pass


def _resolve(host: str, port: int) -> asyncio.Future[list[str]]:
    """The addresses of ``host`` (itself when it is one), looked up in a daemon thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[str]] = loop.create_future()
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        future.set_result([host])
        return future

    def settle(result: list[str] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or [])

    def lookup() -> None:
        result: list[str] | None = None
        error: BaseException | None = None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            result = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except OSError as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=lookup, name=f"ratewarden-resolve-{host}", daemon=True).start()
    return future
