"""The gateway bench's targets (``targets``), each a median and its range over the rounds, taken
round by round against what it is measured from, with its direction (higher or lower is better)
and a verdict: ``yes``, ``NO``, ``within noise`` (an added latency below zero) or ``n/a``."""

from __future__ import annotations

from typing import Any

from .gateway_figures import HIGHER, LOWER, Spread, exact_target, paired, spread_fields, target
from .gateway_rows import CapacityRow, GatewayReport, VariantRow
from .gateway_setup import CAPACITY_FLOORS

__all__ = ["targets"]

#: A decision may cost at most 1.3x a fixed answer: ours req/s / floor req/s at least 1 / 1.3.
CAPACITY_COST = 1.3


def _capacity_targets(protocol: str, floor_name: str, fl: CapacityRow | None,
                      us: CapacityRow | None) -> list[dict[str, Any]]:
    """The capacity targets of one protocol against one floor: by req/s and by server CPU."""
    what = "HTTP keep-alive /check" if protocol == "http" else "gRPC ShouldRateLimit"
    against = ", floor with the same headers" if floor_name == "floor-headers" else ""
    floor_text = "the floor's (a fixed answer with the same headers)" if floor_name == "floor-headers" \
        else "the floor's (a fixed answer)"

    def ratio(what: str) -> Spread | None:
        return Spread.of(paired(us.by_round(what), fl.by_round(what))) if us and fl else None

    def own(row: CapacityRow | None, what: str) -> Spread | None:
        return Spread.of(row.by_round(what).values()) if row else None

    least = round(1 / CAPACITY_COST, 2)
    rps = target(f"service capacity, {what}{against}",
                 f"ours req/s ÷ {floor_text} ≥ {least:g}x (a decision costs ≤ {CAPACITY_COST:g}x a fixed answer)",
                 HIGHER, least, "x", ratio("rps"), Spread(1.0, 1.0, 1.0, 1),
                 abs_unit="req/s", **spread_fields("ours_abs", own(us, "rps")),
                 **spread_fields("floor_abs", own(fl, "rps")))
    short = "HTTP /check" if protocol == "http" else "gRPC"
    cpu = target(f"service capacity, {short}: server CPU per decision{against}",
                 f"ours CPU µs per decision ÷ {floor_text} ≤ {CAPACITY_COST:g}x", LOWER,
                 CAPACITY_COST, "x", ratio("cpu_us"), Spread(1.0, 1.0, 1.0, 1), abs_unit="µs",
                 **spread_fields("ours_abs", own(us, "cpu_us")), **spread_fields("floor_abs", own(fl, "cpu_us")))
    return [rps, cpu]


def _gateway_targets(report: GatewayReport) -> list[dict[str, Any]]:
    """Added p99 and the average latency of each way HAProxy asks ratewarden, against HAProxy
    without limiting in the same round; its floor measured the same way."""
    out: list[dict[str, Any]] = []
    none = report.variant("haproxy")

    def added(v: VariantRow | None) -> Spread | None:
        return Spread.of(paired(v.by_round("p99"), none.by_round("p99"), "diff")) if v and none else None

    def avg(v: VariantRow | None) -> Spread | None:
        return Spread.of(paired(v.by_round("mean"), none.by_round("mean"))) if v and none else None

    # Added p99: 1 ms for the Lua set-up, 0.5 ms for SPOE (the compiled front door's aim). A floor only
    # on the row's own stack: the compiled SPOE agent has none.
    for path, ours_key, floor_key, p99 in (("Lua", "haproxy-ratewarden", "haproxy-floor", 1.0),
                                           ("SPOE", "haproxy-spoe", "haproxy-spoe-floor", 0.5),
                                           ("SPOE, compiled front door", "haproxy-spoe-compiled", "", 0.5)):
        ours, floor = report.variant(ours_key), report.variant(floor_key)
        no_floor = "" if floor_key else "; no floor on its stack"
        out.append(target(f"HAProxy + ratewarden ({path}): added p99",
                          f"≤ {p99:g} ms over HAProxy without limiting (same round{no_floor})", LOWER, p99, "ms",
                          added(ours), added(floor), nothing_added=0.0))
        out.append(target(f"HAProxy + ratewarden ({path}): average latency",
                          f"ours avg ÷ HAProxy without limiting ≤ 1.25x (same round; HAProxy's Lua set-up: 6.99x"
                          f"{no_floor})", LOWER, 1.25, "x", avg(ours), avg(floor), nothing_added=1.0))
    return out


def targets(report: GatewayReport) -> list[dict[str, Any]]:
    """The gateway and capacity targets, and the ratewarden rows exact per tier."""
    out = _gateway_targets(report)
    for protocol, floors in CAPACITY_FLOORS.items():
        for floor_name in floors:
            out += _capacity_targets(protocol, floor_name, report.capacity_row(protocol, floor_name),
                                     report.capacity_row(protocol, "ours"))
    rw = [v for v in report.variants if v.limiter == "ratewarden" and v.rounds]
    exact = all(g.exact == "yes" for v in rw for g in v.groups()) if rw else None
    out.append(exact_target("ratewarden rows exact per tier", "admitted = min(requests, limit) per key, every round",
                            exact))
    return out
