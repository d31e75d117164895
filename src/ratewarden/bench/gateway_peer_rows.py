"""The gateway bench's peer rows (``gateway_peers``): gRPC ``ShouldRateLimit`` of ``ratewarden serve``
(the Python grpc server and the compiled front door) beside envoyproxy/ratelimit, one row per service x
store x scenario x workers x connections, with each round's figures, the exactness checks, the ratios
to the reference in the same round, and the targets against the reference read beside the floor (the
compiled front door answering a fixed OK, deciding nothing)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .gateway_figures import HIGHER, LOWER, Spread, exact_target, spread_fields, target

__all__ = ["EXACT_CALLS", "EXACT_LIMIT", "SERVICES", "SHORT", "TARGETS", "PeerRound", "PeerRow", "peer_targets", "reference_for",
           "vs_reference"]

#: The exactness check: this many concurrent calls against a fresh descriptor limited to ``EXACT_LIMIT``/minute.
EXACT_CALLS, EXACT_LIMIT = 200, 50
SERVICES = {"python": "ratewarden serve (Python grpc)", "front": "ratewarden serve (compiled front door)",
            "front-same": "ratewarden serve (compiled front door), the reference's answers (--envoy-headers none)",
            "reference": "envoyproxy/ratelimit",
            "floor": "floor: the compiled front door answering every call allowed (no Python, no store)"}
#: Each service in a few words (chart legends, progress lines).
SHORT = {"python": "ratewarden, Python grpc", "front": "ratewarden, compiled",
         "front-same": "ratewarden, compiled, same answers", "reference": "envoyproxy/ratelimit",
         "floor": "floor, compiled, fixed OK"}
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
    service: str  # python | front | front-same | reference | floor
    store: str  # redis | memory | none (the floor)
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


def reference_for(rows: Sequence[PeerRow], row: PeerRow, scenario: str = "") -> PeerRow | None:
    """The reference's row under ``row``'s load (its ``scenario`` unless another is given), on its Redis:
    the reference runs on Redis only, so a memory or floor row is set against it there."""
    want = (scenario or row.scenario, row.connections)
    return next((r for r in rows if r.service == "reference" and (r.scenario, r.connections) == want
                 and r is not row), None)


def vs_reference(rows: Sequence[PeerRow], row: PeerRow, what: str, scenario: str = "") -> list[float]:
    """``row``'s ``what`` over the reference's, round by round (the same round only: both met the
    same machine load); empty without a reference row under the same load."""
    ref = reference_for(rows, row, scenario)
    if ref is None or row.service == "reference":
        return []
    theirs = {r.round: getattr(r, what) for r in ref.rounds}
    out = []
    for r in row.rounds:
        mine, other = getattr(r, what), theirs.get(r.round)
        if mine is not None and other:
            out.append(mine / other)
    return out


#: The targets against the reference, for ratewarden giving its answers (``front-same``, one worker):
#: (store, scenario, ghz connections, what, label, direction, ours ÷ reference).
TARGETS = (
    ("redis", "under", 1, "rps", "req/s", HIGHER, 1.5),
    ("redis", "under", 1, "cpu_us", "CPU per decision", LOWER, 0.5),
    ("redis", "under", 1, "redis_cpu_us", "Redis CPU per decision", LOWER, 1.0),
    ("redis", "under", 1, "p99_ms", "p99", LOWER, 1.0),
    ("redis", "under", 4, "p99_ms", "p99", LOWER, 1.0),
    ("redis", "over", 1, "rps", "req/s", HIGHER, 2.0),
    ("memory", "under", 1, "rps", "req/s (the reference on Redis)", HIGHER, 2.5),
)
UNITS = {"rps": "req/s", "cpu_us": "µs", "redis_cpu_us": "µs", "p99_ms": "ms"}


def peer_targets(rows: Sequence[PeerRow]) -> list[dict[str, Any]]:
    """The gRPC targets: the compiled front door giving the reference's answers, one worker, against
    one reference process on Redis, each ours ÷ reference in the same round (``TARGETS``), beside the
    floor ÷ reference under the same load (the floor answers alike over and under the limit, so its
    ``under`` cell stands for both); and every exactness check exact."""
    out: list[dict[str, Any]] = []
    for store, scenario, connections, what, label, direction, value in TARGETS:
        ours = next((r for r in rows if (r.service, r.store, r.scenario, r.workers, r.connections)
                     == ("front-same", store, scenario, 1, connections) and r.rounds), None)
        ref = reference_for(rows, ours, scenario) if ours else None
        if ours is None or ref is None or not ref.rounds:
            continue
        floor = next((r for r in rows if r.service == "floor" and r.connections == connections and r.rounds), None)
        floor_ratio = Spread.of(vs_reference(rows, floor, what, scenario)) if floor and what != "redis_cpu_us" else None
        word = "≥" if direction == HIGHER else "≤"
        where = f"gRPC vs envoyproxy/ratelimit ({store}, {scenario} the limit, {connections} connection" \
                f"{'s' if connections > 1 else ''}, the same answers)"
        out.append(target(f"{where}: {label}", f"ours ÷ reference {word} {value}x (same round)", direction, value, "x",
                          Spread.of(vs_reference(rows, ours, what)), floor_ratio, abs_unit=UNITS[what],
                          **spread_fields("ours_abs", ours.spread(what)),
                          **spread_fields("floor_abs", floor.spread(what) if floor and floor_ratio else None),
                          **spread_fields("reference_abs", ref.spread(what))))
    checked = [r for r in rows if r.admitted]
    if checked:
        out.append(exact_target("gRPC rows exact (ratewarden and the reference)",
                                f"{EXACT_CALLS} concurrent calls against {EXACT_LIMIT}/min admit {EXACT_LIMIT}, every "
                                "round", all(r.exact == "yes" for r in checked)))
    return out
