"""The gateway report's figures: a median with its range over the rounds (``Spread``), ratios and
differences taken round by round (``paired``), and how a figure is judged against a target or a
peer (``judge``, ``winner``): every ratio is ours ÷ theirs, a metric is either higher or lower
is better, and an added latency below zero is measurement noise, never a pass."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BETTER", "DASH", "HIGHER", "LOWER", "NOISE", "Spread", "exact_target", "judge", "paired", "spread_fields", "target",
           "winner"]

HIGHER, LOWER = "higher", "lower"
#: What a figure that cannot decide is called: a negative added latency, a range across the line.
NOISE = "within noise"
#: Between the ends of a range: an en dash.
DASH = "\u2013"
BETTER = {HIGHER: "higher is better", LOWER: "lower is better"}


@dataclass(frozen=True)
class Spread:
    """A figure over the rounds: the median, and the range (min to max) of the rounds."""

    median: float
    low: float
    high: float
    rounds: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        """The spread of ``values`` (None ones left out); None when there are none."""
        got = [v for v in values if v is not None]
        return cls(statistics.median(got), min(got), max(got), len(got)) if got else None

    def text(self, digits: int = 2, unit: str = "") -> str:
        """``0.43 (0.36-0.55) ms`` (an en dash; ``to`` beside a negative end): the median, then the range
        when there are several rounds."""
        def f(x: float) -> str:
            return f"{x:,.{digits}f}"

        if self.rounds < 2:
            return f(self.median) + unit
        join = " to " if self.low < 0 or self.high < 0 else DASH
        return f"{f(self.median)} ({f(self.low)}{join}{f(self.high)}){unit}"


def paired(ours: Mapping[int, float | None], theirs: Mapping[int, float | None], how: str = "ratio") -> list[float]:
    """Round by round (the same round only: both met the same machine load), ours ÷ theirs
    (``ratio``) or ours - theirs (``diff``)."""
    out = []
    for r, mine in sorted(ours.items()):
        other = theirs.get(r)
        if mine is None or other is None:
            continue
        if how == "diff":
            out.append(mine - other)
        elif other:
            out.append(mine / other)
    return out


def judge(s: Spread | None, direction: str, target: float, nothing_added: float | None = None) -> str:
    """``yes`` when the median meets ``target`` in ``direction`` (LOWER: at most, HIGHER: at least),
    ``NO`` when it does not, ``n/a`` without a figure. For an added cost (a latency difference, whose
    ``nothing_added`` is 0; a ratio to the same path without the check, 1), a median below nothing
    added is ``within noise``: a check cannot make a request faster."""
    if s is None:
        return "n/a"
    if nothing_added is not None and s.median < nothing_added:
        return NOISE
    ok = s.median <= target if direction == LOWER else s.median >= target
    return "yes" if ok else "NO"


def winner(s: Spread | None, direction: str) -> str:
    """Who a ratio ours ÷ theirs favours: ``ours``, ``theirs``, or ``within noise`` when the rounds
    do not agree (their range spans 1.0); ``n/a`` without a figure."""
    if s is None:
        return "n/a"
    if s.rounds > 1 and s.low <= 1.0 <= s.high:
        return NOISE
    if s.median == 1.0:
        return NOISE
    better = s.median > 1.0 if direction == HIGHER else s.median < 1.0
    return "ours" if better else "theirs"


def spread_fields(prefix: str, s: Spread | None) -> dict[str, Any]:
    """``{prefix: median, prefix_min: low, prefix_max: high, prefix_rounds: n}`` (None without a figure)."""
    return {prefix: s.median if s else None, f"{prefix}_min": s.low if s else None,
            f"{prefix}_max": s.high if s else None, f"{prefix}_rounds": s.rounds if s else 0}


def target(name: str, rule: str, direction: str, value: float, unit: str, ours: Spread | None,
           floor: Spread | None, nothing_added: float | None = None, **extra: Any) -> dict[str, Any]:
    """One target: ours and the floor as median and range, and the verdict on ours' median."""
    return {"target": name, "rule": rule, "direction": direction, "target_value": value, "unit": unit,
            **spread_fields("ours", ours), **spread_fields("floor", floor),
            "met": judge(ours, direction, value, nothing_added), **extra}


def exact_target(name: str, rule: str, exact: bool | None) -> dict[str, Any]:
    """A target met when every row admitted what an exact limiter admits."""
    return {"target": name, "rule": rule, "direction": "exact", "target_value": None, "unit": "",
            **spread_fields("ours", None), **spread_fields("floor", None),
            "met": "n/a" if exact is None else ("yes" if exact else "NO")}
