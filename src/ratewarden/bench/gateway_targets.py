"""The gateway bench's targets, each as target / ours / floor from the medians and the minima
over the rounds (``targets``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .gateway_rows import CapacityRow, GatewayReport, VariantRow
from .gateway_setup import CAPACITY_FLOORS

__all__ = ["targets"]


def _capacity_targets(protocol: str, floor_name: str, fl: CapacityRow | None, us: CapacityRow | None,
                      entry: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """The capacity targets of one protocol against one floor: by req/s and by server CPU."""
    what = "HTTP keep-alive /check" if protocol == "http" else "gRPC ShouldRateLimit"
    against = ", floor with the same headers" if floor_name == "floor-headers" else ""
    floor_text = "the fixed answer with the same headers" if floor_name == "floor-headers" else "the fixed-answer floor"

    def cost(i: int, c: CapacityRow | None) -> float | None:
        s, f = (c.stat() if c else None), (fl.stat() if fl else None)
        return None if s is None or f is None or not s[i] else f[i] / s[i]

    e = entry(f"service capacity, {what}{against}", f"decision cost <= 1.3x {floor_text} (floor req/s / ours req/s)",
              1.3, "x", cost, ours_row=us, floor_row=fl)
    for i, suffix in ((1, ""), (0, "_min")):
        e[f"ours_rps{suffix}"] = us.stat()[i] if us and us.stat() else None  # type: ignore[index]
        e[f"floor_rps{suffix}"] = fl.stat()[i] if fl and fl.stat() else None  # type: ignore[index]

    def cpu_cost(i: int, c: CapacityRow | None) -> float | None:
        s, f = (c.cpu_stat() if c else None), (fl.cpu_stat() if fl else None)
        return None if s is None or f is None or not f[i] else s[i] / f[i]

    short = "HTTP /check" if protocol == "http" else "gRPC"
    e2 = entry(f"service capacity, {short}: server CPU per decision{against}",
               f"ours CPU µs per decision <= 1.3x {floor_text}'s per answer", 1.3, "x", cpu_cost,
               ours_row=us, floor_row=fl)
    for i, suffix in ((1, ""), (0, "_min")):
        e2[f"ours_us{suffix}"] = us.cpu_stat()[i] if us and us.cpu_stat() else None  # type: ignore[index]
        e2[f"floor_us{suffix}"] = fl.cpu_stat()[i] if fl and fl.cpu_stat() else None  # type: ignore[index]
    return [e, e2]


def targets(report: GatewayReport) -> list[dict[str, Any]]:
    """The targets, each as target / ours / floor from the medians and the minima over rounds.

    * HAProxy + ratewarden adds <= 1 ms p99 over HAProxy without limiting; floor: the same Lua asking a
      fixed-200 service.
    * its average latency <= 1.25x HAProxy without limiting (the reference set-up measured 6.99x); same floor.
    * both again for the SPOE path (``haproxy-spoe``), floor: the same SPOE asking a fixed agent.
    * capacity per protocol: floor req/s / ours req/s <= 1.3 (the cost of a decision against the cost
      of a fixed answer on the same stack); ours and floor also given as req/s.
    * the ratewarden rows exact per tier.
    """
    out: list[dict[str, Any]] = []
    none = report.variant("haproxy")

    def lat(v: VariantRow | None, what: str, i: int) -> float | None:
        s = v.stat(what) if v is not None else None
        return None if s is None else s[i]

    def entry(name: str, rule: str, target: float, unit: str,
              value: Callable[[int, Any], float | None], *,
              ours_row: Any = None, floor_row: Any = None) -> dict[str, Any]:
        e: dict[str, Any] = {"target": name, "rule": rule, "target_value": target, "unit": unit}
        for i, suffix in ((1, ""), (0, "_min")):
            o, f = value(i, ours_row), value(i, floor_row)
            e[f"ours{suffix}"], e[f"floor{suffix}"] = o, f
            e[f"met{suffix}"] = None if o is None else o <= target
        return e

    def added_p99(i: int, v: VariantRow | None) -> float | None:
        a, b = lat(v, "p99", i), lat(none, "p99", i)
        return None if a is None or b is None else a - b

    def avg_ratio(i: int, v: VariantRow | None) -> float | None:
        a, b = lat(v, "mean", i), lat(none, "mean", i)
        return None if a is None or b is None or not b else a / b

    # Added p99: 1 ms for the Lua set-up (the gateway issue's), 0.5 ms for SPOE (the compiled front door's issue).
    for path, ours_key, floor_key, p99 in (("Lua", "haproxy-ratewarden", "haproxy-floor", 1.0),
                                           ("SPOE", "haproxy-spoe", "haproxy-spoe-floor", 0.5),
                                           ("SPOE, compiled front door", "haproxy-spoe-compiled", "haproxy-spoe-floor",
                                            0.5)):
        ours, floor = report.variant(ours_key), report.variant(floor_key)
        out.append(entry(f"HAProxy + ratewarden ({path}): added p99", f"<= {p99:g} ms over HAProxy without limiting",
                         p99, "ms", added_p99, ours_row=ours, floor_row=floor))
        out.append(entry(f"HAProxy + ratewarden ({path}): average latency",
                         "<= 1.25x HAProxy without limiting (HAProxy's Lua set-up: 6.99x)", 1.25, "x", avg_ratio,
                         ours_row=ours, floor_row=floor))
    for protocol, floors in CAPACITY_FLOORS.items():
        for floor_name in floors:
            out += _capacity_targets(protocol, floor_name, report.capacity_row(protocol, floor_name),
                                     report.capacity_row(protocol, "ours"), entry)
    rw = [v for v in report.variants if v.limiter == "ratewarden" and v.rounds]
    exact = all(g.exact == "yes" for v in rw for g in v.groups()) if rw else None
    out.append({"target": "ratewarden rows exact per tier", "rule": "admitted = min(requests, limit) per key, "
                "every round", "target_value": None, "unit": "", "ours": exact, "floor": None, "met": exact,
                "ours_min": exact, "floor_min": None, "met_min": exact})
    return out
