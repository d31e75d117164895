"""Result records and the statistics over them: nearest-rank percentiles and median-run selection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ArgumentError

__all__ = ["BASELINES", "Row", "Run", "Spread", "baseline_of", "median_run", "percentile", "spread",
           "summarize_latencies"]

#: The apps without a limiter, each the baseline of the libraries measured on its framework: ``bare``
#: (FastAPI) for every library but the Litestar pair, measured against bare Litestar.
BASELINES = ("bare", "litestar-bare", "fastify-bare")


def baseline_of(library: str) -> str:
    """The library whose rows are ``library``'s ``x bare``: bare Litestar for the Litestar pair."""
    if library.startswith("rlflx-") or library == "fastify-bare":  # rate-limiter-flexible: its own (Node) app
        return "fastify-bare"
    return "litestar-bare" if library in ("litestar", "ratewarden-litestar", "litestar-bare") else "bare"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values: the smallest value with at least q% at or below it."""
    if not sorted_values:
        return 0.0
    if not 0 <= q <= 100:
        raise ArgumentError(f"percentile must be within 0..100, got {q}")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarize_latencies(latencies_ms: Sequence[float]) -> dict[str, float]:
    """Mean and p50/p95/p99/p99.9 (nearest rank) of latencies in milliseconds."""
    values = sorted(latencies_ms)
    mean = sum(values) / len(values) if values else 0.0
    return {
        "mean": mean,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "p999": percentile(values, 99.9),
        "max": values[-1] if values else 0.0,
    }


@dataclass(frozen=True)
class Spread:
    """Min, median, max and coefficient of variation (sample stdev / mean, %; None under 2 values)."""

    min: float
    median: float
    max: float
    cv_pct: float | None


def spread(values: Sequence[float]) -> Spread | None:
    """The :class:`Spread` of ``values`` (None when there are none); the median is the upper middle one."""
    if not values:
        return None
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    mean = sum(ordered) / len(ordered)
    cv: float | None = None
    if len(ordered) > 1 and mean:
        var = sum((v - mean) ** 2 for v in ordered) / (len(ordered) - 1)
        cv = 100.0 * math.sqrt(var) / mean
    return Spread(ordered[0], mid, ordered[-1], cv)


@dataclass
class Run:
    """One timed iteration of one configuration."""

    requests: int
    duration_s: float
    status: dict[str, int]
    latency_ms: dict[str, float]
    errors: int = 0
    cpu_pct: float | None = None
    rss_mb: float | None = None
    store_calls: int | None = None
    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Handler runs counted by the server itself (live runs): the exact admitted count, responses
    #: wrk never read included. None where the server could not say (then the 2xx count stands in).
    admitted: int | None = None
    #: Checks the limiter decided without its store during the iteration, by reason (ratewarden's
    #: ``Limiter.without_store()``; empty for the peers and when every check reached the store).
    without_store: dict[str, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def allowed(self) -> int:
        return sum(n for code, n in self.status.items() if code.startswith("2") or code == "ok")

    @property
    def throttled(self) -> int:
        return self.status.get("429", 0) + self.status.get("rate_limit", 0)


def median_run(runs: Sequence[Run]) -> Run:
    """The median iteration by requests/s (the upper middle one for an even count).

    Selecting a whole run (rather than averaging fields) keeps its latencies and counts consistent.
    """
    if not runs:
        raise ArgumentError("no runs to select from")
    ordered = sorted(runs, key=lambda r: r.rps)
    return ordered[len(ordered) // 2]


@dataclass
class Row:
    """One summary line: library x scenario x store x driver x concurrency, from the median run."""

    library: str
    scenario: str
    group: str
    title: str
    store: str
    driver: str
    concurrency: int
    requests: int
    rps: float
    allowed: int
    throttled: int
    errors: int
    success_pct: float
    throttled_pct: float
    lat_mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    expected_allowed: int | None
    correct: bool | None
    iterations: int
    rps_runs: list[float]
    algorithm: str = "fixed_window"
    cpu_pct: float | None = None
    rss_mb: float | None = None
    calls_per_request: float | None = None
    vs_bare: float | None = None
    note: str = ""
    workers: int = 1
    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Requests the limited handlers ran (server-side count in live runs, the 2xx count otherwise).
    admitted: int | None = None
    #: The largest ``admitted`` of the timed iterations (the median one may be under the limit
    #: while another was over it).
    admitted_max: int | None = None
    #: The most an exact limiter may admit in the iteration (None: no limiter, or not known).
    limit: int | None = None
    #: ``admitted > limit``: the limiter let through more than its limit. Such a row's req/s and
    #: ratio against no limiter are not a win: every report marks them.
    over_limit: bool = False
    #: Where ``admitted`` comes from: ``"handler"`` (the server counted its handler runs) or ``"2xx"``.
    admitted_source: str = ""
    #: Checks decided without the store, by reason, only the non-zero ones (ratewarden rows).
    without_store: dict[str, int] = field(default_factory=dict)
    #: What the row measures (a key of ``scenarios.MEASURES``: allowed, mixed, rejected, admitted).
    measure: str = ""
    #: req/s over the timed rounds: lowest, highest, and coefficient of variation in % (how noisy).
    rps_min: float | None = None
    rps_max: float | None = None
    rps_cv_pct: float | None = None
    #: The ratio to no limiter round by round (same round of both rows), lowest and highest.
    vs_bare_min: float | None = None
    vs_bare_max: float | None = None

    @property
    def admitted_cell(self) -> str:
        """``"admitted / limit"`` as the reports print it, ``⚠`` first when over the limit."""
        if self.admitted is None:
            return "—"
        limit = "no limit" if self.limit is None else f"{self.limit:,}"
        worst = self.admitted_max
        more = f" (max {worst:,})" if self.over_limit and worst is not None and worst != self.admitted else ""
        return f"{'⚠ ' if self.over_limit else ''}{self.admitted:,} / {limit}{more}"

    @property
    def exact_cell(self) -> str:
        """``yes`` / ``NO`` (admitted the exact count or not), ``⚠ over`` above the limit, ``within``
        where only a ceiling is known, ``—`` without a limiter."""
        if self.over_limit:
            return "⚠ over"
        if self.correct is not None and self.library not in BASELINES:
            return "yes" if self.correct else "NO"
        return "within" if self.limit is not None and self.admitted is not None else "—"

    @property
    def spread_cell(self) -> str:
        """req/s over the rounds as ``"min-max (cv n%)"`` ("—" with a single round)."""
        if self.rps_min is None or self.rps_max is None or self.iterations < 2:
            return "—"
        cv = f" (cv {self.rps_cv_pct:.0f}%)" if self.rps_cv_pct is not None else ""
        return f"{self.rps_min:,.0f}-{self.rps_max:,.0f}{cv}"

    @property
    def ratio_spread_cell(self) -> str:
        """The round-by-round ratio to no limiter as ``"min-max"`` ("" when not known)."""
        if self.vs_bare_min is None or self.vs_bare_max is None or self.iterations < 2:
            return ""
        return f"{self.vs_bare_min:.2f}-{self.vs_bare_max:.2f}"

    @property
    def without_store_cell(self) -> str:
        """The non-zero counts of checks decided without the store, ``"reason n, ..."`` ("" if none)."""
        return ", ".join(f"{k} {v:,}" for k, v in self.without_store.items() if v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
