"""Checks of one key made at the same time in this process, coalesced into batches.

One task holds the key (its local lock), takes every check queued on it, reads the state once
(``gets``), runs the algorithm for each check in arrival order (each decision is the one it
would get alone, one after the other) and writes the final state with one ``cas`` (``add`` for
a new key). A lost race with another process re-reads and retries the whole batch after a
jittered backoff. So a flood of one key costs two round trips per batch, and a key has one
contender per process.
"""

from __future__ import annotations

import asyncio
import math
import time

from ...algorithms import State
from ...decision import Decision
from ...limits import Limit
from ..base import StoreError, no_reply
from .cas import CasChecks, backoff
from .encoding import decode, encode, expiry, memcached_key
from .locks import KeyLocks
from .protocol import values_reader, write_command
from .queues import Check, Queue


class Batches(KeyLocks, CasChecks):
    """Single-key checks, queued per key and decided in that key's next batch."""

    _leaders: set[asyncio.Future[None]]  # tasks running batches

    async def _coalesced(self, key: str, limit: Limit, cost: float) -> Decision:
        """A single-key check, decided in its key's next batch."""
        mkey = memcached_key(key)
        queue = self._queues.get(mkey)
        if queue is None:
            queue = self._queues[mkey] = Queue(key)
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        queue.waiting.append(Check(limit, cost, future))
        if queue.leader is None:
            leader = queue.leader = asyncio.ensure_future(self._lead(mkey, queue))
            self._leaders.add(leader)
            leader.add_done_callback(self._leaders.discard)
        if queue.settling:  # the key waits for a write memcached did not answer
            done, _ = await asyncio.wait((future,), timeout=self.timeout)
            if not done:
                future.set_exception(no_reply(repr(self), "hit", self.timeout))
        return await future

    async def _lead(self, mkey: bytes, queue: Queue) -> None:
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

    async def _batch(self, mkey: bytes, queue: Queue) -> None:
        """Decide every check waiting on ``queue``: one read, the algorithm per check in arrival
        order, one write of the final state (the whole batch again on a lost CAS race)."""
        checks = [c for c in queue.waiting if not c.future.done()]
        queue.waiting = []
        for attempt in range(self.retries):
            if not checks:
                return
            try:
                ((value, token),) = await self._command(b"gets " + mkey + b"\r\n", values_reader((mkey,)))
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
            payload = write_command(mkey, data, token, expiry(deciding.reset_after, time.time()))
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
            await asyncio.sleep(backoff(attempt))
            checks = [c for c in checks if not c.future.done()]
        self._fail(checks, StoreError(f"{self!r}: hit: gave up after {self.retries} compare-and-swap conflicts"))

    def _decided(
        self, key: str, checks: list[Check], decisions: list[Decision], state: State | None, now: float
    ) -> None:
        """Answer a batch's checks; remember the key when its last check of a cost was denied."""
        self._rejections.forget((key,))
        denied: Check | None = None
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
