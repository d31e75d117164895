"""Writes, and putting back what a check wrote when it cannot complete, so a check stays all or
nothing.

A check whose write does not complete (timeout, lost connection, cancellation) lets it finish
(within ``UNDO_TIMEOUT``), then puts back what it wrote, still holding its keys, so a check that
got no answer charges nothing. (A caller that goes away while its batch's write is in flight may
stay charged, at most once.) A put-back compares and swaps: a key changed since is left alone.

A put-back does not fail with the check that started it: its commands have a timeout of their
own (at least ``UNDO_COMMAND_TIMEOUT``, not the store's, which may be a millisecond) and one that
fails (no reply, no connection while memcached went silent) is tried again until
``UNDO_TIMEOUT``; trying again is safe, a key already put back reads as changed and is left
alone. The keys stay held until it ends, whatever happens to the caller meanwhile (cancelled
again, say): a check that built on a state being put back would make that put-back leave it
alone, one key of a multi-key check charged and the other not.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
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
UNDO_COMMAND_TIMEOUT = 0.1  # seconds memcached may stay silent on a put-back's command before it is tried again


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
        """Put back ``written`` (keys written before a write that was never sent, or that lost its
        race), in the background as an interrupted write's are, holding the keys meanwhile."""
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
        flight (``landing``) is settled, still holding the key locks until the put-back ends (a
        cancellation meanwhile is raised then), so no local check builds on the state being put
        back. A put-back that fails is not raised: it leaves that charge."""
        task = asyncio.ensure_future(asyncio.wait_for(self._settle_and_undo(writes, landing), UNDO_TIMEOUT * 2))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        cancelled = False
        while not task.done():
            try:
                await asyncio.wait((task,))
            except asyncio.CancelledError:  # the keys stay held: the put-back goes on, and we wait
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

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
        expires when it would have (memcached cannot read an expiry back, so it is computed).
        A failed attempt is tried again (a key put back reads as changed) until ``UNDO_TIMEOUT``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + UNDO_TIMEOUT
        attempt = 0
        while True:
            try:
                for undo in writes:
                    await self._put_back(undo)
                return
            except Exception:
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(random.uniform(0.0, min(0.02, 0.001 * 2.0**attempt)))
            attempt += 1

    async def _put_back(self, undo: Undo) -> None:
        key, old, ours, limit = undo
        timeout = max(self.timeout, UNDO_COMMAND_TIMEOUT)
        ((value, token),) = await self._command(b"gets " + key + b"\r\n", values_reader((key,)), timeout)
        if value != ours or token is None:
            return
        if old is None:
            await self._command(b"delete " + key + b"\r\n", deleted, timeout)
        else:
            _, decision = limit.fn(decode(old), self.clock(), 0.0, limit.rate)
            payload = storage(b"cas", key, old, expiry(decision.reset_after, time.time()), token)
            await self._command(payload, stored, timeout)
