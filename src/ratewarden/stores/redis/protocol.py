"""The check script and its calls on the wire: arguments, hand-packed RESP, reply decoding.

One script (``lua/check.lua``) does every check, peek and adjustment. Its call is
``EVALSHA sha numkeys key... mode clock (algorithm limit period capacity max_debt cost)...``:
``mode`` is ``h`` (hit), ``p`` (peek) or ``a`` (adjust), ``clock`` the deadline the script must
start by (see ``clock.py``). Standalone and Sentinel checks are sent as whole pre-packed RESP
commands (``PackedCommands``, no per-argument encoding); Cluster checks and plain calls go through
redis-py with string arguments (``ScriptArgs``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from ...decision import Decision
from ...limits import Limit

__all__ = [
    "ALGORITHM_IDS", "HIT", "ONE_KEY_HEAD", "SCRIPT", "SCRIPT_SHA", "PackedCommands", "Reply", "ScriptArgs", "ThreadScriptArgs", "as_eval", "bulk",
    "decision_at", "key_bytes",
]

SCRIPT = resources.files("ratewarden.stores").joinpath("lua/check.lua").read_text(encoding="utf-8")
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()

ALGORITHM_IDS = {
    "fixed_window": "1",
    "sliding_window": "2",
    "sliding_log": "3",
    "token_bucket": "4",
    "token_bucket_debt": "5",
    "leaky_bucket": "6",
    "gcra": "7",
}
Reply = Any  # a decoded script reply (a list of integers and bytes), or an error as its exception
_ONE = "1"
_LIMIT_CACHE_MAX = 4096  # arguments of this many limits; the oldest is evicted when full
_V = TypeVar("_V")
# Pre-encoded RESP pieces of the EVALSHA command.
_SHA_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n" + SCRIPT_SHA.encode() + b"\r\n"
_SCRIPT_B = SCRIPT.encode()
_EVAL_HEAD = b"$4\r\nEVAL\r\n$%d\r\n%s\r\n" % (len(_SCRIPT_B), _SCRIPT_B)
_COST_ONE = b"$1\r\n1\r\n"
_MODES = {m: b"$1\r\n%s\r\n" % m.encode() for m in ("h", "p", "a")}
_MODE_BULKS = tuple(_MODES.values())
ONE_KEY_HEAD = b"*12\r\n" + _SHA_HEAD + b"$1\r\n1\r\n"  # 12 = EVALSHA sha 1 key h now + 6 per limit
HIT = _MODES["h"]


def bulk(text: str) -> bytes:
    """``text`` as one RESP bulk string."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def key_bytes(key: str) -> bytes:
    """A key as UTF-8; lone surrogates (from undecodable client input) pass through as the
    memory and Memcached stores accept them."""
    try:
        return key.encode()
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogatepass")


def _remember(cache: dict[Limit, _V], limit: Limit, value: _V) -> None:
    """Cache ``value`` for ``limit``, evicting the oldest entry when the cache is full."""
    if len(cache) >= _LIMIT_CACHE_MAX:
        del cache[next(iter(cache))]
    cache[limit] = value


class ScriptArgs:
    """The script's arguments as strings (for calls through redis-py: Cluster, plain calls),
    each limit's own arguments cached. ``clock`` is the test clock (``None``: the deadline)."""

    __slots__ = ("clock", "limit_args")

    def __init__(self, clock: Callable[[], float] | None) -> None:
        self.clock = clock
        self.limit_args: dict[Limit, list[str]] = {}

    def of(self, limit: Limit) -> list[str]:
        """One limit's arguments: algorithm id, limit, period, capacity, maximum debt."""
        args = self.limit_args.get(limit)
        if args is None:
            rate = limit.rate
            args = [
                ALGORITHM_IDS[limit.algorithm],
                str(rate.limit),
                repr(float(rate.period)),
                str(rate.capacity),
                repr(float(rate.max_debt)),
            ]
            _remember(self.limit_args, limit, args)
        return args

    def script_args(self, mode: str, limits: Sequence[Limit], costs: Sequence[float], clock: str) -> list[str]:
        """Every argument after the keys."""
        args = [mode, clock if self.clock is None else repr(float(self.clock()))]
        for limit, cost in zip(limits, costs, strict=False):
            args += self.of(limit)
            args.append(_ONE if cost == 1 else repr(float(cost)))
        return args

    def request(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], clock: str
    ) -> tuple[Sequence[str], list[str]]:
        """One queued Cluster call: its keys and arguments."""
        return keys, self.script_args(mode, limits, costs, clock)

    @staticmethod
    def encode_clock(clock: str) -> str:
        return clock

    @staticmethod
    def with_clock(request: tuple[Sequence[str], list[str]], old: str, new: str) -> tuple[Sequence[str], list[str]]:
        """``request`` carrying the deadline ``new`` instead (in place)."""
        request[1][1] = new
        return request


class PackedCommands:
    """Whole ``EVALSHA`` commands in RESP, written to the socket as they are (standalone,
    Sentinel); each limit's packed arguments cached."""

    __slots__ = ("args", "clock", "limit_packed")

    def __init__(self, args: ScriptArgs) -> None:
        self.args = args
        self.clock = args.clock
        self.limit_packed: dict[Limit, bytes] = {}

    def request(
        self, mode: str, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float], clock: bytes
    ) -> bytes:
        """The whole command: numkeys, keys, mode, clock (the batch's deadline, a bulk string),
        then the cached per-limit arguments and each cost."""
        if len(keys) == 1 and mode == "h" and self.clock is None:  # the common check: one format
            packed = self.limit_packed.get(limits[0])
            if packed is not None:
                try:
                    key_b = keys[0].encode()
                except UnicodeEncodeError:
                    key_b = key_bytes(keys[0])
                cost = costs[0]
                return b"%s$%d\r\n%s\r\n%s%s%s%s" % (
                    ONE_KEY_HEAD, len(key_b), key_b, HIT, clock, packed,
                    _COST_ONE if cost == 1 else bulk(repr(float(cost))),
                )
        parts = [b"*%d\r\n" % (5 + len(keys) + 6 * len(limits)), _SHA_HEAD, b"$%d\r\n%d\r\n" % (len(str(len(keys))), len(keys))]
        for key in keys:
            key_b = key_bytes(key)
            parts.append(b"$%d\r\n%s\r\n" % (len(key_b), key_b))
        parts.append(_MODES[mode])
        parts.append(clock if self.clock is None else bulk(repr(float(self.clock()))))
        cache = self.limit_packed
        for limit, cost in zip(limits, costs, strict=False):
            packed = cache.get(limit)
            if packed is None:
                packed = b"".join(bulk(a) for a in self.args.of(limit))
                _remember(cache, limit, packed)
            parts.append(packed)
            parts.append(_COST_ONE if cost == 1 else bulk(repr(float(cost))))
        return b"".join(parts)

    @staticmethod
    def encode_clock(clock: str) -> bytes:
        return bulk(clock)

    @staticmethod
    def with_clock(command: bytes, old: bytes, new: bytes) -> bytes:
        """``command`` carrying the deadline ``new`` instead of ``old``."""
        # The clock slot follows the mode (a letter); after it come only numeric arguments.
        at = max(command.rfind(mode + old) + len(mode) for mode in _MODE_BULKS)
        return command[:at] + new + command[at + len(old):]


def as_eval(command: bytes) -> bytes:
    """A packed ``EVALSHA`` command as ``EVAL`` with the script itself (after ``NOSCRIPT``)."""
    return command.replace(_SHA_HEAD, _EVAL_HEAD, 1)


def decision_at(reply: Reply, base: int, limit: Limit) -> Decision:
    """The decision at ``reply[base:base + 5]`` (allowed, limit, remaining, reset after, retry
    after). Raises ``TypeError``, ``ValueError`` or ``IndexError`` on a malformed reply."""
    return Decision(
        reply[base] == 1, reply[base + 1], reply[base + 2], float(reply[base + 3]), float(reply[base + 4]),
        limit.rate.period, limit.name,
    )


class ThreadScriptArgs(ScriptArgs):
    """``ScriptArgs`` for many threads: its cache of each limit's arguments is filled (and its
    oldest entry evicted when full) by one thread at a time; reads take no lock."""

    __slots__ = ("_lock",)

    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self._lock = threading.Lock()

    def of(self, limit: Limit) -> list[str]:
        args = self.limit_args.get(limit)
        if args is None:
            with self._lock:
                args = super().of(limit)
        return args
