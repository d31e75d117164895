"""Delay instead of reject (nginx ``limit_req`` with ``burst``): a request over the rate waits for
its turn instead of being refused, as long as the wait is bounded.

A denied request is held when its ``retry_after`` fits in ``max_wait``, fewer than ``burst``
requests of the same key are already waiting, and fewer than ``max_waiting`` are waiting overall;
it then sleeps until it would be allowed and is checked again (so waiting requests still respect
the limit exactly). Anything else is rejected at once. The nginx ``delay=`` / ``nodelay`` part
(excess requests served immediately) is the rate's own burst, e.g. ``"10/s burst 20"`` with the
``gcra`` or ``token_bucket`` algorithm.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ..decision import Decision
from ..errors import ConfigurationError
from ..steps import Machine, Pause

__all__ = ["Delay"]


class Delay:
    """Bounded waiting for requests over their rate.

    Args:
        max_wait: The longest a request waits, in seconds; one that would wait longer is refused at once.
        burst: Requests of one key that may wait at the same time; more are refused.
        max_waiting: Requests that may wait at the same time in this process, all keys together.
    """

    def __init__(self, *, max_wait: float = 1.0, burst: int = 10, max_waiting: int = 1000) -> None:
        if not max_wait > 0:
            raise ConfigurationError(f"delay: max_wait must be positive seconds, got {max_wait!r}")
        if burst < 1 or max_waiting < 1:
            raise ConfigurationError(f"delay: burst and max_waiting must be at least 1, got {burst!r} and {max_waiting!r}")
        self.max_wait = max_wait
        self.burst = burst
        self.max_waiting = max_waiting
        self.waiting = 0
        self.delayed = 0  # requests that waited and were then served
        self._per_key: dict[str, int] = {}
        self._lock = threading.Lock()  # waiting places, taken from server threads under WSGI

    def steps(self, key: str, decision: Decision, recheck: Callable[[], Machine[Decision | None]]) -> Machine[Decision | None]:
        """Hold a denied request until ``recheck`` allows it or the wait would exceed ``max_wait``, as
        a step machine (``ratewarden.steps``): the async driver's task sleeps, the blocking
        driver's thread does (so each waiting WSGI request holds a server thread for at most
        ``max_wait``; ``burst`` and ``max_waiting`` bound how many do).

        Its result is the final decision (``decision`` itself when the request cannot wait), or
        ``None`` when a re-check could not decide (a store failure under fail-open): the caller
        then serves the request as for any undecided check, and it is not counted as delayed.
        A fail-closed re-check raises ``LimitUnavailable`` through to the caller.

        Args:
            key: Who: the client's key, bounding its waiting requests by ``burst``.
            decision: The denial to wait out.
            recheck: The request's check again (charging it when allowed), as a step machine.
        """
        deadline = self._enter(key, decision)
        if deadline is None:
            return decision
        current: Decision | None = decision
        try:
            while (pause := _pause(current, deadline)) is not None:
                yield Pause(pause)
                current = yield from recheck()
            return self._done(current)
        finally:
            self._leave(key)

    def _enter(self, key: str, decision: Decision) -> float | None:
        """Take a waiting place for ``key``; the deadline of the wait (``time.monotonic``), or
        ``None``: the request cannot wait, refuse it now."""
        retry = decision.retry_after
        with self._lock:
            if math.isinf(retry) or retry > self.max_wait or self.waiting >= self.max_waiting:
                return None
            queued = self._per_key.get(key, 0)
            if queued >= self.burst:
                return None
            self._per_key[key] = queued + 1
            self.waiting += 1
        return time.monotonic() + self.max_wait

    def _done(self, current: Decision | None) -> Decision | None:
        """The wait's answer, ``current``; counted as delayed when it was allowed."""
        if current is not None and current.allowed:
            with self._lock:
                self.delayed += 1
        return current

    def _leave(self, key: str) -> None:
        with self._lock:
            self.waiting -= 1
            left = self._per_key[key] - 1
            if left:
                self._per_key[key] = left
            else:
                del self._per_key[key]


def _pause(decision: Decision | None, deadline: float) -> float | None:
    """How long to sleep before re-checking ``decision`` (``None``: the wait is over: decided,
    undecided, or the turn comes too late)."""
    if decision is None or decision.allowed:
        return None
    retry = decision.retry_after
    if math.isinf(retry) or time.monotonic() + retry > deadline:
        return None
    return retry + 0.001  # a hair past the boundary, so the re-check lands after it
