"""``RedisStore.hit_blocking`` (and ``peek_blocking``, ``adjust_blocking``, ``reset_blocking``): the
store's operations for synchronous code (WSGI apps, threads), on redis-py's synchronous client, in
the calling thread, never on an event loop.

* The client is built on the first check, from the store's URL and options: ``redis.Redis`` on a
  ``BlockingConnectionPool`` (standalone), ``Sentinel(...).master_for`` (Sentinel) or
  ``RedisCluster``, with ``pool_limit`` connections (per node on a cluster), the store's
  ``timeout`` as the socket timeout of every read and write, ``connect_timeout`` to connect, and
  no retries of redis-py's own: a check is sent once (a resend could charge twice).
* Each check is the async path's script call, all its keys in one ``EVALSHA``: one round trip.
  A cluster check whose keys span slots peeks every slot and charges only when all allow, as
  ``RedisStore.hit`` does (``slot_groups``). A peek and an adjust are the same script in its
  ``p`` and ``a`` modes, a reset one ``DEL``: one round trip each (per slot on a cluster).
* Each new connection measures the server clock (``TIME``) and loads the script, as the async
  path's own connections do; every script then carries its caller's deadline (``clock``): a
  check that timed out here and runs later (a paused server resuming) charges nothing. A script
  refused as late charged nothing either: it is sent again with a fresh deadline, at most
  ``RESENDS`` times, then the check fails. ``NOSCRIPT`` (the server lost the script) loads it
  once (on every primary of a cluster) and sends the call again; ``EVAL`` if loading is refused.
  Behind twemproxy (``twemproxy=1``) nothing is measured or loaded: no deadline, ``EVAL`` after
  ``NOSCRIPT``.
* A check or an adjust that ran in time but whose reply came after its caller gave up is kept
  aside until its reply says what it changed, which is given back (``late``).
* At most ``pool_limit`` calls at once, one connection each: the rest wait for a turn, at most
  ``timeout`` (then ``StoreError`` naming the pool's limit). redis-py's Sentinel and Cluster
  pools raise as soon as they are exhausted; this bound keeps a burst of threads from failing.
* Failures are ``StoreError`` with the async path's reasons: ``timeout`` (no reply within
  ``timeout``: ``no reply within ...``), ``unreachable`` (refused, reset, no primary), ``error``
  (an error reply, a broken reply). So a silent server fails a check within about ``timeout``
  on an open connection (its handshake first on a new one: about twice that).

The store's rejection cache (``rejections.Denials``, safe from threads and the event loop at once)
answers a check first, as ``RedisStore.hit`` does: a key known to deny this cost costs no round
trip until its retry time (counted in ``cached_rejections``); a denying reply fills it. An adjust
or a reset invalidates the keys before and after its call, so no denial read before it survives it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...decision import Decision
from ...errors import StoreError
from ...limits import Limit
from ..base import client_error, combine, no_reply
from ..rejections import Denials
from ..urls import StoreURL
from ._redis import (
    NoBackoff,
    NoScriptError,
    RedisTimeoutError,
    ResponseError,
    SyncClusterNode,
    SyncRedisCluster,
    SyncRetry,
    SyncSentinel,
    syncredis,
)
from .clock import ScriptClock
from .errors import RESENDS, bad_reply, closed_under, pool_busy, refused_as_late, store_name
from .late import FAILURES, LATE_SHARE, LateCalls, Unanswered, eval_kept
from .protocol import SCRIPT, SCRIPT_SHA, Reply, ThreadScriptArgs, decision_at, key_bytes
from .topology import plain_handshake, pool_limit, slot_groups, spans_slots

__all__ = ["BlockingClient", "read_decisions"]

#: What the synchronous client raises when the store cannot answer (RedisClusterException: no
#: node of a cluster reachable, no node for a slot; it is no RedisError): ``late.FAILURES``.
_OPERATIONS = {"h": "hit", "p": "peek", "a": "adjust"}
_T = TypeVar("_T")


def read_decisions(out: list[Decision], idx: Sequence[int], reply: Reply, limits: Sequence[Limit], url: str) -> None:
    """Put the decisions of one slot's script reply at their keys' places in ``out`` (``idx``: the
    indexes of that slot's keys); a reply that cannot be read is ``bad_reply``. The async path's
    ``RedisStore._peek_at`` reads its replies the same way.

    Args:
        out: One decision per key of the whole call, filled in place.
        idx: Where the keys of this reply stand in ``out`` (and in ``limits``).
        reply: The script's reply for those keys, five items a key.
        limits: The limit on each key of the whole call.
        url: The store's URL, for the error.
    """
    for j, i in enumerate(idx):
        try:
            out[i] = decision_at(reply, 5 * j, limits[i])
        except (TypeError, ValueError, IndexError) as exc:
            raise bad_reply(url, reply) from exc


class BlockingClient:
    """``RedisStore``'s synchronous client and its check (see the module docstring). Nothing is
    opened before the first check; ``close`` closes what was opened, and a check made after it
    closes what it opened again."""

    def __init__(
        self, cfg: StoreURL, *, timeout: float, connect_timeout: float, pool_size: int, clock: Any,
        store: Any, rejected: Denials,
    ) -> None:
        self.cfg = cfg
        self.store = store  # its ``cache_rejections``
        self.rejected = rejected
        self.clock = clock
        self.url = cfg.text
        self.name = store_name(cfg.text)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.pool_size = pool_size
        self.cluster = cfg.kind == "cluster"
        self.size = pool_limit(cfg.kind, pool_size)
        self.script_clock = ScriptClock(timeout, clock, bool(cfg.option("twemproxy", 0)))
        self.args = ThreadScriptArgs(clock)
        self._client: Any = None
        self._others: list[Any] = []  # a Sentinel set-up's client of each Sentinel
        self._closed = False
        self._late = LateCalls(max(1, self.size // LATE_SHARE), timeout)
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked worker (gunicorn --preload) starts afresh
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _reset_in_child(ref))

    def _reset(self) -> None:
        """Fresh locks and turns (also in a forked child: its parent's threads held them). The
        client is kept: redis-py's pools drop their parent's connections in a child."""
        self._lock = threading.Lock()  # building the client
        self._clock_lock = threading.Lock()  # updating the server clock's offset
        self._turns = threading.BoundedSemaphore(self.size)
        self._late.reset()  # a child's are its parent's connections and turns

    # -- the check ---------------------------------------------------------------------------

    def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``RedisStore.hit`` in the calling thread: all or nothing, the deciding decision; a
        rejection the cache knows to hold first, without a round trip."""
        rejected = self.rejected
        if rejected.entries:
            cached = rejected.lookup(keys, costs, time.monotonic() if self.clock is None else self.clock())
            if cached is not None:
                rejected.counted()
                return cached
        if self.cluster and len(keys) > 1 and spans_slots(keys):
            return self._hit_across_slots(keys, limits, costs)
        epoch = rejected.epoch  # before the round trip: an invalidation meanwhile keeps its denial out
        sent_at = time.monotonic() if self.clock is None else self.clock()
        reply = self._call("h", keys, limits, costs)
        try:
            index = reply[5]
            limit = limits[index]
            decision = Decision(
                reply[0] == 1, reply[1], reply[2], float(reply[3]), float(reply[4]), limit.rate.period, limit.name
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise bad_reply(self.url, reply) from exc
        if not decision.allowed and self.store.cache_rejections and 0 < decision.retry_after < math.inf:
            rejected.remember(keys[index], costs[index], sent_at + decision.retry_after, decision, epoch, sent_at)
        self.store.ledger.note(keys[index], decision)
        return decision

    def _hit_across_slots(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """A cluster check whose keys live in several slots: ask every slot whether it would allow
        these costs, and charge (slot by slot) only if all would (as ``RedisStore.hit``)."""
        decisions = self.peek_at(keys, limits, costs)
        if not all(d.allowed for d in decisions):
            return combine(decisions)
        return combine([
            self.hit([keys[i] for i in idx], [limits[i] for i in idx], [costs[i] for i in idx])
            for idx in slot_groups(keys, True)
        ])

    def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``RedisStore.peek`` in the calling thread: one script call (per slot), charging nothing."""
        return self.peek_at(keys, limits, [0.0] * len(keys))

    def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``RedisStore.adjust`` in the calling thread: one script call (per slot); the rejection
        cache forgets the keys before and after it, as the async path's does."""
        if not keys:
            return []
        for _ in zip(keys, limits, amounts, strict=True):  # lengths that differ: ValueError, as ``adjust``
            pass
        self.rejected.invalidate(keys)
        try:
            return self.peek_at(keys, limits, amounts, "a")
        finally:  # a cached rejection may no longer hold (nor one read meanwhile)
            self.rejected.invalidate(keys)

    def reset(self, keys: Sequence[str]) -> None:
        """``RedisStore.reset`` in the calling thread: one ``DEL`` (per slot); the rejection cache
        forgets the keys before and after it."""
        self.rejected.invalidate(keys)
        try:
            for idx in slot_groups(keys, self.cluster) if keys else ():
                self._turn("reset", functools.partial(_delete, [key_bytes(keys[i]) for i in idx]))
        finally:
            self.rejected.invalidate(keys)

    def peek_at(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], mode: str = "p"
    ) -> list[Decision]:
        """Every limit's decision for these costs: without charging (``"p"``), or after adjusting by
        them (``"a"``). One script call per slot."""
        out: list[Decision] = [None] * len(keys)  # type: ignore[list-item]
        for idx in slot_groups(keys, self.cluster):
            reply = self._call(mode, [keys[i] for i in idx], [limits[i] for i in idx], [costs[i] for i in idx])
            read_decisions(out, idx, reply, limits, self.url)
        return out

    def _call(self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Reply:
        """One script call in a turn of the pool, its failures as ``StoreError``."""
        names = [key_bytes(k) for k in keys]
        if self.cluster:
            return self._turn(_OPERATIONS[mode], lambda client: self._eval(client, mode, names, limits, costs))
        return self._turn(
            _OPERATIONS[mode], lambda client: eval_kept(
                client.connection_pool, mode, names, keys, limits, costs, self._script_args, self._late,
                loadable=not self.script_clock.proxied,
            )
        )

    def _turn(self, operation: str, command: Callable[[Any], _T]) -> _T:
        """``command(client)`` in a turn of the pool, its failures as ``StoreError`` naming
        ``operation``. A call kept waiting for its reply (``Unanswered``) keeps the turn."""
        turns = self._turns
        if not turns.acquire(timeout=self.timeout):
            raise pool_busy(self.url, operation, self.timeout, self.size, self.pool_size)
        client = None
        kept = False
        try:
            client = self._connected(operation)
            return command(client)
        except RedisTimeoutError as exc:
            if isinstance(exc, Unanswered):
                kept = True
                self._late.keep(exc.late, turns)
            if "connect" in str(exc):  # redis-py's "Timeout connecting to server": connect_timeout
                raise client_error(self.name, operation, exc) from exc
            raise no_reply(self.name, operation, self.timeout) from exc
        except FAILURES as exc:
            raise client_error(self.name, operation, exc) from exc
        except AttributeError as exc:  # a connection closed under the call
            closed = closed_under(exc)
            if closed is exc:
                raise
            raise client_error(self.name, operation, closed) from exc
        finally:
            if not kept:
                turns.release()
            if self._closed:  # closed meanwhile, or called after close: leave nothing open
                self._close(client)
                self._late.let_go_all()

    def _script_args(self, mode: str, limits: Sequence[Limit], costs: Sequence[float]) -> list[Any]:
        """The script's arguments for one send, with a fresh deadline."""
        clock = self.script_clock.deadline(time.time() + self.timeout, strict=True)
        return list(self.args.script_args(mode, limits, costs, clock))

    # -- calls whose callers gave up -----------------------------------------------------------

    def collect_late(self) -> None:
        """Give back what the late replies that came changed (``LateCalls.collect``)."""
        self._late.collect(self.store.ledger)

    def _eval(self, client: Any, mode: str, keys: list[bytes], limits: Sequence[Limit], costs: Sequence[float]) -> Reply:
        """``EVALSHA`` with a fresh deadline; after ``NOSCRIPT`` the script is loaded once and the
        call sent again (``EVAL`` if loading is refused); refused as late (nothing charged), the
        call goes again with a fresh deadline, at most ``RESENDS`` times."""
        command, body = "EVALSHA", SCRIPT_SHA
        loaded = False
        resent = 0
        while True:
            clock = self.script_clock.deadline(time.time() + self.timeout, strict=True)
            args = self.args.script_args(mode, limits, costs, clock)
            try:
                return client.execute_command(command, body, len(keys), *keys, *args)
            except NoScriptError:
                if loaded:
                    raise
                loaded = True
                if self.script_clock.proxied or not self._load_script(client):
                    command, body = "EVAL", SCRIPT
            except ResponseError as exc:
                if resent == RESENDS or not refused_as_late(exc):
                    raise
                resent += 1

    @staticmethod
    def _load_script(client: Any) -> bool:
        """``SCRIPT LOAD`` (on every primary of a cluster): whether it was loaded (an ACL may
        refuse it; ``EVAL`` then remains)."""
        try:
            client.script_load(SCRIPT)
        except ResponseError:
            return False
        return True

    # -- the client ----------------------------------------------------------------------------

    def _connected(self, operation: str) -> Any:
        """The client, built on first use (a cluster's discovers the cluster: I/O, bounded by the
        connect timeout; other threads wait that long for it, then fail)."""
        client = self._client
        if client is not None:
            return client
        if not self._lock.acquire(timeout=self.connect_timeout + self.timeout):
            raise StoreError(f"{self.name}: {operation}: the client is still connecting", reason="timeout")
        try:
            if self._client is None:
                self._client, self._others = self._build()
            return self._client
        finally:
            self._lock.release()

    def _build(self) -> tuple[Any, list[Any]]:
        cfg = self.cfg
        common: dict[str, Any] = {
            "username": cfg.username,
            "password": cfg.password,
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.timeout,
            "decode_responses": False,
            "encoding_errors": "surrogatepass",
            "client_name": cfg.options.get("client_name"),
            "redis_connect_func": self._on_connect,
            **plain_handshake(cfg),
        }
        tls: dict[str, Any] = {}
        if cfg.tls:
            for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
                if name in cfg.options:
                    tls[name] = cfg.options[name]
            if "ssl_check_hostname" in cfg.options:
                tls["ssl_check_hostname"] = bool(cfg.options["ssl_check_hostname"])
        no_retry = SyncRetry(NoBackoff(), 0)
        if cfg.kind == "cluster":
            cluster: Any = SyncRedisCluster(
                startup_nodes=[
                    SyncClusterNode(host, port)  # type: ignore[no-untyped-call, unused-ignore]
                    for host, port in cfg.hosts
                ],
                max_connections=self.size, retry=no_retry, ssl=cfg.tls, **tls, **common,
            )
            cluster.cluster_error_retry_attempts = 0  # redis-py 5 retries by this, not by retry=
            return cluster, []
        if cfg.kind == "sentinel":
            sentinel_kwargs: dict[str, Any] = {
                "socket_connect_timeout": self.connect_timeout,
                "socket_timeout": max(self.connect_timeout, 1.0),
            }
            if "sentinel_password" in cfg.options:
                sentinel_kwargs["password"] = cfg.options["sentinel_password"]
                sentinel_kwargs["username"] = cfg.options.get("sentinel_username")
            if cfg.tls:
                sentinel_kwargs.update({"ssl": True, **tls})
            sentinel = SyncSentinel(  # type: ignore[no-untyped-call, unused-ignore]
                cfg.hosts, sentinel_kwargs=sentinel_kwargs, ssl=cfg.tls, **tls, **common
            )
            primary = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
                cfg.service, db=cfg.db, retry=no_retry, max_connections=self.size
            )
            return primary, list(sentinel.sentinels)
        where: dict[str, Any] = (
            {"path": cfg.socket, "connection_class": syncredis.UnixDomainSocketConnection} if cfg.socket is not None
            else {"host": cfg.hosts[0][0], "port": cfg.hosts[0][1],
                  "connection_class": syncredis.SSLConnection if cfg.tls else syncredis.Connection}
        )
        pool = syncredis.BlockingConnectionPool(  # type: ignore[no-untyped-call, unused-ignore]
            db=cfg.db, max_connections=self.size, timeout=self.timeout, retry=no_retry, **where, **tls, **common,
        )
        return syncredis.Redis(connection_pool=pool), []

    def _on_connect(self, conn: Any) -> None:
        """A new connection (maybe to a new server: restarted, failed over): set up as redis-py
        does (a cluster's client has done that before calling us), then measure the server
        clock on it and load the script, as the async path's own connections do."""
        if not self.cluster:
            conn.on_connect()
        if self.script_clock.proxied:
            return
        self._measure(conn)
        conn.send_command("SCRIPT", "LOAD", SCRIPT)
        with contextlib.suppress(ResponseError):  # refused (an ACL): EVAL after NOSCRIPT
            conn.read_response()

    def _measure(self, conn: Any) -> None:
        """One ``TIME`` sample on ``conn``, kept as ``ScriptClock.measure`` keeps one (a sample
        with a longer round trip replaces the offset only when they disagree beyond both errors:
        a new server); taken outside the lock, so a silent server holds no other thread."""
        clock = self.script_clock
        if clock.test_clock is not None:
            return
        before = time.time()
        conn.send_command("TIME")
        try:
            seconds, micros = conn.read_response()
        except ResponseError:  # refused (an ACL): scripts go without a deadline
            clock.refused = True
            return
        after = time.time()
        rtt = after - before
        skew = int(seconds) + int(micros) / 1e6 - (before + after) / 2
        with self._clock_lock:
            known = clock.skew
            if known is None or rtt <= clock.rtt or abs(skew - known) > (rtt + clock.rtt) / 2:
                clock.skew = skew
                clock.rtt = rtt
            clock.refused = False

    def close(self) -> None:
        """Close the client with every connection it opened (each client even if another fails)."""
        self._closed = True
        self._late.let_go_all()
        self._close(None)

    def _close(self, used: Any) -> None:
        """Close the current client and ``used`` (the one a call ended on, if another)."""
        with self._lock:
            client, others = self._client, self._others
            self._client, self._others = None, []
        clients = [client, *others]
        if used is not None and used is not client:
            clients.append(used)
        for each in clients:
            if each is None:
                continue
            with contextlib.suppress(*FAILURES):
                if isinstance(each, SyncRedisCluster):
                    each.close()
                else:
                    each.connection_pool.disconnect()
                    each.close()


def _delete(names: list[bytes], client: Any) -> Any:
    return client.delete(*names)


def _reset_in_child(ref: weakref.ReferenceType[BlockingClient]) -> None:
    client = ref()
    if client is not None:
        client._reset()
