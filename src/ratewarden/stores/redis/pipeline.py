"""Coalescing: script calls queued in one event-loop tick go out as one pipeline.

At most ``pool_size`` pipelines are in flight; later calls queue into the next one. Every
pipeline is bounded by ``timeout`` from its first call: its timer fails every call still
waiting. A timer the event loop ran late (it was busy elsewhere) is re-armed, at most
``_MAX_EXTENSIONS`` times, and a pipeline sent after that carries the later deadline. A
pipeline queued before the server clock's offset was known (a new store) waits for it to be
measured and is sent with its deadline, never without.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...limits import Limit
from ..deadline import EXTENSIONS, LATE
from .clock import ScriptClock
from .errors import store_error, timed_out
from .protocol import Reply

__all__ = ["Pipeline"]

_MAX_EXTENSIONS = EXTENSIONS  # a busy loop can stretch a check's wait to at most 2 timeouts


class _Batch:
    """Calls queued in one event-loop tick, sent as one pipeline. An item's request is what
    the encoding made of it: a packed command (standalone, Sentinel) or ``(keys, args)``."""

    __slots__ = ("clock", "dated", "due", "extensions", "items", "started", "task", "timer")

    def __init__(self, due: float, clock: Any, dated: bool) -> None:
        self.items: list[tuple[Any, asyncio.Future[Reply]]] = []
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.due = due
        self.clock = clock  # the scripts' clock argument (their deadline), as the encoding puts it
        self.dated = dated  # the clock carries a deadline (or is a test clock's time)
        self.extensions = 0
        self.started = False  # its task began running (cancelling it before would skip its cleanup)


class Pipeline:
    """Queues script calls into batches and runs them through ``execute``.

    ``encoding`` is ``protocol.PackedCommands`` or ``protocol.ScriptArgs`` (its ``request``,
    ``encode_clock`` and ``with_clock``); ``execute`` sends a batch's requests and returns one
    reply each, ``prepare`` measures the server clock's offset (``connections``)."""

    def __init__(
        self,
        *,
        url: str,
        timeout: float,
        pool_size: int,
        clock: ScriptClock,
        encoding: Any,
        execute: Callable[[list[Any]], Awaitable[list[Reply]]],
        prepare: Callable[[], Awaitable[None]],
    ) -> None:
        self.url = url
        self.timeout = timeout
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
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        batch = self.batch
        if batch is None:
            batch = self._new_batch(loop)
        batch.items.append((self._encode(mode, keys, limits, costs, batch.clock), future))
        return future

    def _new_batch(self, loop: asyncio.AbstractEventLoop) -> _Batch:
        clock = self.clock.deadline(time.time() + self.timeout)
        batch = self.batch = _Batch(loop.time() + self.timeout, self.encoding.encode_clock(clock), not self.clock.unknown)
        batch.timer = loop.call_later(self.timeout, self._expire, batch)
        if self.inflight < self.pool_size:
            loop.call_soon(self._send)
        return batch

    def _redate(self, batch: _Batch) -> None:
        """Give the scripts the batch's current deadline: it was queued before the server clock's
        offset was known, or its timer was re-armed (a busy loop)."""
        if self.clock.test_clock is not None:
            return
        clock = self.clock.deadline(time.time() + batch.due - asyncio.get_running_loop().time())
        old, new = batch.clock, self.encoding.encode_clock(clock)
        with_clock = self.encoding.with_clock
        for n, (request, future) in enumerate(batch.items):
            batch.items[n] = (with_clock(request, old, new), future)
        batch.clock = new

    def _send(self) -> None:
        batch = self.batch
        if batch is None or batch.task is not None:
            return
        self.batch = None
        self.inflight += 1
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
        items = batch.items
        try:
            if not batch.dated:
                if self.clock.unknown:
                    await self._prepare()  # within the batch's timeout: its timer cancels this
                batch.dated = True
                self._redate(batch)  # rewrites the requests in place
            elif batch.extensions:
                self._redate(batch)
            items = [item for item in items if not item[1].done()]  # callers cancelled: not sent
            if not items:
                return
            replies = await self._execute([request for request, _ in items])
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
            error = store_error(self.url, exc)
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
        finally:
            if batch.timer is not None:
                batch.timer.cancel()
            self.inflight -= 1
            if self.batch is not None and self.batch.task is None:
                self._send()
