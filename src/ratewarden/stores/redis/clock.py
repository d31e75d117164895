"""The scripts' clock argument: the server time after which a queued script must not run.

A caller stops waiting for a check after ``timeout``; a script that only reaches the server
later (a paused server resuming, a busy network) must charge nothing, so each call carries that
moment on the server clock, negated (``-<seconds>``; the script reads it as a deadline and takes
the time from ``TIME``). The offset between the server clock and ours is measured on connect,
before the first script is sent. A test clock (``clock=`` on the store) replaces all this with
its own time, sent as is.

A measurement is off by up to half its round trip (``deadline`` says which way that moves it), and
the deadline keeps a margin of a tenth of the timeout for the reply's travel. So a sample must not
include anything but ``TIME`` itself: a client's first call also discovers a cluster and opens connections (tens of ms under
load, more than the margin: a script run on a node resuming right after its caller gave up still
charged). ``measure(..., samples=2)`` keeps the quicker of two samples, the second on the
connection the first opened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._redis import ResponseError

__all__ = ["ScriptClock"]

# A script must start within this share of the timeout, leaving the rest for its reply to travel.
_DEADLINE_SHARE = 0.9


class ScriptClock:
    """Deadlines on the server clock for calls whose callers wait ``timeout`` seconds."""

    __slots__ = ("proxied", "refused", "rtt", "skew", "test_clock", "timeout")

    def __init__(self, timeout: float, test_clock: Callable[[], float] | None, proxied: bool = False) -> None:
        self.timeout = timeout
        self.test_clock = test_clock
        self.skew: float | None = None  # server clock minus ours, measured on connect
        self.rtt = math.inf  # the round trip of the sample ``skew`` comes from: twice its error
        # Behind twemproxy, which closes the connection on ``TIME`` and ``SCRIPT LOAD``: neither is
        # sent, scripts go without a deadline and are loaded by ``EVAL`` after ``NOSCRIPT``.
        self.proxied = proxied
        self.refused = proxied  # the server refused ``TIME`` (an ACL): scripts go without a deadline

    @property
    def unknown(self) -> bool:
        """Whether scripts would go without a deadline that a measurement could give them."""
        return self.skew is None and self.test_clock is None and not self.refused

    @property
    def error(self) -> float:
        """Seconds the measured offset may be off: half the round trip of the measurement (0
        before one, or with a test clock)."""
        return self.rtt / 2 if self.rtt < math.inf else 0.0

    def deadline(self, wall_due: float, strict: bool = False) -> str:
        """The clock argument of calls whose callers stop waiting at ``wall_due`` (our
        ``time.time()``), or the test clock's time. Empty until the offset is known.

        Half the measurement's round trip is the offset's error. An async caller waits on while its
        own loop is behind (``stores/deadline.py``), so its deadline may be that much later than
        meant, never earlier (a busy loop's checks would be refused as late). A ``strict`` caller
        (a thread on a socket timeout) stops at ``wall_due`` exactly, so its deadline is that much
        earlier: a script run after it gave up would charge for an answer nobody got."""
        if self.test_clock is not None:
            return repr(float(self.test_clock()))
        skew = self.skew
        if skew is None:
            return ""
        error = -self.error if strict else self.error
        return "-%.4f" % (wall_due - (1 - _DEADLINE_SHARE) * self.timeout + skew + error)

    async def measure(self, server_time: Callable[[], Awaitable[Any]], samples: int = 1) -> None:
        """Keep the offset of the server clock (``server_time()``: ``TIME``'s reply) from ours,
        to within half a round trip: of the quickest of ``samples`` calls. A sample taken while
        our loop was busy (a long round trip) does not replace a better one it agrees with; one
        that disagrees beyond both errors (a new server, after a failover) does. A refused
        ``TIME`` (an ACL) leaves it unknown: scripts then go without a deadline."""
        if self.proxied:
            return
        best = skew = math.inf
        for _ in range(samples):
            before = time.time()
            try:
                seconds, micros = await server_time()
            except ResponseError:
                self.refused = True
                return
            after = time.time()
            if after - before < best:
                best = after - before
                skew = int(seconds) + int(micros) / 1e6 - (before + after) / 2
        known = self.skew
        if known is None or best <= self.rtt or abs(skew - known) > (best + self.rtt) / 2:
            self.skew = skew
            self.rtt = best
        self.refused = False
