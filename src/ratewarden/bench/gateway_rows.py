"""The gateway bench's results: a round's row per variant and group (``round_row``: requests,
latency, admitted against the limit and whether that is exact), the sums over the rounds, the
capacity rows and the whole report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import gateway_procs as gp
from .gateway_figures import Spread
from .gateway_load import LoadResult, Plan
from .gateway_peer_rows import STATS, PeerRow, vs_reference
from .gateway_setup import GROUPS, VariantSpec
from .results import percentile

__all__ = ["CapacityRow", "GatewayReport", "GroupRow", "RoundRow", "VariantRow", "keys_for", "round_row", "worst"]


@dataclass
class GroupRow:
    """One group in one round (or summed over the rounds): the reference set-up's columns and admitted / limit."""

    group: str
    requests: int = 0
    admitted: int = 0
    limited: int = 0
    other: int = 0
    lat_avg_ms: float = 0.0
    limit: int | None = None  # per-key limit x keys (x rounds in a sum); None without a limiter
    expected: int | None = None  # what an exact limiter admits: min(requests, limit) per key
    allowance: int | None = None  # nginx limit_req: the limit plus what its bucket leaks during the run
    exact: str = "—"  # yes | within | NO (under) | ⚠ over | — (no limiter)

    @property
    def success_pct(self) -> float:
        return 100.0 * self.admitted / self.requests if self.requests else 0.0

    @property
    def over_limit(self) -> bool:
        return self.exact.startswith("⚠")


@dataclass
class RoundRow:
    round: int
    requests: int
    unsent: int
    seconds: float
    rps: float
    latency_ms: dict[str, float]
    statuses: dict[str, int]
    groups: list[GroupRow]


@dataclass
class VariantRow:
    key: str
    title: str
    gateway: str
    limiter: str
    rounds: list[RoundRow] = field(default_factory=list)
    missing: str = ""

    def stat(self, what: str) -> tuple[float, float] | None:
        """(min, median) over the rounds of ``rps`` or a latency (``mean``, ``p95``, ``p99``)."""
        values = [r.rps if what == "rps" else r.latency_ms[what] for r in self.rounds]
        if not values:
            return None
        return min(values), statistics.median(values)

    def by_round(self, what: str) -> dict[int, float | None]:
        """Round number -> ``rps`` or a latency (``mean``, ``p95``, ``p99``) of that round."""
        return {r.round: r.rps if what == "rps" else r.latency_ms[what] for r in self.rounds}

    def spread(self, what: str) -> Spread | None:
        """The median and range over the rounds of ``rps`` or a latency."""
        return Spread.of(self.by_round(what).values())

    def groups(self) -> list[GroupRow]:
        """The per-group table summed over the rounds (exact: the worst round)."""
        out = []
        for g in GROUPS:
            rows = [gr for r in self.rounds for gr in r.groups if gr.group == g]
            total = GroupRow(g)
            for gr in rows:
                total.requests += gr.requests
                total.admitted += gr.admitted
                total.limited += gr.limited
                total.other += gr.other
            answered = sum(gr.requests for gr in rows)
            total.lat_avg_ms = sum(gr.lat_avg_ms * gr.requests for gr in rows) / answered if answered else 0.0
            if rows and rows[0].limit is not None:
                total.limit = sum(gr.limit or 0 for gr in rows)
                total.expected = sum(gr.expected or 0 for gr in rows)
                if any(gr.allowance is not None for gr in rows):
                    total.allowance = sum(gr.allowance or 0 for gr in rows)
                total.exact = worst([gr.exact for gr in rows])
            out.append(total)
        return out

    @property
    def over_limit(self) -> bool:
        return any(g.over_limit for r in self.rounds for g in r.groups)


@dataclass
class CapacityRow:
    protocol: str  # http | grpc
    server: str  # floor | ours | ratewarden serve
    stack: str
    rps_runs: list[float] = field(default_factory=list)
    #: The server process's CPU time / wall time during each run (100 = one core busy): under ~90,
    #: the client, not the server, set the pace.
    cpu_pct_runs: list[float] = field(default_factory=list)
    #: The server's CPU time per answered request (µs) in each run: the cost of a decision, which
    #: other work on a shared core does not inflate the way it lowers req/s.
    cpu_us_runs: list[float] = field(default_factory=list)
    requests: int = 0
    bad: int = 0
    missing: str = ""

    def stat(self) -> tuple[float, float] | None:
        return (min(self.rps_runs), statistics.median(self.rps_runs)) if self.rps_runs else None

    def cpu_stat(self) -> tuple[float, float] | None:
        """(min, median) CPU µs per request over the rounds."""
        return (min(self.cpu_us_runs), statistics.median(self.cpu_us_runs)) if self.cpu_us_runs else None

    def by_round(self, what: str) -> dict[int, float | None]:
        """Round (run) number -> ``rps`` or ``cpu_us`` (server CPU µs per request)."""
        runs = self.rps_runs if what == "rps" else self.cpu_us_runs
        return dict(enumerate(runs))


@dataclass
class GatewayReport:
    options: dict[str, Any]
    service: str
    variants: list[VariantRow]
    capacity: list[CapacityRow]
    targets: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: gRPC beside envoyproxy/ratelimit, and what ran or was skipped and why.
    peers: list[PeerRow] = field(default_factory=list)
    peer_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for p, pd in zip(self.peers, data["peers"], strict=True):
            pd["key"], pd["title"], pd["exact"] = p.key, p.title, p.exact
            pd["summary"] = {w: _spread_dict(p.spread(w)) for w in STATS}
            pd["vs_reference"] = {w: vs_reference(self.peers, p, w) for w in ("rps", "cpu_us", "p99_ms")}
        for v, vd in zip(self.variants, data["variants"], strict=True):
            vd["summary"] = {w: _spread_dict(v.spread(w)) for w in ("rps", "mean", "p95", "p99")}
            vd["groups_total"] = [asdict(g) | {"success_pct": g.success_pct} for g in v.groups()]
            vd["over_limit"] = v.over_limit
        return data

    def variant(self, key: str) -> VariantRow | None:
        """The variant ``key`` if it ran (None when missing or without rounds)."""
        for v in self.variants:
            if v.key == key and v.rounds and not v.missing:
                return v
        return None

    def capacity_row(self, protocol: str, server: str) -> CapacityRow | None:
        """The capacity row of ``server`` over ``protocol`` if it measured anything."""
        for c in self.capacity:
            if c.protocol == protocol and c.server == server and c.rps_runs:
                return c
        return None


def _spread_dict(s: Spread | None) -> dict[str, float] | None:
    return None if s is None else {"median": s.median, "min": s.low, "max": s.high}


_RANK = {"⚠ over": 4, "NO": 3, "within": 2, "yes": 1, "—": 0}


def worst(values: Sequence[str]) -> str:
    """The worst of exactness verdicts (``⚠ over`` worst, ``—`` best)."""
    return max(values, key=lambda v: _RANK.get(v, 0)) if values else "—"



def keys_for(variant: str, round_no: int, per_group: int) -> list[tuple[str, str]]:
    """Fresh API keys of one variant's round, as (key, group), groups interleaved."""
    tag = "w" if round_no < 0 else str(round_no)
    return [(f"{g}-{variant}-{tag}-{k}", g) for k in range(per_group) for g in GROUPS]


def round_row(round_no: int, spec: VariantSpec, plan: Plan, result: LoadResult,
              limits: Mapping[str, int] = gp.GROUP_LIMITS) -> RoundRow:
    """One run's figures: latency over every answer, the groups' tables and their exactness."""
    lat = sorted(s.latency_s * 1000 for s in result.samples)
    statuses: dict[str, int] = {}
    for s in result.samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    per_key: list[dict[str, float]] = [{"n": 0, "ok": 0, "429": 0, "lat": 0.0} for _ in plan.keys]
    for s in result.samples:
        k = per_key[s.key]
        k["n"] += 1
        k["lat"] += s.latency_s * 1000
        if 200 <= s.status < 300:
            k["ok"] += 1
        elif s.status == 429:
            k["429"] += 1
    groups = []
    limited = spec.limiter in ("native", "ratewarden")
    for g in GROUPS:
        idx = [i for i, (_, grp) in enumerate(plan.keys) if grp == g]
        row = GroupRow(g)
        row.requests = int(sum(per_key[i]["n"] for i in idx))
        row.admitted = int(sum(per_key[i]["ok"] for i in idx))
        row.limited = int(sum(per_key[i]["429"] for i in idx))
        row.other = row.requests - row.admitted - row.limited
        row.lat_avg_ms = sum(per_key[i]["lat"] for i in idx) / row.requests if row.requests else 0.0
        if limited:
            limit = limits[g]
            leaky = spec.gateway == "nginx" and spec.limiter == "native"
            verdicts = []
            row.limit = limit * len(idx)
            row.expected = 0
            if leaky:
                row.allowance = 0
            for i in idx:
                n, ok = int(per_key[i]["n"]), int(per_key[i]["ok"])
                expected = min(n, limit)
                allowance = limit + math.floor(limit * result.seconds / 60) if leaky else limit
                row.expected += expected
                if leaky and row.allowance is not None:
                    row.allowance += allowance
                if ok == expected:
                    verdicts.append("yes")
                elif ok > allowance:
                    verdicts.append("⚠ over")
                elif ok > limit:
                    verdicts.append("within")
                else:
                    verdicts.append("NO")
            row.exact = worst(verdicts)
        groups.append(row)
    mean = sum(lat) / len(lat) if lat else 0.0
    latency = {"mean": mean, "p50": percentile(lat, 50), "p95": percentile(lat, 95), "p99": percentile(lat, 99),
               "max": lat[-1] if lat else 0.0, "min": lat[0] if lat else 0.0}
    answered = len(result.samples)
    return RoundRow(round_no, answered, result.unsent, result.seconds,
                    answered / result.seconds if result.seconds else 0.0, latency, statuses, groups)
