"""Sending a command and timing its reply by what memcached sends, not by our own queues.

``timeout`` bounds memcached's answers: it starts when a command is written, and when it fires
with bytes from memcached arrived on that connection since (counted as the connection's reader
is fed, or waiting unread in the kernel), it is re-armed: the reply is there, our loop has not
read it yet. A command fails after a whole ``timeout`` with no byte from memcached. Waiting for
a key's turn, a pool connection or our loop is not timed, but a waiter fails as soon as a
command of the store times out (memcached went silent), and while memcached stays silent. So a
hung memcached fails a check within about ``timeout``. A command that does not complete
(timeout, cancellation, a closed store) closes its connection: its reply may be unread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from ..base import Store, no_reply
from ._aiomcache import Connection
from .connections import Client, Heard, Pool, Sent, heard_on, readable, retrieve
from .queues import Check, Queue

_T = TypeVar("_T")

LATE = 0.002  # a timer this late was held up by our own loop: it gets one more timeout


class Commands(Store):
    """The store's commands: a pool connection, the command written, its reply timed."""

    #: What the memcached client raises when memcached cannot answer (``MemcachedStore`` names them).
    client_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    timeout: float
    _client: Client
    _pool: Pool
    _queues: dict[bytes, Queue]  # key -> checks waiting for its next batch
    _heard: Heard  # data arrivals on every connection
    _silent_at: int  # ``_heard.count`` when a command last timed out (-1: not silent)
    _silence: asyncio.Future[None] | None  # resolved when a command times out

    async def _command(
        self, payload: bytes, read: Callable[[asyncio.StreamReader], Awaitable[_T]], timeout: float | None = None
    ) -> _T:
        """Send ``payload`` and read its reply with ``read``, within ``timeout`` (default: the
        store's; see the module docstring). A command that does not complete closes its connection."""
        conn = await self._acquire()
        done = False
        try:
            sent = self._send(conn, payload, read)
            try:
                result: _T = await self._answer(sent, timeout)
            finally:
                if not sent.task.done():
                    sent.task.cancel()
                    sent.task.add_done_callback(retrieve)
            done = True
            return result
        finally:
            await self._release(conn, done)

    async def _acquire(self) -> Connection:
        """A pool connection; waiting for one is not timed, but fails when memcached goes silent."""
        pool = self._pool
        if not pool._pool.empty() and pool.size() >= pool._minsize:
            return await pool.acquire()  # an idle one (or a reconnect, bounded by connect_timeout)
        conn: Connection = await self._wait_ours(asyncio.ensure_future(pool.acquire()), self._return_unused)
        return conn

    def _return_unused(self, conn: Connection) -> None:
        self._pool.release(conn)

    def _send(self, conn: Connection, payload: bytes, read: Callable[[asyncio.StreamReader], Awaitable[_T]]) -> Sent:
        heard = heard_on(conn, self._heard)
        sent = Sent(conn, heard, asyncio.ensure_future(read(conn.reader)))
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

    async def _answer(self, sent: Sent, limit: float | None = None) -> Any:
        """``sent``'s reply. The timeout (``limit``, default the store's) starts at the write and
        is re-armed while memcached is heard from (bytes arrived on the connection since the last
        look, or waiting in the kernel), once for a timer our loop ran late; else
        ``asyncio.TimeoutError`` (the reply task runs on)."""
        task = sent.task
        loop = asyncio.get_running_loop()
        seen = sent.seen
        late = 1
        while True:
            timeout = self.timeout if limit is None else limit
            due = loop.time() + timeout
            done, _ = await asyncio.wait((task,), timeout=timeout)
            if done:
                return task.result()
            heard = sent.heard.count
            if heard != seen or readable(sent.conn):
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

    def _fail(self, checks: list[Check], exc: BaseException) -> None:
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
