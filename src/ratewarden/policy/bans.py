"""Bans: lock a client out after repeated rejections, or on demand.

After ``after`` rejections within ``within`` seconds a key is banned for ``duration`` seconds;
with ``growth > 1`` each further ban of the same key lasts ``growth`` times longer (up to
``max_duration``); the offence level drops by one for every ``max_duration`` without a ban.
Banned requests are answered with ``status`` (429 or 403) before any limit is checked.

Everything lives in the limiter's store, so with Redis or Memcached every worker sees the same
bans: the rejection count, the offence level and the ban itself. A ban is stored as a GCRA
state ``(until,)`` under ``<prefix>:{ban|<key>}:until`` (expiring when the ban ends), which any
GCRA limit reads back as "``until - now`` seconds left", whatever ban length wrote it. Each
process keeps the bans it has seen as a cache for ``cache_for`` seconds (default 1), so a banned
client costs no store read while the cache holds, and a lifted ban reaches every worker within
``cache_for`` seconds. Checking a key that is not banned is one store read (``peek``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..algorithms import AlgorithmName
from ..decision import Decision
from ..errors import ConfigurationError
from ..keys import KeyFunc, client_ip
from ..limiter import storage_key
from ..limits import Limit
from ..rates import Rate
from ..steps import Hit, Machine, Peek, Reset, Step, drive_blocking, driven
from ..stores.base import BlockingOperation

if TYPE_CHECKING:
    from ..limiter import Limiter

__all__ = ["BanStatus", "Bans", "Strike"]

BanStatus = Literal[403, 429]
"""How a banned request is answered: 403 Forbidden or 429 Too Many Requests."""

log = logging.getLogger("ratewarden.policy.bans")

# Reads a ban state: with a burst of one, a zero-cost GCRA check reports reset_after = until - now
# for any stored (until,). The period is longer than any ban, so a ban never reads as a state "a
# period ahead of the clock" (a clock stepped back) and dropped.
_UNTIL = Limit(Rate(1, float(2**31)), "gcra", "ban")
_UNTIL_LIST = [_UNTIL]
_LEVELS = 1000  # offences a key can accumulate (far past max_duration anyway)
# Longer keys are not cached (their bans are read from the store each time): the cache's memory
# stays bounded by entries x this, whatever keys clients make the key function return.
_MAX_CACHED_KEY = 1024
# What bans do synchronously (WSGI): strike (hit), read (peek), lift or replace (reset).
_BAN_OPERATIONS: tuple[BlockingOperation, ...] = ("hit", "peek", "reset")


class Bans:
    """Shared ban list with automatic bans after repeated rejections.

    Args:
        after: Rejections that trigger a ban.
        within: The window, in seconds, those rejections must fall in.
        duration: Seconds a first ban lasts.
        growth: How much longer each further ban of the same key lasts (1: all equal).
        max_duration: The longest ban, in seconds; also how long without a ban lowers the offence level by
            one.
        status: How banned requests are answered: 403 or 429.
        key: Who is banned: the key function applied to each request (default: the client IP).
        cache_for: Seconds each process trusts the bans it has seen before reading the store again (0:
            always read).
        max_entries: Keys the per-process ban cache holds at most.
        clock: Seconds since the epoch; replace it to test with a fake clock.
    """

    def __init__(
        self,
        *,
        after: int = 10,
        within: float = 60.0,
        duration: float = 300.0,
        growth: float = 1.0,
        max_duration: float = 86400.0,
        status: BanStatus = 403,
        key: KeyFunc = client_ip,
        cache_for: float = 1.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if after < 1:
            raise ConfigurationError(f"bans: 'after' must be at least 1 rejection, got {after!r}")
        if not within > 0 or not duration > 0:
            raise ConfigurationError(f"bans: 'within' and 'duration' must be positive, got {within!r} and {duration!r}")
        if growth < 1:
            raise ConfigurationError(f"bans: 'growth' must be 1 (constant) or more, got {growth!r}")
        if status not in (403, 429):
            raise ConfigurationError(f"bans: 'status' must be 403 or 429, got {status!r}")
        if not cache_for >= 0:
            raise ConfigurationError(f"bans: 'cache_for' must be zero or more seconds, got {cache_for!r}")
        self.after = after
        self.within = within
        self.duration = duration
        self.growth = growth
        self.max_duration = max(max_duration, duration)
        self.status: BanStatus = status
        self.key = key
        self.cache_for = cache_for
        self.max_entries = max_entries
        self.clock = clock
        self.strike_rate = Rate(after, within)
        # An exact log for the usual small thresholds; a counter for large ones.
        self.strike_algorithm: AlgorithmName = "sliding_log" if after <= 1000 else "sliding_window"
        # One level per offence, each forgotten after max_duration (GCRA: interval = max_duration).
        self._level_limit = Limit(Rate(_LEVELS, _LEVELS * self.max_duration), "gcra", "ban-level")
        self._cache: dict[str, tuple[float, float]] = {}  # key -> (banned until, re-read the store at)

    def configure_from(self, other: Bans) -> Bans:
        """``other``'s settings with this object's cache (used by policy reloads).

        Args:
            other: The newly loaded settings.
        """
        other._cache = self._cache
        return other

    # -- storage -------------------------------------------------------------------------------

    @staticmethod
    def _storage(limiter: Limiter, key: str, what: str) -> str:
        return storage_key(limiter.prefix, "ban", key, what)

    def _remember(self, key: str, left: float, now: float) -> None:
        if len(key) > _MAX_CACHED_KEY:
            return
        if key not in self._cache and len(self._cache) >= self.max_entries:
            self._expire(now)
        self._cache[key] = (now + left, now + min(self.cache_for, left))

    # -- reading -------------------------------------------------------------------------------

    def banned_for(self, key: str) -> float:
        """Seconds left on ``key``'s ban as this process last saw it (0 when not banned).

        Args:
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        entry = self._cache.get(key)
        if entry is None:
            return 0.0
        left = entry[0] - self.clock()
        if left <= 0:
            self._cache.pop(key, None)
            return 0.0
        return left

    def read_steps(self, limiter: Limiter, key: str) -> Machine[float]:
        """Seconds left on ``key``'s ban (0 when not banned), as a step machine
        (``ratewarden.steps``): from the cache while it is fresh, else one read of the shared
        store. A store failure falls back to the cache.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        now = self.clock()
        entry = self._cache.get(key)
        if entry is not None and now < entry[1] and now < entry[0]:
            return entry[0] - now
        try:
            decisions: list[Decision] = yield Peek(limiter.store, [self._storage(limiter, key, "until")], _UNTIL_LIST)
        except Exception as exc:
            return self._read_failed(exc, entry, now)
        return self._read(key, decisions[0].reset_after, entry, now)

    async def check(self, limiter: Limiter, key: str) -> float:
        """``read_steps``, awaited.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        return await driven(self.read_steps(limiter, key))

    def check_blocking(self, limiter: Limiter, key: str) -> float:
        """``read_steps`` for synchronous code (WSGI): the store is read with ``peek_blocking``, so it
        must answer without an event loop (``require_blocking`` says so at start-up).

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        return drive_blocking(self.read_steps(limiter, key))

    def _read(self, key: str, left: float, entry: tuple[float, float] | None, now: float) -> float:
        """The store said ``left`` seconds: remember a running ban, forget an ended one."""
        if left > 1e-6:
            self._remember(key, left, now)
            return left
        if entry is not None:
            self._cache.pop(key, None)
        return 0.0

    @staticmethod
    def _read_failed(exc: Exception, entry: tuple[float, float] | None, now: float) -> float:
        log.warning("ban check failed: %s: %s", type(exc).__name__, exc)
        return max(0.0, entry[0] - now) if entry is not None else 0.0

    def banned(self) -> dict[str, float]:
        """The bans this process has seen and that are still running: key -> seconds left."""
        now = self.clock()
        return {k: u - now for k, (u, _) in list(self._cache.items()) if u > now}

    # -- writing -------------------------------------------------------------------------------

    def block_steps(self, limiter: Limiter, key: str, seconds: float) -> Machine[float]:
        """Ban ``key`` for ``seconds`` in the shared store, unless a longer ban is already running, as a
        step machine (``ratewarden.steps``); its result is the seconds left on the ban now in force.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
            seconds: How long the ban lasts.
        """
        _check_length(seconds)
        store = limiter.store
        until_key = self._storage(limiter, key, "until")
        found: list[Decision] = yield Peek(store, [until_key], [_UNTIL])
        left = found[0].reset_after
        if left < seconds:
            yield Reset(store, [until_key])
            yield Hit(store, [until_key], [Limit(Rate(1, float(seconds)), "gcra", "ban")], [1.0])
            left = seconds
        self._remember(key, left, self.clock())
        return left

    async def block(self, limiter: Limiter, key: str, seconds: float) -> float:
        """``block_steps``, awaited: ban ``key`` for ``seconds``; the seconds left on the ban in force.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
            seconds: How long the ban lasts.
        """
        return await driven(self.block_steps(limiter, key, seconds))

    async def unblock(self, limiter: Limiter, key: str) -> None:
        """Lift ``key``'s ban and forget its offences and rejections (other workers follow
        within ``cache_for`` seconds).

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        self._cache.pop(key, None)
        await limiter.store.reset([self._storage(limiter, key, "until"), self._storage(limiter, key, "level")])
        await limiter.reset(key, self.strike_rate, algorithm=self.strike_algorithm, namespace="ban")

    def strike_steps(self, limiter: Limiter, key: str) -> Machine[float]:
        """Record one rejection of ``key``, as a step machine (``ratewarden.steps``); its result is
        the ban length when this one triggers a ban, else 0.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        store = limiter.store
        limits = limiter.limits(self.strike_rate, self.strike_algorithm)
        strikes = limiter.keys_for(key, limits, "ban")
        decision: Decision = yield Hit(store, strikes, limits, [1.0] * len(limits))
        if decision.allowed and decision.remaining > 0:
            return 0.0
        level = 0
        if self.growth > 1:
            level = self._level((yield Hit(store, [self._storage(limiter, key, "level")], [self._level_limit], [1.0])))
        seconds = self._ban_length(level)
        yield from self.block_steps(limiter, key, seconds)
        if limiter.fallback is not None:
            yield Reset(limiter.fallback, strikes)
        yield Reset(store, strikes)
        return self._banned(key, seconds, level)

    async def strike(self, limiter: Limiter, key: str) -> float:
        """``strike_steps``, awaited: the ban length when this rejection triggers a ban, else 0.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        return await driven(self.strike_steps(limiter, key))

    def _ban_length(self, level: int) -> float:
        """How long a ban at offence ``level`` lasts (0: the first offence)."""
        return min(self.max_duration, self.duration * self.growth**level)

    def _banned(self, key: str, seconds: float, level: int) -> float:
        """Log the ban ``strike`` just set; its length."""
        log.warning("banned key=%s for %.0fs after %d rejections (offence %d)", key, seconds, self.after, level + 1)
        return seconds

    def _level(self, offence: Decision) -> int:
        """The offence level a hit on the level key reports: its reset_after spans every remembered
        offence, this one included."""
        return max(0, math.ceil(offence.reset_after / self.max_duration - 1e-6) - offence.allowed)

    # -- synchronous code (WSGI): the same steps on the store's ``*_blocking`` methods ---------

    @staticmethod
    def require_blocking(limiter: Limiter, needed_by: str) -> None:
        """Raise ``ConfigurationError`` at start-up unless bans can be read and written on
        ``limiter``'s store (and its insurance limiter's) without an event loop: ``hit_blocking``,
        ``peek_blocking`` and ``reset_blocking`` (``Store.can_block``: the local stores, ``RedisStore``,
        ``MemcachedStore``, a ``Breaker`` over them).

        Args:
            limiter: Whose store would hold the bans.
            needed_by: Who asks, named in the error (e.g. ``"WSGIPolicyMiddleware"``).
        """
        stores = [limiter.store] if limiter.fallback is None else [limiter.store, limiter.fallback]
        for store in stores:
            missing = [f"{op}_blocking" for op in _BAN_OPERATIONS if not store.can_block(op)]
            if missing:
                raise ConfigurationError(
                    f"{needed_by}: bans are read and written synchronously, which needs {', '.join(missing)}; "
                    f"{type(store).__name__} has no such method (stores that do: MemoryStore, "
                    "SharedMemoryStore, RedisStore, MemcachedStore, a Breaker over them). Use one of them, "
                    "drop the bans, or serve the app over ASGI."
                )

    def strike_blocking(self, limiter: Limiter, key: str) -> float:
        """``strike_steps`` for synchronous code (``hit_blocking``, ``reset_blocking``), on a store
        ``require_blocking`` accepted.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
        """
        return drive_blocking(self.strike_steps(limiter, key))

    def block_blocking(self, limiter: Limiter, key: str, seconds: float) -> float:
        """``block_steps`` for synchronous code (``peek_blocking``, ``reset_blocking``, ``hit_blocking``),
        on a store ``require_blocking`` accepted.

        Args:
            limiter: Whose store holds the bans (its ``prefix`` too).
            key: Who: the value the bans' ``key`` function returned for the request (e.g. a client IP).
            seconds: How long the ban lasts.
        """
        return drive_blocking(self.block_steps(limiter, key, seconds))

    def _expire(self, now: float) -> None:
        self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        if len(self._cache) >= self.max_entries:
            # Still full of live bans: drop the ones closest to expiry (the store still has them).
            keep = sorted(self._cache.items(), key=lambda kv: kv[1][0])[len(self._cache) // 10 :]
            self._cache = dict(keep)


def _check_length(seconds: float) -> None:
    """Refuse a ban length that is not positive and finite (``block``'s ``seconds``)."""
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigurationError(f"block: seconds must be positive and finite, got {seconds!r}")


class Strike(Step):
    """Count a refusal toward ``key``'s ban (``Bans.strike``, ``strike_blocking``): answers the
    length of the ban it set (0: none)."""

    __slots__ = ("bans", "key", "limiter")

    def __init__(self, bans: Bans, limiter: Limiter, key: str) -> None:
        self.bans = bans
        self.limiter = limiter
        self.key = key

    async def run(self) -> Any:
        return await self.bans.strike(self.limiter, self.key)

    def run_blocking(self) -> Any:
        return self.bans.strike_blocking(self.limiter, self.key)
