"""One script call for a run of single-key checks: the usual check, folded (standalone, Sentinel).

A pipeline's consecutive ``EVALSHA check 1 key h clock (5 limit arguments) cost`` commands (one
limit on one key: the usual check, whatever its algorithm) go to the server as calls of
``BATCH_SCRIPT``: the check script itself, run once per key with that key's eight arguments,
each under ``pcall``, so a check that fails (a key holding another type) fails alone. Redis then
sets up, runs and answers one script call for many checks instead of one each, and reads its
clock once for several: a fifth to a quarter less of its CPU per check (``scripts/bench_redis_script.py
--parts``). Each check runs as it would alone (same script, same deadline, same reply), so answers
are unchanged; ``spread`` turns a folded call's reply back into one reply per check, in order, an
error reply to the whole call (``NOSCRIPT``, ``BUSY``) becoming each check's.

At most ``BATCH_MAX`` checks share a call, so one call holds the server for a bounded time (about
0.3 ms at 5 µs a check). Any other command (several limits, a peek, an adjustment, ``EVAL``) is
sent as it is, keeping its place.
"""

from __future__ import annotations

import hashlib

from ._redis import ResponseError
from .protocol import HIT, ONE_KEY_HEAD, SCRIPT, Reply

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

_BATCH_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n" + BATCH_SHA.encode() + b"\r\n"
_HEAD_LEN = len(ONE_KEY_HEAD)  # a single-key check's command: this head, its key, then HIT
_DOLLAR = ord("$")


def fold(commands: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The commands to send, and how many checks each carries: 0 for a command sent as it is, else
    the checks of a folded call (a run of at least two single-key checks, at most ``BATCH_MAX``)."""
    sent: list[bytes] = []
    sizes: list[int] = []
    keys: list[bytes] = []  # the run's key bulks, and below each one's eight arguments
    tails: list[bytes] = []
    for command in commands:
        end = command.find(b"\r\n", _HEAD_LEN) if command.startswith(ONE_KEY_HEAD) else -1
        if end > 0 and command[_HEAD_LEN] == _DOLLAR:
            tail = end + int(command[_HEAD_LEN + 1:end]) + 4  # past the key and its CRLF
            if command.startswith(HIT, tail):
                keys.append(command[_HEAD_LEN:tail])
                tails.append(command[tail:])
                if len(keys) == BATCH_MAX:
                    _flush(sent, sizes, keys, tails)
                continue
        if keys:
            _flush(sent, sizes, keys, tails)
        sent.append(command)
        sizes.append(0)
    if keys:
        _flush(sent, sizes, keys, tails)
    return sent, sizes


def _flush(sent: list[bytes], sizes: list[int], keys: list[bytes], tails: list[bytes]) -> None:
    """Send the run in ``keys`` and ``tails``: one check as it was, more as one folded call."""
    count = len(keys)
    if count == 1:
        sent.append(ONE_KEY_HEAD + keys[0] + tails[0])
        sizes.append(0)
    else:
        text = b"%d" % count
        sent.append(b"".join([b"*%d\r\n%s$%d\r\n%s\r\n" % (3 + 9 * count, _BATCH_HEAD, len(text), text), *keys, *tails]))
        sizes.append(count)
    keys.clear()
    tails.clear()


def spread(reply: Reply, size: int) -> list[Reply]:
    """The reply of each check a sent command carries (``size`` as ``fold`` gave it)."""
    if size == 0:
        return [reply]
    if isinstance(reply, BaseException):
        return [reply] * size
    if isinstance(reply, list) and len(reply) == size:
        return reply
    return [ResponseError(f"ratewarden: a folded call of {size} checks replied {reply!r:.100}")] * size
