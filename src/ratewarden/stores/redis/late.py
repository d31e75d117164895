"""Calls of the blocking Redis client (``sync_client``) whose callers gave up waiting for their reply
while the script may have run.

A check or an adjust that ran in time but whose reply came after its caller gave up (the server
descheduled between the two on a busy machine: the deadline leaves a tenth of the timeout for
the reply) failed all the same, and what its caller did next counts it: the insurance limiter's
charge-back, or a 503. So on a standalone or Sentinel server its call is sent on a connection
of the pool taken by hand, and one that times out is kept aside (``late.LateCall``: with its connection
and its turn) until its reply says what it changed; each check (``RedisStore.hit_blocking``)
first reads the replies that came (``collect_late``), and what a late call charged is given back
(``Ledger.credit``: netted with the charge-back). A late call whose reply has not come once the
server has answered a call sent after it gave up, for a timeout more, is let go (as is the
oldest beyond half the pool, ``LATE_SHARE``): its script did not run in time, or its server is
gone. A Cluster call goes through redis-py's cluster client, which drops such a reply.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...limits import Limit
from ..insurance import Ledger
from ._redis import NoScriptError, RedisClusterException, RedisError, RedisTimeoutError, ResponseError
from .errors import RESENDS, refused_as_late
from .protocol import SCRIPT, SCRIPT_SHA, Reply

#: What a connection's calls raise when the server cannot answer (``sync_client.FAILURES``).
FAILURES = (RedisError, OSError, RedisClusterException)

__all__ = ["LATE_SHARE", "LateCall", "LateCalls", "Unanswered", "eval_kept", "take_connection"]

#: Late calls kept at most: the pool's size divided by this (each keeps a connection and a turn).
LATE_SHARE = 2


class LateCall:
    """A script call (``"h"`` check, ``"a"`` adjust) whose caller gave up waiting for its reply
    while the script may have run: its connection, out of the pool, and the turn its caller took,
    until the reply says what it changed (``outcome``) or it is let go (``let_go``)."""

    __slots__ = ("amounts", "conn", "gave_up", "keys", "limits", "mode", "overtaken", "pool", "turns")

    def __init__(
        self, conn: Any, pool: Any, mode: str, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]
    ) -> None:
        self.conn = conn
        self.pool = pool
        self.mode = mode
        self.keys = list(keys)
        self.limits = list(limits)
        self.amounts = list(amounts)
        self.gave_up = time.monotonic()
        self.overtaken = math.inf  # when a call sent after ``gave_up`` was first seen answered
        self.turns: threading.BoundedSemaphore | None = None  # set by ``_turn``

    def outcome(self) -> list[float] | None:
        """What the call changed, from its reply: for how long each key's change counts (its
        ``reset_after``; the limit's period for a check of several keys, whose reply gives the
        deciding one's only); empty if it changed nothing (a check denied, an error reply, a broken
        connection: the server restarted, or was killed); ``None`` while no reply has come.
        Returns the connection to the pool once it has an answer."""
        conn = self.conn
        try:
            if not conn.can_read(timeout=0):
                return None
            reply = conn.read_response(disconnect_on_error=False)
        except ResponseError:  # expired, NOSCRIPT, an error: nothing changed; the connection is sound
            self._release(broken=False)
            return []
        except Exception:  # a broken connection (or one closed under us): nothing to read any more
            self._release(broken=True)
            return []
        self._release(broken=False)
        periods = [limit.rate.period for limit in self.limits]
        try:
            if self.mode == "h":
                if reply[0] != 1:
                    return []
                return [float(reply[3])] if len(self.keys) == 1 else periods
            return [float(reply[5 * i + 3]) for i in range(len(self.keys))]
        except (TypeError, ValueError, IndexError):  # a reply that cannot be read: as if it counted
            return periods

    def let_go(self) -> None:
        """No reply is waited for any more: the connection is closed (its reply would be read by
        the next call on it) and goes back to the pool."""
        self._release(broken=True)

    def _release(self, broken: bool) -> None:
        with contextlib.suppress(*FAILURES):
            if broken:
                self.conn.disconnect()
            self.pool.release(self.conn)
        if self.turns is not None:
            self.turns.release()
            self.turns = None


class Unanswered(RedisTimeoutError):
    """No reply within the timeout to a call that may have run: ``late`` keeps it."""

    def __init__(self, late: LateCall, message: str) -> None:
        super().__init__(message)
        self.late = late


def take_connection(pool: Any) -> Any:
    """A connection of ``pool``: redis-py 5.3 deprecated the command name ``get_connection`` took."""
    named = _NAMED.get(type(pool))
    if named is None:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
        named = _NAMED[type(pool)] = parameter is not None and parameter.default is inspect.Parameter.empty
    return pool.get_connection("EVALSHA") if named else pool.get_connection()


_NAMED: dict[type, bool] = {}


class LateCalls:
    """The late calls of one client: at most ``most`` (beyond, the oldest is let go); one still
    unanswered ``timeout`` after the server answered a call sent after it gave up is let go too
    (its script did not run in time, or its server is gone)."""

    def __init__(self, most: int, timeout: float) -> None:
        self.most = most
        self.timeout = timeout
        self.calls: list[LateCall] = []
        self.lock = threading.Lock()
        #: The send time (monotonic) of the latest call answered: a late call it overtook is let go.
        self.answered_sent = -math.inf

    def __bool__(self) -> bool:
        return bool(self.calls)

    def reset(self) -> None:
        """A fresh lock and none kept (a forked child: its parent's connections and turns)."""
        self.lock = threading.Lock()
        self.calls = []

    def answered(self, sent: float) -> None:
        """A call sent at ``sent`` (monotonic) was answered."""
        if sent > self.answered_sent:
            self.answered_sent = sent

    def keep(self, late: LateCall, turns: threading.BoundedSemaphore) -> None:
        """Keep ``late`` (with ``turns``' turn) until its reply comes."""
        late.turns = turns
        with self.lock:
            self.calls.append(late)
            gone = self.calls[: -self.most]
            del self.calls[: -self.most]
        for each in gone:
            each.let_go()

    def collect(self, ledger: Ledger) -> None:
        """Read the replies that came (none waited for): what each changed is given back
        (``ledger.credit``). One thread at a time; the others go on."""
        if not self.calls or not self.lock.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            waiting: list[LateCall] = []
            changed: list[tuple[LateCall, list[float]]] = []
            for late in self.calls:
                outcome = late.outcome()
                if outcome is None:
                    if self.answered_sent > late.gave_up and late.overtaken == math.inf:
                        late.overtaken = now
                    if now - late.overtaken <= self.timeout:
                        waiting.append(late)
                        continue
                    late.let_go()
                elif outcome:
                    changed.append((late, outcome))
            self.calls = waiting
        finally:
            self.lock.release()
        for late, counting in changed:
            ledger.credit(late.keys, late.limits, late.amounts, counting)

    def let_go_all(self) -> None:
        """Wait for no reply any more (the client closes)."""
        with self.lock:
            gone, self.calls = self.calls, []
        for late in gone:
            late.let_go()


def eval_kept(
    pool: Any, mode: str, names: list[bytes], keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float],
    script_args: Callable[[str, Sequence[Limit], Sequence[float]], list[Any]], late_calls: LateCalls,
    loadable: bool = True,
) -> Reply:
    """The script in ``mode`` on a connection of ``pool`` taken by hand (standalone, Sentinel), with
    ``script_args`` (a fresh deadline each send): a check or an adjust with no reply in time keeps it
    (``Unanswered``) for its reply; the script is loaded on that same connection after ``NOSCRIPT``;
    refused as late (nothing charged), it is sent again, at most ``RESENDS`` times. Not ``loadable``
    (twemproxy): ``EVAL`` after ``NOSCRIPT``."""
    conn = take_connection(pool)
    sound = False  # the connection may be used again (nothing unread on it)
    try:
        command, body = "EVALSHA", SCRIPT_SHA
        loaded = False
        resent = 0
        while True:
            args = script_args(mode, limits, costs)
            sound = False
            conn.send_command(command, body, len(names), *names, *args)
            sent = time.monotonic()
            try:
                reply = conn.read_response(disconnect_on_error=False)
            except NoScriptError:
                sound = True
                if loaded:
                    raise
                loaded = True
                sound = False
                if not (loadable and _load_script(conn)):
                    command, body = "EVAL", SCRIPT
                continue
            except ResponseError as exc:
                sound = True
                if resent == RESENDS or not refused_as_late(exc):
                    raise
                resent += 1
                continue
            except RedisTimeoutError as exc:
                if mode == "p":  # charges nothing: nothing to wait for
                    raise
                late = LateCall(conn, pool, mode, keys, limits, costs)
                conn = None
                raise Unanswered(late, str(exc)) from exc
            sound = True
            late_calls.answered(sent)
            return reply
    finally:
        if conn is not None:
            with contextlib.suppress(*FAILURES):
                if not sound:
                    conn.disconnect()
                pool.release(conn)



def _load_script(conn: Any) -> bool:
    """``SCRIPT LOAD`` on ``conn``: whether it was loaded (an ACL may refuse it)."""
    conn.send_command("SCRIPT", "LOAD", SCRIPT)
    try:
        conn.read_response(disconnect_on_error=False)
    except ResponseError:
        return False
    return True
