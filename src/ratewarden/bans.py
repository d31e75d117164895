"""Bans: lock a client out after repeated rejections, or on demand.

After ``after`` rejections within ``within`` seconds a key is banned for ``duration`` seconds;
with ``growth > 1`` each further ban of the same key lasts ``growth`` times longer (up to
``max_duration``), and the offence level is forgotten once ``max_duration`` passes without a ban.
Banned requests are answered with ``status`` (429 or 403) before any limit is checked.

Rejections are counted in the limiter's store, so they add up across workers when the store is
shared; the ban list itself lives in each process (a ban reaches another worker the next time it
rejects that key). ``block``/``unblock`` act on this process's list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .keys import KeyFunc, client_ip
from .rates import Rate

if TYPE_CHECKING:
    from .limiter import Limiter

__all__ = ["Bans"]

log = logging.getLogger("ratewarden.bans")


class Bans:
    """Ban list with automatic bans after repeated rejections."""

    def __init__(
        self,
        *,
        after: int = 10,
        within: float = 60.0,
        duration: float = 300.0,
        growth: float = 1.0,
        max_duration: float = 86400.0,
        status: int = 403,
        key: KeyFunc = client_ip,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if after < 1:
            raise ValueError(f"bans: 'after' must be at least 1 rejection, got {after!r}")
        if not within > 0 or not duration > 0:
            raise ValueError(f"bans: 'within' and 'duration' must be positive, got {within!r} and {duration!r}")
        if growth < 1:
            raise ValueError(f"bans: 'growth' must be 1 (constant) or more, got {growth!r}")
        if status not in (403, 429):
            raise ValueError(f"bans: 'status' must be 403 or 429, got {status!r}")
        self.after = after
        self.within = within
        self.duration = duration
        self.growth = growth
        self.max_duration = max(max_duration, duration)
        self.status = status
        self.key = key
        self.max_entries = max_entries
        self.clock = clock
        self.strike_rate = Rate(after, within)
        # An exact log for the usual small thresholds; a counter for large ones.
        self.strike_algorithm = "sliding_log" if after <= 1000 else "sliding_window"
        self._until: dict[str, float] = {}
        self._levels: dict[str, tuple[int, float]] = {}  # key -> (offences, forget_at)

    def configure_from(self, other: Bans) -> Bans:
        """``other``'s settings with this object's ban list (used by policy reloads)."""
        other._until = self._until
        other._levels = self._levels
        return other

    def banned_for(self, key: str) -> float:
        """Seconds left on ``key``'s ban (0 when not banned)."""
        until = self._until.get(key)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left <= 0:
            self._until.pop(key, None)
            return 0.0
        return left

    def block(self, key: str, seconds: float) -> None:
        """Ban ``key`` for ``seconds`` (replacing a shorter ban)."""
        if not seconds > 0:
            raise ValueError(f"block: seconds must be positive, got {seconds!r}")
        until = self.clock() + seconds
        if until > self._until.get(key, 0.0):
            if len(self._until) >= self.max_entries:
                self._expire()
            self._until[key] = until

    def unblock(self, key: str) -> None:
        self._until.pop(key, None)
        self._levels.pop(key, None)

    def banned(self) -> dict[str, float]:
        """Every current ban: key -> seconds left."""
        now = self.clock()
        return {k: u - now for k, u in list(self._until.items()) if u > now}

    async def strike(self, limiter: Limiter, key: str) -> float:
        """Record one rejection of ``key``; returns the ban length when this one triggers a ban, else 0."""
        decision = await limiter.hit(key, self.strike_rate, algorithm=self.strike_algorithm, scope="ban")
        if decision.allowed and decision.remaining > 0:
            return 0.0
        now = self.clock()
        level, forget_at = self._levels.get(key, (0, 0.0))
        if forget_at <= now:
            level = 0
        seconds = min(self.max_duration, self.duration * self.growth**level)
        self.block(key, seconds)
        if len(self._levels) >= self.max_entries:
            self._levels = {k: v for k, v in self._levels.items() if v[1] > now}
        self._levels[key] = (level + 1, now + seconds + self.max_duration)
        await limiter.reset(key, self.strike_rate, algorithm=self.strike_algorithm, scope="ban")
        log.warning("banned key=%s for %.0fs after %d rejections (offence %d)", key, seconds, self.after, level + 1)
        return seconds

    def _expire(self) -> None:
        now = self.clock()
        self._until = {k: u for k, u in self._until.items() if u > now}
        if len(self._until) >= self.max_entries:
            # Still full of live bans: drop the ones closest to expiry.
            keep = sorted(self._until.items(), key=lambda kv: kv[1])[len(self._until) // 10 :]
            self._until = dict(keep)
