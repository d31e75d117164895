"""Writes, and putting back what a check wrote when it cannot complete, so a check stays all or
nothing.

A check whose write does not complete (timeout, lost connection, cancellation) lets it finish
(within ``UNDO_TIMEOUT``), then puts back what it wrote, still holding its keys, so a check that
got no answer charges nothing. (A caller that goes away while its batch's write is in flight may
stay charged, at most once.) A put-back compares and swaps: a key changed since is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from ...limits import Limit
from .commands import Commands
from .connections import Sent, retrieve
from .encoding import decode, expiry
from .protocol import deleted, storage, stored, values_reader
from .queues import Queue

Undo = tuple[bytes, "bytes | None", bytes, Limit]  # key, value before, value written, its limit

UNDO_TIMEOUT = 5.0  # seconds a put-back of an interrupted check may take (it runs in the background)


class PutBacks(Commands):
    """Writes whose undo is known, and the put-backs of those that did not complete."""

    clock: Callable[[], float]
    _undoing: set[asyncio.Future[None]]  # put-backs of interrupted checks

    async def _write(self, payload: bytes, written: list[Undo], queue: Queue | None) -> bool:
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
        sent = self._send(conn, payload, stored)
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

    async def _put_back_unsent(self, written: list[Undo], queue: Queue | None) -> None:
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

    async def _settle(self, sent: Sent) -> None:
        """Wait (at most ``UNDO_TIMEOUT``) for an unanswered write's reply, then release its connection."""
        done, _ = await asyncio.wait((sent.task,), timeout=UNDO_TIMEOUT)
        if not done:
            sent.task.cancel()
        sent.task.add_done_callback(retrieve)
        await self._release(sent.conn, bool(done) and sent.task.exception() is None)

    async def _undo_interrupted(self, writes: list[Undo], landing: asyncio.Future[None]) -> None:
        """Put back ``writes`` in a task of its own (this one may be cancelled), once the write in
        flight (``landing``) is settled, still holding the key locks until then, so no local check
        builds on the state being put back."""
        task = asyncio.ensure_future(asyncio.wait_for(self._settle_and_undo(writes, landing), UNDO_TIMEOUT * 2))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        with contextlib.suppress(BaseException):  # a second cancellation: the task goes on alone
            await asyncio.shield(task)

    async def _settle_and_undo(self, writes: list[Undo], landing: asyncio.Future[None]) -> None:
        with contextlib.suppress(Exception):  # landed or not: ``_undo`` reads which
            await landing
        await self._undo(writes)

    def _undone(self, task: asyncio.Future[None]) -> None:
        self._undoing.discard(task)
        if not task.cancelled():
            task.exception()  # a put-back that failed leaves that charge: nothing else to do

    async def _undo(self, writes: list[Undo]) -> None:
        """Put back keys this check wrote, unless someone changed them since; a restored state
        expires when it would have (memcached cannot read an expiry back, so it is computed)."""
        for key, old, ours, limit in writes:
            ((value, token),) = await self._command(b"gets " + key + b"\r\n", values_reader((key,)))
            if value != ours or token is None:
                continue
            if old is None:
                await self._command(b"delete " + key + b"\r\n", deleted)
            else:
                _, decision = limit.fn(decode(old), self.clock(), 0.0, limit.rate)
                await self._command(storage(b"cas", key, old, expiry(decision.reset_after, time.time()), token), stored)
