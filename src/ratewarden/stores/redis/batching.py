"""One script call for a run of single-key checks: the usual check, folded (standalone, Sentinel).

A pipeline's consecutive ``EVALSHA check 1 key h clock (5 limit arguments) cost`` commands (one
limit on one key: the usual check, whatever its algorithm) go to the server as calls of
``BATCH_SCRIPT``: the check script itself, run once per key with that key's eight arguments,
each under ``pcall``, so a check that fails (a key holding another type) fails alone. Redis then
sets up, runs and answers one script call for many checks instead of one each, and reads its
clock once for several: a fifth to a quarter less of its CPU per check (``scripts/bench_redis_script.py
--parts``). Each check runs as it would alone (same script, same deadline, same reply), so answers
are unchanged; ``spread``
turns a folded call's reply back into one reply per check, in order, an error reply to the
whole call (``NOSCRIPT``, ``BUSY``) becoming each check's.

At most ``BATCH_MAX`` checks share a call, so one call holds the server for a bounded time (about
0.3 ms at 5 µs a check). Any other command (several limits, a peek, an adjustment, ``EVAL``) is
sent as it is, keeping its place.
"""

from __future__ import annotations

import hashlib

from ._redis import ResponseError
from .protocol import SCRIPT, SCRIPT_SHA, Reply

__all__ = ["BATCH_MAX", "BATCH_SCRIPT", "BATCH_SHA", "TIME_EVERY", "fold", "spread"]

BATCH_MAX = 64
"""The most checks one folded call carries."""

TIME_EVERY = 8
"""Checks of a folded call that share one reading of the server clock."""

BATCH_SCRIPT = (
    "local function check(KEYS, ARGV)\n" + SCRIPT + "\nend\n"
    "local out, now = {}, 0\n"
    "for i = 1, #KEYS do\n"
    f"  if i % {TIME_EVERY} == 1 then\n"
    "    local t = redis.call('TIME')\n"
    "    now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"
    "  end\n"
    "  local b = (i - 1) * 8\n"
    "  local clock = tonumber(ARGV[b + 2])\n"
    "  if clock and clock < 0 and now > -clock then\n"
    "    out[i] = redis.error_reply('ratewarden: expired, the caller stopped waiting before this check ran')\n"
    "  else\n"
    "    local ok, reply = pcall(check, {KEYS[i]}, {ARGV[b + 1], (clock and clock >= 0) and clock or now,\n"
    "      ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8]})\n"
    "    if ok or type(reply) == 'table' then out[i] = reply else out[i] = redis.error_reply(tostring(reply)) end\n"
    "  end\n"
    "end\n"
    "return out\n"
)
"""Runs the check script for each key with its eight arguments; replies with each check's reply.
The deadline is checked here, as the check script checks it, against a reading of the server clock
shared by ``TIME_EVERY`` checks (the same reading the check is then given as its time), so a
call reads ``TIME`` once for several checks: the reading is at most that many checks old (tens of
microseconds), far inside the deadline's margin of a tenth of the timeout (``clock.py``)."""

BATCH_SHA = hashlib.sha1(BATCH_SCRIPT.encode()).hexdigest()

_CHECK_HEAD = b"*12\r\n$7\r\nEVALSHA\r\n$40\r\n" + SCRIPT_SHA.encode() + b"\r\n$1\r\n1\r\n"  # one key, one limit
_BATCH_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n" + BATCH_SHA.encode() + b"\r\n"
_HIT = b"$1\r\nh\r\n"


def _split(command: bytes) -> tuple[bytes, bytes] | None:
    """A single-key check's key bulk and its eight arguments, or ``None`` for any other command."""
    if not command.startswith(_CHECK_HEAD):
        return None
    at = len(_CHECK_HEAD)
    end = command.find(b"\r\n", at)
    if end < 0 or command[at:at + 1] != b"$":
        return None
    tail = end + 2 + int(command[at + 1:end]) + 2
    if not command.startswith(_HIT, tail):
        return None
    return command[at:tail], command[tail:]


def fold(commands: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The commands to send, and how many checks each carries: 0 for a command sent as it is, else
    the checks of a folded call (a run of at least two single-key checks, at most ``BATCH_MAX``)."""
    sent: list[bytes] = []
    sizes: list[int] = []
    run: list[tuple[bytes, bytes]] = []

    def flush() -> None:
        if len(run) == 1:
            sent.append(_CHECK_HEAD + run[0][0] + run[0][1])
            sizes.append(0)
        elif run:
            count = b"%d" % len(run)
            sent.append(b"".join((
                b"*%d\r\n" % (3 + 9 * len(run)), _BATCH_HEAD, b"$%d\r\n%s\r\n" % (len(count), count),
                *(key for key, _ in run), *(args for _, args in run),
            )))
            sizes.append(len(run))
        run.clear()

    for command in commands:
        parts = _split(command)
        if parts is None:
            flush()
            sent.append(command)
            sizes.append(0)
            continue
        run.append(parts)
        if len(run) == BATCH_MAX:
            flush()
    flush()
    return sent, sizes


def spread(reply: Reply, size: int) -> list[Reply]:
    """The reply of each check a sent command carries (``size`` as ``fold`` gave it)."""
    if size == 0:
        return [reply]
    if isinstance(reply, BaseException):
        return [reply] * size
    if isinstance(reply, list) and len(reply) == size:
        return reply
    return [ResponseError(f"ratewarden: a folded call of {size} checks replied {reply!r:.100}")] * size
