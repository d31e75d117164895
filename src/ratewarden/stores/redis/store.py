"""``RedisStore``: the store's semantics on Redis / Valkey: check, peek, adjust, reset, clear,
the rejection cache and the failure mapping. How calls travel lives next door (``protocol``,
``pipeline``, ``connections``, ``topology``, ``clock``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from ...decision import Decision
from ...errors import ArgumentError
from ...limits import Limit
from ..base import Store, combine, no_reply
from ..deadline import wait_for_store
from ..insurance import Ledger
from ..rejections import Denials
from ..urls import parse_store_url
from .clock import ScriptClock
from .connections import ClusterConnections, PackedConnections, eval_script
from .deletes import delete_keys, delete_prefixed
from .errors import (
    CLIENT_ERRORS,
    CONNECTION_ERRORS,
    RESENDS,
    bad_reply,
    closed_under,
    pool_busy,
    refused_as_late,
    store_name,
)
from .gate import ConnectionGate, Turn
from .options import RedisOptions
from .pipeline import Exchange, Pipeline
from .protocol import PackedCommands, Reply, ScriptArgs
from .sync_client import BlockingClient, read_decisions
from .topology import close_client, make_client, pool_limit, slot_groups, spans_slots

__all__ = ["RedisStore"]

_OPERATIONS = {"h": "hit", "p": "peek", "a": "adjust"}  # script modes, as error messages name them


class RedisStore(Store):
    """Limits kept in Redis or Valkey (standalone, Sentinel or Cluster), built from a URL.

    Keyword arguments override the URL's query options of the same name.

    Args:
        url: ``redis://``, ``rediss://`` (TLS), ``valkey://``, ``unix://`` (a socket), or the Sentinel and Cluster forms, with
            options in its query.
        timeout: Seconds the store may stay silent before a check fails (default 0.1): time our own
            event loop or queue holds a check does not count, nor does a reply on its way.
        connect_timeout: Seconds to connect (default 1).
        pool_size: Pipelines in flight at once (default 8); the client's pool has 4 times as many
            connections, and calls beyond them (e.g. checks with ``coalesce`` off) wait for one.
        coalesce: Send checks made at the same time in one pipeline (default on).
        cache: Answer rejections known to hold from a local cache, without a round trip (default on).
        prefix: The storage-key prefix ``clear`` deletes (``<prefix>:*``).
        clock: Replaces the server clock (tests only: it makes time deterministic); the default ``None``
            uses the server's.
    """

    client_errors: ClassVar[tuple[type[BaseException], ...]] = CLIENT_ERRORS

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
        options = RedisOptions.of(cfg, timeout, connect_timeout, pool_size, coalesce, cache)
        self.timeout, connect, self.pool_size = options.timeout, options.connect_timeout, options.pool_size
        self.coalesce, self.cache_rejections = options.coalesce, options.cache
        self.prefix = prefix
        self.clock = clock
        self._cluster = cfg.kind == "cluster"
        self._client, self._other_clients = make_client(cfg, self.timeout, connect, self.pool_size)
        # Calls through the client wait for a free connection of its pool (Sentinel's and Cluster's
        # pools raise when exhausted). Cluster pipelines take up to pool_size of them per node.
        pipelines = self.pool_size if self._cluster and self.coalesce else 0
        self._gate = ConnectionGate(pool_limit(cfg.kind, self.pool_size) - pipelines)
        self._script_clock = ScriptClock(self.timeout, clock, options.twemproxy)
        self._args = ScriptArgs(clock)
        self._connections = (ClusterConnections if self._cluster else PackedConnections)(self._client, self._script_clock)
        self._pipeline = Pipeline(
            url=self.url, timeout=self.timeout, pool_size=self.pool_size, clock=self._script_clock,
            encoding=self._args if self._cluster else PackedCommands(self._args),
            execute=self._execute, prepare=self._prepare,
            # redis-py's cluster pipeline writes to each node from a task of its own, a loop pass
            # or more after we date its scripts: under a flood, more than a timeout.
            late_writes=self._cluster, connect_timeout=connect,
        )
        # One script call (keys on one slot): queued into the next pipeline when coalescing.
        self._request: Callable[[str, Sequence[str], Sequence[Limit], Sequence[float]], Awaitable[Reply]] = (
            self._pipeline.request if self.coalesce else self._request_one
        )
        self._busy = 0  # calls and pipelines in flight
        self._preparing: asyncio.Future[None] | None = None  # the one clock measurement under way
        self._closing: set[asyncio.Future[None]] = set()  # closes started by a measurement's end
        self._closed = False  # then the last one in flight closes every connection again: a retry
        # reconnects what close cut under a call, and a later call connects (Sentinel: to a Sentinel)
        # key: (until, cost, decision), shared with hit_blocking's threads (``rejections.Denials``)
        self._rejected = Denials()
        self._loop_hits = 0  # checks the event loop answered from the cache (threads: _rejected.thread_hits)
        #: The last answer per key, and what a limiter's insurance limiter admitted during an outage
        #: (charged back by the first check that succeeds after it).
        self.ledger = Ledger()
        # hit_blocking's synchronous client (redis-py's), built on its first check
        self._blocking = BlockingClient(
            cfg, timeout=self.timeout, connect_timeout=connect, pool_size=self.pool_size, clock=clock,
            store=self, rejected=self._rejected,
        )

    def __repr__(self) -> str:
        return store_name(self.url)

    # -- the check -------------------------------------------------------------------------

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        return self._cached(keys, costs) if self._rejected.entries else None

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        rejected = self._rejected
        if rejected.entries:
            cached = self._cached(keys, costs)
            if cached is not None:
                return cached
        if self._cluster and len(keys) > 1 and spans_slots(keys):
            return await self._hit_across_slots(keys, limits, costs)
        epoch = rejected.epoch
        sent_at = self._now()
        ledger = self.ledger
        if ledger.owed and self.coalesce:
            reply = await self._hit_charging_back(keys, limits, costs)
        else:
            if ledger.owed:  # not coalescing: charged back first, so this check counts them
                error = await ledger.settle(self)
                if error is not None:
                    raise error
            reply = await self._request("h", keys, limits, costs)
        try:
            index = reply[5]
            limit = limits[index]  # decoded inline, not by decision_at: the hot path
            decision = Decision(
                reply[0] == 1, reply[1], reply[2], float(reply[3]), float(reply[4]), limit.rate.period, limit.name
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise bad_reply(self.url, reply) from exc
        if not decision.allowed and self.cache_rejections and 0 < decision.retry_after < math.inf:
            rejected.remember(keys[index], costs[index], sent_at + decision.retry_after, decision, epoch, sent_at)
        ledger.note(keys[index], decision)
        return decision

    def _hit_charging_back(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Awaitable[Reply]:
        """The check, after what the insurance limiter admitted during an outage (``ledger``): the
        charges are queued first, into the same pipeline, so the store counts them before this
        check and the others sent with it; if the pipeline fails, they stay owed."""
        owed, owed_limits, amounts, untils = self.ledger.take()
        self._rejected.invalidate(owed)
        for idx in slot_groups(owed, self._cluster) if owed else ():
            charge = (
                [owed[i] for i in idx], [owed_limits[i] for i in idx], [amounts[i] for i in idx], [untils[i] for i in idx]
            )
            future = self._pipeline.request("a", charge[0], charge[1], charge[2])
            future.add_done_callback(functools.partial(self._charged_back, charge))
        return self._request("h", keys, limits, costs)

    def _charged_back(
        self, charge: tuple[list[str], list[Limit], list[float], list[float]], future: asyncio.Future[Reply]
    ) -> None:
        """A charge-back's reply: a failed one stays owed (``ledger``); either way the keys' cached
        rejections go (the count changed, or may have)."""
        self._rejected.invalidate(charge[0])
        if future.cancelled() or future.exception() is not None:
            self.ledger.owe_again(*charge)

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit`` for synchronous code, on redis-py's synchronous client in the calling thread (the
        same script, keys, deadline and failures; see ``sync_client``), answering from the rejection
        cache first and filling it, as ``hit`` does."""
        blocking = self._blocking
        blocking.collect_late()  # what calls whose callers gave up changed, given back with the charges owed
        if self.ledger.owed:  # charged back first, so this check counts them
            error = self.ledger.settle_blocking(self)
            if error is not None:
                raise error
        return blocking.hit(keys, limits, costs)

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` on the synchronous client (``sync_client``): one script call (per slot)."""
        return self._blocking.peek(keys, limits)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` on the synchronous client: one script call (per slot); the keys' cached rejections go."""
        return self._blocking.adjust(keys, limits, amounts)

    def reset_blocking(self, keys: Sequence[str]) -> None:
        """``reset`` on the synchronous client: one ``DEL`` (per slot); the keys' cached rejections go."""
        self._blocking.reset(keys)

    def _now(self) -> float:
        return time.monotonic() if self.clock is None else self.clock()

    def _cached(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """A remembered rejection that still holds for one of these keys at this same cost.
        Only denials are remembered, so the cache never allows what the server would deny."""
        cached = self._rejected.lookup(keys, costs, self._now())
        if cached is not None:
            self._loop_hits += 1
        return cached

    @property
    def cached_rejections(self) -> int:
        """Checks answered from the rejection cache: by the event loop and by threads."""
        return self._loop_hits + self._rejected.thread_hits

    @cached_rejections.setter
    def cached_rejections(self, value: int) -> None:
        self._loop_hits = value - self._rejected.thread_hits

    async def _hit_across_slots(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        """Cluster check whose keys live in several slots: ask every slot whether it would allow
        these costs, and charge (slot by slot, concurrently) only if all would."""
        decisions = await self._peek_at(keys, limits, costs)
        if not all(d.allowed for d in decisions):
            return combine(decisions)
        groups = slot_groups(keys, True)
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
        groups = slot_groups(keys, self._cluster)
        if len(groups) == 1:
            replies = [await self._request(mode, keys, limits, costs)]
        else:
            turn = Turn()
            replies = await self._call(self._eval_per_slot(turn, mode, groups, keys, limits, costs), turn, mode)
        out: list[Decision] = [None] * len(keys)  # type: ignore[list-item]
        for idx, reply in zip(groups, replies, strict=False):
            read_decisions(out, idx, reply, limits, self.url)
        return out

    # -- sending ---------------------------------------------------------------------------

    async def _eval_per_slot(
        self,
        turn: Turn,
        mode: str,
        groups: list[list[int]],
        keys: Sequence[str],
        limits: Sequence[Limit],
        costs: Sequence[float],
    ) -> list[Reply]:
        """One script call per slot group, concurrently (each in a turn of the connection gate),
        all with the same deadline."""
        wall_due = time.time() + self.timeout
        if self._script_clock.unknown:
            async with self._gate.slot(turn):
                await self._measured()
        return await asyncio.gather(
            *(
                self._gate.run(
                    turn, self._eval_dated, mode, [keys[i] for i in idx], [limits[i] for i in idx],
                    [costs[i] for i in idx], wall_due,
                )
                for idx in groups
            )
        )

    def _request_one(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Awaitable[Reply]:
        """One script call on its own (not coalescing), bounded by the timeout."""
        turn = Turn()
        return self._call(self._eval_one(turn, mode, keys, limits, costs), turn, mode)

    async def _eval_one(
        self, turn: Turn, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Reply:
        """One script call through the client (no coalescing), with its deadline, in a turn of the
        connection gate (the clock measurement too: one connection at a time)."""
        wall_due = time.time() + self.timeout
        async with self._gate.slot(turn):
            await self._measured()
            return await self._eval_dated(mode, keys, limits, costs, wall_due)

    async def _eval_dated(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], wall_due: float
    ) -> Reply:
        """One script call with its deadline (``wall_due``, this host's clock). A script that
        refuses as late charged nothing: while its caller waits, it goes again with a fresh one."""
        resent = 0
        while True:
            clock = self._script_clock.deadline(wall_due)
            try:
                return await eval_script(self._client, keys, self._args.script_args(mode, limits, costs, clock))
            except self.client_errors as exc:
                if resent == RESENDS or not refused_as_late(exc):
                    raise
            resent += 1
            wall_due = time.time() + self.timeout

    async def _measured(self) -> None:
        """Measure the server clock if scripts would otherwise go without a deadline (the quicker
        of two samples: the first may open the client's connection)."""
        if self._script_clock.unknown:
            await self._script_clock.measure(self._client.time, samples=2)

    async def _call(self, coro: Any, turn: Turn, operation: str) -> Any:
        """Await a client call within the timeout, turning every failure into ``StoreError`` (one
        naming the pool's limit when the call waited for a connection; ``operation``: a script
        mode, ``"h"``, ``"p"``, ``"a"``, or the operation's name)."""
        self._busy += 1
        try:
            return await wait_for_store(coro, self.timeout)
        except asyncio.TimeoutError:
            name = _OPERATIONS.get(operation, operation)
            if turn.waited:
                raise pool_busy(self.url, name, self.timeout, self._gate.size, self.pool_size) from None
            raise no_reply(repr(self), name, self.timeout) from None
        except self.client_errors as exc:
            raise self.store_error(_OPERATIONS.get(operation, operation), exc) from exc
        except AttributeError as exc:  # a connection closed under the call
            closed = closed_under(exc)
            if closed is exc:
                raise
            raise self.store_error(_OPERATIONS.get(operation, operation), closed) from exc
        finally:
            self._busy -= 1
            if self._closed and not self._busy:
                await self._close_connections()

    async def _prepare(self) -> None:
        """Measure the server clock before a pipeline is sent. The measurement runs as a task of its
        own, shared by the pipelines waiting for it and shielded from their cancellation: cut off
        mid-way, redis-py's cluster discovery leaves its start-up node's connection open. It counts
        in flight until it ends (it connects)."""
        task = self._preparing
        if task is None or task.done():
            self._busy += 1
            task = self._preparing = asyncio.ensure_future(self._connections.prepare())
            task.add_done_callback(self._prepared)
        await asyncio.shield(task)

    def _prepared(self, task: asyncio.Future[None]) -> None:
        self._busy -= 1
        if not task.cancelled():
            task.exception()  # retrieved: its waiters, if any, were given it
        if self._closed and not self._busy:
            closing = asyncio.ensure_future(self._close_connections())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _execute(self, batch: list[Any], exchange: Exchange) -> list[Reply]:
        """Send a pipeline's batch (counted in flight, as ``_call`` counts a call)."""
        self._busy += 1
        try:
            return await self._connections.execute(batch, exchange)
        finally:
            self._busy -= 1
            if self._closed and not self._busy:
                await self._close_connections()

    # -- the rest of the Store API ---------------------------------------------------------

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self._peek_at(keys, limits, [0.0] * len(keys))

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Refund (negative) or penalise (positive) ``amounts`` on ``keys`` without denying, with
        the semantics of ``ratewarden.charges.adjusted_state``: a refund never gives back more
        than the whole limit, a penalty stops at the limit. One script call (per slot)."""
        if not keys:
            return []
        if not len(keys) == len(limits) == len(amounts):
            raise ArgumentError(f"adjust: {len(keys)} keys, {len(limits)} limits and {len(amounts)} amounts must match")
        self._rejected.invalidate(keys)
        try:
            return await self._peek_at(keys, limits, amounts, "a")
        finally:  # a cached rejection may no longer hold (nor one read meanwhile)
            self._rejected.invalidate(keys)

    async def reset(self, keys: Sequence[str]) -> None:
        self._rejected.invalidate(keys)
        if not keys:
            return
        turn = Turn()
        try:
            await self._call(delete_keys(self._client, self._gate, turn, self._cluster, list(keys)), turn, "reset")
        finally:  # nor a denial read while it was under way
            self._rejected.invalidate(keys)

    async def clear(self) -> None:
        """Delete every ``<prefix>:*`` key (on every primary of a cluster)."""
        self._rejected.clear()
        try:
            await delete_prefixed(self._client, self._gate, self._cluster, self.prefix)
        except CONNECTION_ERRORS as exc:  # not bounded by the timeout: a large scan takes long
            raise self.store_error("clear", exc) from exc

    async def close(self) -> None:
        """Close every connection the store opened, its own and the client's (each even if another
        fails). Calls in flight may fail; they, and any later call, leave no connection open."""
        self._closed = True
        self._blocking.close()
        measuring = self._preparing
        if measuring is not None and not measuring.done():  # let it end rather than connect after us
            await asyncio.wait((measuring,), timeout=max(self.timeout, 1.0))
        await self._close_connections()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for _ in range(2):  # a closed transport shuts its socket a loop pass later: leave none to the GC
            await asyncio.sleep(0)

    async def _close_connections(self) -> None:
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self._connections.close()
        await close_client(self._client, self._other_clients)

    @property
    def client(self) -> Any:
        """The underlying redis-py client (for diagnostics such as ``INFO commandstats``)."""
        return self._client
