"""Rate values and the rate-string parser ("100/min", "5 per 30 seconds", "10/s; 1000/day")."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ConfigurationError

__all__ = ["Rate", "RateSpec", "freeze_rates", "parse_rate", "parse_rates"]

_UNITS: dict[str, float] = {}
for _names, _seconds in (
    (("ms", "msec", "millisecond", "milliseconds"), 0.001),
    (("s", "sec", "secs", "second", "seconds"), 1.0),
    (("m", "min", "mins", "minute", "minutes"), 60.0),
    (("h", "hr", "hrs", "hour", "hours"), 3600.0),
    (("d", "day", "days"), 86400.0),
    (("w", "wk", "week", "weeks"), 604800.0),
):
    for _name in _names:
        _UNITS[_name] = _seconds

_EXAMPLE = 'e.g. "100/min", "10/second", "5 per 30 seconds", "100/5m" or "10/s; 1000/day"'
_BURST_RE = re.compile(r"\s+(\d+)\s*$")
_RATE_RE = re.compile(
    r"^\s*(?P<amount>\d+)\s*(?:/|per)\s*(?P<count>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` units of cost per ``period`` seconds.

    Args:
        limit: Units of cost allowed per period.
        period: The period in seconds.
        burst: The bucket size for token bucket, leaky bucket and GCRA; the default ``None`` means
            ``limit``.
        debt: The overdraft ``token_bucket_debt`` allows; the default ``None`` means ``limit``.
    """

    limit: int
    period: float
    burst: int | None = None
    debt: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit <= 0:
            raise ConfigurationError(f"rate limit must be a positive integer, got {self.limit!r} ({_EXAMPLE})")
        if not (self.period > 0 and math.isfinite(self.period)):
            raise ConfigurationError(f"rate period must be positive and finite, got {self.period!r} seconds ({_EXAMPLE})")
        if self.burst is not None and self.burst <= 0:
            raise ConfigurationError(f"rate burst must be positive, got {self.burst!r}")
        if self.debt is not None and self.debt < 0:
            raise ConfigurationError(f"rate debt must not be negative, got {self.debt!r}")

    @property
    def capacity(self) -> int:
        """Bucket size: ``burst`` if set, else ``limit``."""
        return self.limit if self.burst is None else self.burst

    @property
    def max_debt(self) -> float:
        """Overdraft for ``token_bucket_debt``: ``debt`` if set, else ``limit``."""
        return float(self.limit) if self.debt is None else self.debt

    def __str__(self) -> str:
        period = self.period
        for unit, seconds in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0)):
            if period >= seconds and period % seconds == 0:
                count = int(period // seconds)
                text = f"{self.limit}/{unit}" if count == 1 else f"{self.limit}/{count} {unit}s"
                break
        else:
            text = f"{self.limit}/{round(period * 1000)}ms"
        if self.burst is not None:
            text += f" burst {self.burst}"
        return text

    @property
    def ident(self) -> str:
        """Compact stable identifier used in storage keys: ``<limit>/<period ms>``."""
        return f"{self.limit}/{round(self.period * 1000)}"


RateSpec = str | Rate | Iterable[str | Rate]
"""One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them."""


def parse_rate(text: str | Rate) -> Rate:
    """Parse one rate such as ``"100/min"``, ``"5 per 30 seconds"`` or ``"100/5m"``.

    Raises ``ConfigurationError`` (a ``ValueError``) quoting the bad part and showing a valid example.

    Args:
        text: The rate, or a ``Rate`` (returned as is).
    """
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ConfigurationError(f"rate must be a string, got {type(text).__name__} ({_EXAMPLE})")
    burst: int | None = None
    body = text
    # rfind + an anchored match, not re.search: a search would retry at every whitespace
    # position, quadratic in the length of the text.
    at = text.lower().rfind("burst")
    if at > 0 and text[at - 1].isspace():
        burst_match = _BURST_RE.match(text, at + 5)
        if burst_match:
            burst = int(burst_match.group(1))
            body = text[:at].rstrip()
    match = _RATE_RE.match(body)
    if match is None:
        raise ConfigurationError(f"invalid rate {text!r}: expected '<amount>/<period>', {_EXAMPLE}")
    amount = int(match.group("amount"))
    count = float(match.group("count")) if match.group("count") else 1.0
    unit = match.group("unit").lower()
    seconds = _UNITS.get(unit)
    if seconds is None:
        raise ConfigurationError(
            f"invalid rate {text!r}: unknown time unit {match.group('unit')!r}; "
            f"use ms, s, m, h, d or w (or second, minute, ...), {_EXAMPLE}"
        )
    if amount <= 0:
        raise ConfigurationError(f"invalid rate {text!r}: the amount must be positive ({_EXAMPLE})")
    if count <= 0:
        raise ConfigurationError(f"invalid rate {text!r}: the period must be positive ({_EXAMPLE})")
    if burst is not None and burst <= 0:
        raise ConfigurationError(f"invalid rate {text!r}: burst must be positive ({_EXAMPLE})")
    return Rate(amount, count * seconds, burst)


def freeze_rates(value: str | Rate | Iterable[str | Rate], what: str = "rate") -> str | Rate | tuple[str | Rate, ...]:
    """``value`` with any iterable (a list, a generator) read once into a tuple, so it can be kept,
    reused and hashed; ``TypeError`` naming ``what`` for anything that is not a rate.

    Args:
        value: Rates as ``parse_rates`` takes them.
        what: The option's name, for the error message.
    """
    if isinstance(value, (str, Rate)):
        return value
    if value is None or isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a rate string, a Rate or a list of them, got {type(value).__name__} {value!r} ({_EXAMPLE})")
    return tuple(value)


def parse_rates(value: str | Rate | Iterable[str | Rate]) -> tuple[Rate, ...]:
    """Parse several rates: ``"10/s; 1000/day"``, a list of strings/``Rate``, or a single rate.

    Args:
        value: ``;``-separated rates, a list of them, or one rate.
    """
    frozen = freeze_rates(value)
    if isinstance(frozen, Rate):
        return (frozen,)
    if isinstance(frozen, str):
        parts = [p for p in re.split(r"[;,]", frozen) if p.strip()]
        if not parts:
            raise ConfigurationError(f"invalid rate {frozen!r}: empty ({_EXAMPLE})")
        return tuple(parse_rate(p) for p in parts)
    rates = tuple(parse_rate(v) for v in frozen)
    if not rates:
        raise ConfigurationError(f"no rate given ({_EXAMPLE})")
    return rates
