"""Coalescing: script calls queued in one event-loop tick go out as one pipeline.

At most ``pool_size`` pipelines are in flight; later calls queue into the next one. A pipeline's
timer runs ``timeout`` from when it is queued and is judged when it fires (see ``deadline``):

* not sent yet (queued behind ``pool_size`` pipelines in flight, or its task not run yet by a
  busy loop): our own queue, never the store's fault: the timer is re-armed;
* sent, and the store was heard from since the last look (bytes arrived on its connection, or
  wait in the kernel): the reply is on its way: re-armed, as long as the store keeps answering;
* sent on a connection of ours (standalone, Sentinel) and nothing arrived: the store is silent;
* connecting: once the connection has a socket, judged by what arrives, as a sent pipeline is
  (a paused server accepts the connection and never answers its handshake); before that (finding
  the server, asking Sentinel, the TCP connect), re-armed until ``connect_timeout`` has passed
  since the batch started, then while our own loop is behind, up to ``_CONNECTING_MAX`` connect
  timeouts;
* otherwise (a Cluster pipeline, whose connections are redis-py's): if our own
  loop is behind (the timer fired late, or one more loop pass took long), re-armed, at most
  ``_MAX_EXTENSIONS`` times: for a whole timeout when the loop was behind by a long pass (at
  least ``timeout / _GRACE_PASSES``: a busy loop), else for ``_GRACE_PASSES`` times the lag,
  these short re-arms adding up to one timeout at most. A reply already in the kernel needs a
  few loop passes (4-6 on Cluster) to reach its caller; a stall of a few ms (the process
  descheduled on a loaded machine, the loop itself idle) is no reason to wait a whole timeout
  more: re-armed a whole timeout each time, a paused Cluster node failed checks after 5
  timeouts (1 s against the failure matrix's 2 x 0.2 s + 0.5 s);
* else the store is silent: every call still waiting fails with a timeout.

Every script carries a deadline on the server clock (``clock``): it is set for ``timeout`` after
the moment the pipeline is written (set again when it was queued or connecting for longer than
``LATE``), so a script that reaches the server after its caller could have given up charges
nothing. A script that refuses as late while its caller still waits (Cluster: redis-py writes
to each node from a task of its own, later still on a busy loop) is sent again with a fresh
deadline, up to ``RESENDS`` times. A pipeline queued before the server clock's offset was known (a new store) waits for it
to be measured and is sent with its deadline, never without.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...limits import Limit
from ..caller_deadline import CALLER_DEADLINE
from ..deadline import EXTENSIONS, GRACE_PASSES, LATE, rearm_delay
from .client import Arrivals, arrivals
from .clock import ScriptClock
from .errors import RESENDS, closed_under, refused_as_late, store_error, timed_out
from .protocol import Reply

__all__ = ["Exchange", "Pipeline"]

_MAX_EXTENSIONS = EXTENSIONS  # re-arms for a busy loop alone, with no sign from the store
_GRACE_PASSES = GRACE_PASSES  # lag x this >= timeout: a busy loop, else a stall (rearm_delay)
_CONNECTING_MAX = 10  # connecting on a busy loop: at most this many connect timeouts


class Exchange:
    """How far a batch got on the wire, as the connection layer reports it: ``fresh`` just
    before its requests are written (it re-dates them when they were dated more than ``LATE``
    ago), ``sent`` once they are written, with the connection's ``Arrivals`` when known."""

    __slots__ = ("arrivals", "batch", "conn", "pipeline", "seen", "written")

    def __init__(self, pipeline: Pipeline, batch: _Batch) -> None:
        self.pipeline = pipeline
        self.batch = batch
        self.arrivals: Arrivals | None = None
        self.seen = 0
        self.written = False
        self.conn: Any = None  # the connection being opened for it, if any

    def connecting(self, conn: Any) -> None:
        """``conn`` is being opened for this batch (its handshake is judged once it has a socket)."""
        self.conn = conn

    def handshake_heard(self) -> bool | None:
        """While connecting: ``None`` before the connection has a socket (finding the server,
        Sentinel's answer, the TCP connect), else whether the server sent anything since the last
        look (the first look counts as heard: it starts the count)."""
        if self.conn is None:
            return None
        counted = arrivals(self.conn)
        if counted is None:
            return None
        if counted is not self.arrivals:
            self.arrivals = counted
            self.seen = counted.chunks
            return True
        return self.heard()

    def fresh(self, requests: list[Any]) -> list[Any]:
        """``requests`` with a deadline counted from now, unless theirs is recent enough."""
        return self.pipeline.redated(self.batch, requests)

    def sent(self, arrivals: Arrivals | None) -> None:
        self.arrivals = arrivals
        self.seen = arrivals.chunks if arrivals is not None else 0
        self.written = True

    def heard(self) -> bool:
        """Whether the store sent anything on this batch's connection since the last look."""
        arrivals = self.arrivals
        if arrivals is None:
            return False
        if arrivals.chunks != self.seen:
            self.seen = arrivals.chunks
            return True
        return arrivals.waiting()


class _Batch:
    """Calls queued in one event-loop tick, sent as one pipeline. An item's request is what
    the encoding made of it: a packed command (standalone, Sentinel) or ``(keys, args)``."""

    __slots__ = (
        "callers", "clock", "dated", "dated_at", "due", "exchange", "extensions", "finished", "graced", "items",
        "loop", "runs_until", "started", "started_at", "task", "timer",
    )

    def __init__(self, due: float, clock: Any, dated: bool, dated_at: float, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the event loop its futures belong to, and its task runs on
        self.items: list[tuple[Any, asyncio.Future[Reply]]] = []
        self.callers: list[tuple[asyncio.Future[Reply], float]] = []  # calls whose caller has a deadline
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.due = due
        self.clock = clock  # the scripts' clock argument (their deadline), as the encoding puts it
        self.dated = dated  # the clock carries a deadline (or is a test clock's time)
        self.dated_at = dated_at  # loop time the clock was computed at
        self.runs_until = dated_at  # loop time after which its scripts can no longer run (charge)
        self.extensions = 0  # re-arms for a busy loop alone
        self.graced = 0.0  # seconds of short re-arms for a stall (at most one timeout in all)
        self.started = False  # its task began running (cancelling it before would skip its cleanup)
        self.started_at = 0.0
        self.finished = False
        self.exchange: Exchange | None = None


class Pipeline:
    """Queues script calls into batches and runs them through ``execute``.

    ``encoding`` is ``protocol.PackedCommands`` or ``protocol.ScriptArgs`` (its ``request``,
    ``encode_clock`` and ``with_clock``); ``execute`` sends a batch's requests (telling its ``Exchange``) and returns one
    reply each, ``prepare`` measures the server clock's offset (``connections``)."""

    def __init__(
        self,
        *,
        url: str,
        timeout: float,
        pool_size: int,
        clock: ScriptClock,
        encoding: Any,
        execute: Callable[[list[Any], Exchange], Awaitable[list[Reply]]],
        prepare: Callable[[], Awaitable[None]],
        span: float | None = None,
        late_writes: bool = False,
        connect_timeout: float = 1.0,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.span = timeout if span is None else span  # how long after dating a script may still run
        # The connection layer writes a loop pass or more after dating (Cluster: redis-py's
        # pipeline writes from a task per node): add three of the loop's recent passes.
        self.late_writes = late_writes
        self.loop_pass = 0.0  # a recent loop pass, as long as a batch's task took to start (decaying)
        self.connect_timeout = connect_timeout
        self.pool_size = pool_size
        self.clock = clock
        self.encoding = encoding
        self._encode = encoding.request
        self._execute = execute
        self._prepare = prepare
        self.batch: _Batch | None = None  # the one being filled
        self.inflight = 0  # batches sent and not yet answered

    def request(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> asyncio.Future[Reply]:
        """One script call (keys on one slot), queued into the next pipeline."""
        batch = self.batch
        if batch is None:  # else the batch's loop: Python 3.11's get_running_loop() is a getpid() system call
            batch = self._new_batch(asyncio.get_running_loop())
        future: asyncio.Future[Reply] = batch.loop.create_future()
        batch.items.append((self._encode(mode, keys, limits, costs, batch.clock), future))
        deadline = CALLER_DEADLINE.get()
        if deadline < math.inf:
            batch.callers.append((future, deadline))
        return future

    def _new_batch(self, loop: asyncio.AbstractEventLoop) -> _Batch:
        span = self._span()
        clock = self.clock.deadline(time.time() + span)
        now = loop.time()
        batch = self.batch = _Batch(now + self.timeout, self.encoding.encode_clock(clock), not self.clock.unknown, now, loop)
        batch.runs_until = now + span + self.clock.error
        batch.timer = loop.call_later(self.timeout, self._expire, batch)
        if self.inflight < self.pool_size:
            loop.call_soon(self._send)
        return batch

    def _span(self) -> float:
        return self.span + 3 * self.loop_pass if self.late_writes else self.span

    def redated(self, batch: _Batch, requests: list[Any], force: bool = False) -> list[Any]:
        """``requests`` (of ``batch``) carrying a deadline ``timeout`` from now, when theirs was
        computed more than ``LATE`` ago (queued, connecting, or a busy loop) or is missing
        (``force``: queued before the server clock was measured); else as they are."""
        if self.clock.test_clock is not None:
            return requests
        now = asyncio.get_running_loop().time()
        if not force and now - batch.dated_at <= LATE:
            return requests
        old = batch.clock
        new = self._redate(batch, now)
        with_clock = self.encoding.with_clock
        return [with_clock(request, old, new) for request in requests]

    def _redate(self, batch: _Batch, now: float) -> Any:
        """Give ``batch`` a deadline ``span`` from now (``now``: loop time); the encoded clock."""
        span = self._span()
        batch.clock = self.encoding.encode_clock(self.clock.deadline(time.time() + span))
        batch.dated_at = now
        batch.runs_until = now + span + self.clock.error
        return batch.clock

    def _send(self) -> None:
        batch = self.batch
        if batch is None or batch.task is not None:
            return
        self.batch = None
        self.inflight += 1
        batch.task = asyncio.get_running_loop().create_task(self._run(batch))

    def _expire(self, batch: _Batch) -> None:
        """The batch's timer fired: judge it (see the module docstring)."""
        batch.timer = None
        if batch.finished:
            return
        loop = asyncio.get_running_loop()
        exchange = batch.exchange
        if not batch.started or (exchange is not None and exchange.heard()):
            self._rearm(batch, loop)
        elif exchange is None or not exchange.written:
            # Connecting. With a socket: judged by what arrives (a paused server accepts the
            # connection, then never answers). Before one (Sentinel's answer, the TCP connect):
            # bounded as redis-py bounds a connect, and up to ten times that while the loop
            # itself is behind (a flood opens the pool's connections one by one).
            handshake = exchange.handshake_heard() if exchange is not None else None
            connecting = loop.time() - batch.started_at
            if handshake is not None:  # connected: the server answers the handshake, or is silent
                if handshake:
                    self._rearm(batch, loop)
                else:
                    self._fail(batch)
            elif connecting < self.connect_timeout:
                self._rearm(batch, loop)
            elif connecting >= _CONNECTING_MAX * self.connect_timeout:
                self._fail(batch)
            elif loop.time() - batch.due > LATE:
                self._rearm(batch, loop)
            else:
                loop.call_soon(self._judge, batch, loop.time(), False)
        elif exchange.arrivals is not None or batch.extensions >= _MAX_EXTENSIONS:
            # Sent on a connection whose arrivals we see: nothing arrived, so the store is silent.
            self._fail(batch)
        else:
            late = loop.time() - batch.due
            if late * _GRACE_PASSES >= self.timeout:  # far behind: a busy loop
                batch.extensions += 1
                self._rearm(batch, loop)
            else:  # a busy loop, or a stall? one more pass tells
                loop.call_soon(self._judge, batch, loop.time(), True, late)

    def _judge(self, batch: _Batch, asked: float, counted: bool, late: float = 0.0) -> None:
        """One loop pass after ``_expire`` (whose timer fired ``late``): re-armed if the loop is
        behind (``counted``: as a busy loop's extension, for as long as its lag warrants)."""
        if batch.finished:
            return
        loop = asyncio.get_running_loop()
        lag = max(late, loop.time() - asked)
        if lag <= LATE:
            self._fail(batch)
        elif not counted:
            self._rearm(batch, loop)
        else:  # a busy loop: a whole timeout; a stall: time for a received reply to be read
            delay = rearm_delay(lag, self.timeout, batch.graced)
            if not delay:
                self._fail(batch)
                return
            batch.extensions += 1
            if delay < self.timeout:
                batch.graced += delay
            self._rearm(batch, loop, delay)

    def _rearm(self, batch: _Batch, loop: asyncio.AbstractEventLoop, delay: float | None = None) -> None:
        delay = self.timeout if delay is None else delay
        batch.due = loop.time() + delay
        batch.timer = loop.call_later(delay, self._expire, batch)

    def _fail(self, batch: _Batch) -> None:
        """The store is silent: every call still waiting fails with a timeout, once its scripts
        can no longer run (a caller never gives up on a check the store may still charge)."""
        if batch.finished:
            return
        loop = asyncio.get_running_loop()
        left = batch.runs_until - loop.time()
        if left > 0 and batch.dated:
            batch.due = loop.time() + left  # judged again then: the store may answer meanwhile
            batch.timer = loop.call_later(left, self._expire, batch)
            return
        error = timed_out(self.url, self.timeout)
        for _, future in batch.items:
            if not future.done():
                future.set_exception(error)
        if self.batch is batch:  # never sent: drop it, so nothing is charged behind our back
            self.batch = None
        elif batch.task is not None and batch.started:
            batch.task.cancel()
        # else its task has not run yet: it will find every call answered, send nothing, and
        # clean up (a task cancelled before its first step would skip its ``finally``).

    async def _run(self, batch: _Batch) -> None:
        batch.started = True
        batch.started_at = asyncio.get_running_loop().time()
        self.loop_pass = max(batch.started_at - batch.dated_at, 0.9 * self.loop_pass)
        items = batch.items
        try:
            undated = not batch.dated
            if undated:
                if self.clock.unknown:
                    await self._prepare()  # within the batch's timeout: its timer judges this
                batch.dated = True
            if batch.callers:
                _give_up_past(batch.callers, asyncio.get_running_loop().time())
            items = [item for item in items if not item[1].done()]  # callers cancelled or gone: not sent
            if not items:
                return
            requests = [request for request, _ in items]
            if undated:
                requests = self.redated(batch, requests, force=True)
            dated = batch.clock
            exchange = batch.exchange = Exchange(self, batch)
            replies = await self._execute(requests, exchange)
            for _ in range(RESENDS):
                # Scripts that refused to run past their deadline charged nothing: their callers
                # still wait (a busy loop wrote them late), so they go again with a fresh one.
                if batch.callers:
                    _give_up_past(batch.callers, asyncio.get_running_loop().time())
                late = [i for i, reply in enumerate(replies) if refused_as_late(reply) and not items[i][1].done()]
                if not late:
                    break
                new = self._redate(batch, asyncio.get_running_loop().time())
                resend = [self.encoding.with_clock(requests[i], dated, new) for i in late]
                exchange = batch.exchange = Exchange(self, batch)
                again = await self._execute(resend, exchange)
                for i, reply in zip(late, again, strict=False):
                    replies[i] = reply
            for (_, future), reply in zip(items, replies, strict=False):
                if future.done():
                    continue
                if isinstance(reply, BaseException):
                    future.set_exception(store_error(self.url, reply))
                else:
                    future.set_result(reply)
        except asyncio.CancelledError:
            pass  # the timer expired: the futures already carry the timeout
        except Exception as exc:
            error = store_error(self.url, closed_under(exc) if isinstance(exc, AttributeError) else exc)
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
        finally:
            batch.finished = True
            batch.exchange = None  # no batch <-> exchange cycle left for the garbage collector
            if batch.timer is not None:
                batch.timer.cancel()
            self.inflight -= 1
            if self.batch is not None and self.batch.task is None:
                self._send()


def _give_up_past(callers: list[tuple[asyncio.Future[Reply], float]], now: float) -> None:
    """Cancel the calls whose caller's deadline (``CALLER_DEADLINE``) has passed: never sent."""
    for future, deadline in callers:
        if deadline <= now and not future.done():
            future.cancel()
