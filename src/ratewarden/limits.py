"""A limit: one rate enforced by one algorithm, ready for the hot path."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

from ._mypyc import mypyc_attr
from .algorithms import Algorithm, AlgorithmName, State, get_algorithm
from .algorithms.fixed_window import fixed_window, fixed_window_of
from .decision import Decision
from .rates import Rate, freeze_rates, parse_rates

__all__ = ["DEFAULT_ALGORITHM", "Limit", "make_limits", "written_rates"]

DEFAULT_ALGORITHM: AlgorithmName = "fixed_window"
_TOKEN_RE = re.compile(r"[^A-Za-z0-9_.:/*-]+")
_FIXED_WINDOW: Final[Algorithm] = fixed_window


@mypyc_attr(allow_interpreted_subclasses=True)
class Limit:
    """A ``Rate`` bound to an algorithm, with its precomputed storage-key suffix and policy name.

    Args:
        rate: How much, per how long.
        algorithm: The algorithm's name (default ``"fixed_window"``).
        name: The policy name shown in headers, 429 bodies, logs and metrics; the default ``""``
            uses the rate's text (``str(rate)``: ``100/minute``).
    """

    __slots__ = ("algorithm", "fn", "name", "period", "quota", "rate", "suffix")

    def __init__(self, rate: Rate, algorithm: AlgorithmName = DEFAULT_ALGORITHM, name: str = "") -> None:
        self.rate = rate
        self.quota = rate.limit  # the rate's parts, read on the hot path without touching the Rate
        self.period = rate.period
        self.algorithm = algorithm
        self.fn: Algorithm = get_algorithm(algorithm)
        burst = "" if rate.burst is None else f"b{rate.burst}"
        debt = "" if rate.debt is None else f"d{rate.debt:g}"
        self.suffix = f"{algorithm}:{rate.ident}{burst}{debt}"
        self.name = _TOKEN_RE.sub("-", name or str(rate))

    def __repr__(self) -> str:
        return f"Limit({self.rate!s}, {self.algorithm!r}, name={self.name!r})"

    def apply(self, state: State | None, now: float, cost: float) -> tuple[State | None, Decision]:
        """``fn(state, now, cost, rate)``: the new state and the decision.

        Args:
            state: The key's live state, ``None`` for a new or expired key.
            now: Seconds since the epoch.
            cost: What the request costs.
        """
        fn = self.fn
        if fn is _FIXED_WINDOW:  # the default algorithm: a direct (compiled) call, no boxing
            return fixed_window_of(state, now, cost, self.quota, self.period)
        return fn(state, now, cost, self.rate)


def make_limits(
    rates: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, name: str = ""
) -> tuple[Limit, ...]:
    """Parse ``rates`` and bind each to ``algorithm``; several rates get distinct policy names, each
    with the rate as it was written (``"10/s; 1000/day"`` named ``api``: ``api-10/s`` and
    ``api-1000/day``).

    Args:
        rates: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
            every one must allow.
        algorithm: The algorithm's name (default ``"fixed_window"``).
        name: The policy name; with several rates each gets ``name-<rate as written>``. Default: each
            rate as written.
    """
    frozen = freeze_rates(rates)
    parsed: Sequence[Rate] = parse_rates(frozen)
    if len(parsed) == 1 and name:
        return (Limit(parsed[0], algorithm, name),)
    texts = written_rates(frozen)
    return tuple(Limit(r, algorithm, f"{name}-{text}" if name else text) for r, text in zip(parsed, texts, strict=True))


def written_rates(rates: str | Rate | Iterable[str | Rate]) -> tuple[str, ...]:
    """Each rate of ``rates`` as the user wrote it (``"10/s; 1000/day"``: ``10/s``, ``1000/day``),
    in ``parse_rates``' order; a ``Rate`` given as an object is its ``str`` (``100/minute``).

    Args:
        rates: Rates as ``parse_rates`` takes them (already read once, e.g. by ``freeze_rates``).
    """
    if isinstance(rates, Rate):
        return (str(rates),)
    if isinstance(rates, str):
        return tuple(part.strip() for part in re.split(r"[;,]", rates) if part.strip())
    return tuple(item.strip() if isinstance(item, str) else str(item) for item in rates)
