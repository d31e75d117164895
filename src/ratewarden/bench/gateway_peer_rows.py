"""The gateway bench's peer rows (``gateway_peers``): gRPC ``ShouldRateLimit`` of ``ratewarden serve``
(the Python grpc server and the compiled front door) beside envoyproxy/ratelimit, one row per service x
store x scenario x workers x connections, with each round's figures, the exactness checks, the ratios
to the reference in the same round and the issue's targets against the reference."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .gateway_figures import HIGHER, LOWER, Spread, exact_target, spread_fields, target

__all__ = ["EXACT_CALLS", "EXACT_LIMIT", "SERVICES", "SHORT", "PeerRound", "PeerRow", "peer_targets", "vs_reference"]

#: The exactness check: this many concurrent calls against a fresh descriptor limited to ``EXACT_LIMIT``/minute.
EXACT_CALLS, EXACT_LIMIT = 200, 50
SERVICES = {"python": "ratewarden serve (Python grpc)", "front": "ratewarden serve (compiled front door)",
            "front-same": "ratewarden serve (compiled front door), the reference's answers (--envoy-headers none)",
            "reference": "envoyproxy/ratelimit"}
#: Each service in a few words (chart legends, progress lines).
SHORT = {"python": "ratewarden, Python grpc", "front": "ratewarden, compiled",
         "front-same": "ratewarden, compiled, same answers", "reference": "envoyproxy/ratelimit"}
#: What each compiled front door row is compared as: ratewarden's default answers (its five rate limit
#: headers), and the reference's own default answers (no headers: the same bytes on the wire).
ANSWERS = {"front": "ratewarden's headers", "front-same": "the same answers"}
STATS = ("rps", "p50_ms", "p99_ms", "cpu_us", "redis_cpu_us")


@dataclass
class PeerRound:
    """One ghz run of a row: calls answered, req/s, latency, and CPU per decision of the service's
    processes and of redis-server (None on memory)."""

    round: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float
    redis_cpu_us: float | None
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class PeerRow:
    service: str  # python | front | front-same | reference
    store: str  # redis | memory
    scenario: str  # over | under (the limit)
    workers: int
    connections: int  # ghz connections, 50 streams each
    rounds: list[PeerRound] = field(default_factory=list)
    #: Per round: what the service admitted of ``EXACT_CALLS`` concurrent calls against ``EXACT_LIMIT``/minute.
    admitted: list[int] = field(default_factory=list)
    limit: int = EXACT_LIMIT
    missing: str = ""

    @property
    def key(self) -> str:
        return f"{self.service}-{self.store}-{self.scenario}-w{self.workers}-c{self.connections}"

    @property
    def title(self) -> str:
        return SERVICES[self.service] + (f", {self.workers} workers" if self.workers > 1 else "")

    def stat(self, what: str) -> tuple[float, float] | None:
        """(min, median) over the rounds of ``what`` (one of ``STATS``)."""
        values = [v for v in (getattr(r, what) for r in self.rounds) if v is not None]
        return (min(values), statistics.median(values)) if values else None

    def by_round(self, what: str) -> dict[int, float | None]:
        """Round number -> ``what`` (one of ``STATS``) in that round."""
        return {r.round: getattr(r, what) for r in self.rounds}

    def spread(self, what: str) -> Spread | None:
        """The median and range over the rounds of ``what``."""
        return Spread.of(self.by_round(what).values())

    @property
    def exact(self) -> str:
        """yes: every check admitted the limit; NO: one admitted less; ⚠ over: one admitted more."""
        if not self.admitted:
            return "—"
        if any(a > self.limit for a in self.admitted):
            return "⚠ over"
        return "yes" if all(a == self.limit for a in self.admitted) else "NO"

    def same_cell(self, other: PeerRow) -> bool:
        """The same load on the same store: rows to compare round by round."""
        return (self.store, self.scenario, self.connections) == (other.store, other.scenario, other.connections)


def vs_reference(rows: Sequence[PeerRow], row: PeerRow, what: str) -> list[float]:
    """``row``'s ``what`` over the reference's, round by round (the same round only: both met the
    same machine load); empty without a reference row under the same load."""
    ref = next((r for r in rows if r.service == "reference" and r.same_cell(row) and r is not row), None)
    if ref is None:
        return []
    theirs = {r.round: getattr(r, what) for r in ref.rounds}
    out = []
    for r in row.rounds:
        mine, other = getattr(r, what), theirs.get(r.round)
        if mine is not None and other:
            out.append(mine / other)
    return out


def peer_targets(rows: Sequence[PeerRow]) -> list[dict[str, Any]]:
    """The gRPC targets, for the compiled front door with one worker against one reference process
    on Redis, per scenario, each ours ÷ reference in the same round: req/s >= 1.0x (higher is
    better), CPU per decision <= 1.0x and p99 <= 1.0x (lower is better); and every peer row exact."""
    out: list[dict[str, Any]] = []
    for ours in rows:
        if ours.service not in ANSWERS or (ours.store, ours.workers, ours.connections) != ("redis", 1, 1) \
                or not ours.rounds:
            continue
        ref = next((r for r in rows if r.service == "reference" and r.same_cell(ours) and r.rounds), None)
        if ref is None:
            continue
        where = f"gRPC vs envoyproxy/ratelimit (Redis, {ours.scenario} the limit, {ANSWERS[ours.service]})"
        for name, what, direction, unit in (("req/s", "rps", HIGHER, "req/s"), ("CPU per decision", "cpu_us", LOWER, "µs"),
                                            ("p99", "p99_ms", LOWER, "ms")):
            word = "≥" if direction == HIGHER else "≤"
            out.append(target(f"{where}: {name}", f"ours ÷ reference {word} 1.0x (same round)", direction, 1.0, "x",
                              Spread.of(vs_reference(rows, ours, what)), Spread(1.0, 1.0, 1.0, 1), abs_unit=unit,
                              **spread_fields("ours_abs", ours.spread(what)),
                              **spread_fields("floor_abs", ref.spread(what))))
    checked = [r for r in rows if r.admitted]
    if checked:
        out.append(exact_target("gRPC rows exact (ratewarden and the reference)",
                                f"{EXACT_CALLS} concurrent calls against {EXACT_LIMIT}/min admit {EXACT_LIMIT}, every "
                                "round", all(r.exact == "yes" for r in checked)))
    return out
