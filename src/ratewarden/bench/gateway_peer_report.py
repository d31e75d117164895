"""The gateway bench's peer table (gRPC beside envoyproxy/ratelimit) for the report writers:
its rows as text cells (``peer_table``), its method line, and ``gateway-peers.csv``."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from .gateway_figures import Spread
from .gateway_peer_rows import EXACT_CALLS, EXACT_LIMIT, STATS, PeerRow, vs_reference
from .gateway_rows import GatewayReport
from .gateway_tables import figure

__all__ = ["PEER_COLUMNS", "peer_method", "peer_table", "write_peer_csv"]


def _ratio(row: PeerRow, rows: Sequence[PeerRow], what: str) -> str:
    """Ours ÷ the reference, round by round: the median and its range."""
    return figure(Spread.of(vs_reference(rows, row, what)), 2, "x")


def _admitted(p: PeerRow) -> str:
    if not p.admitted:
        return "-"
    got = sorted(set(p.admitted))
    return f"{'/'.join(map(str, got))} / {p.limit}" + ("" if len(p.admitted) == 1 else f" ({len(p.admitted)} checks)")


def peer_table(report: GatewayReport) -> list[list[str]]:
    """One row per service x cell: its figures, exactness and ours ÷ reference (the reference's own: 1.00x)."""
    out = [["service", "store", "scenario", "workers", "streams", "rounds", "req/s", "p50 ms", "p99 ms",
            "CPU µs/decision", "Redis CPU µs/decision", "admitted / limit", "exact", "ours ÷ reference req/s",
            "ours ÷ reference CPU", "ours ÷ reference p99"]]
    for p in report.peers:
        head = [p.title, p.store, f"{p.scenario} the limit", str(p.workers), f"{p.connections} x 50"]
        if not p.rounds:
            out.append(head + ["0"] + ["-"] * 9 + [f"MISSING: {p.missing or 'no rounds'}"])
            continue
        errors = sum(n for r in p.rounds for n in r.errors.values())
        exact = p.exact + (f" ({errors} errors)" if errors else "") + (f"; stopped: {p.missing}" if p.missing else "")
        ref = p.service == "reference"
        s = p.spread
        out.append(head + [str(len(p.rounds)), figure(s("rps"), 0), figure(s("p50_ms")), figure(s("p99_ms")),
                           figure(s("cpu_us"), 1), figure(s("redis_cpu_us"), 1), _admitted(p), exact] +
                   (["1.00x"] * 3 if ref else [_ratio(p, report.peers, w) for w in ("rps", "cpu_us", "p99_ms")]))
    return out


def peer_method(report: GatewayReport) -> str:
    o = report.options
    return (f"ghz, {o.get('peer_requests')} calls per cell after a warm-up, 50 streams per connection; "
            f"{o.get('peer_rounds')} rounds, every service started once per round (order rotated); CPU per decision: "
            f"the service's processes (and redis-server's) utime + stime from /proc over the calls answered; "
            f"admitted: {EXACT_CALLS} concurrent calls against a fresh {EXACT_LIMIT}/minute descriptor each time "
            f"a service starts; ratios ours ÷ the reference within the same round (median, range).")


PEER_COLUMNS = ["key", "service", "store", "scenario", "workers", "connections", "rounds"] + \
    [f"{s}_{m}" for s in STATS for m in ("median", "min", "max")] + \
    ["admitted", "limit", "exact", "rps_vs_reference", "cpu_vs_reference", "p99_vs_reference", "errors", "missing"]


def write_peer_csv(path: Path, report: GatewayReport) -> None:
    """One row per peer row: the median, min and max over the rounds, the per-round ratios ours ÷ reference."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=PEER_COLUMNS)
        w.writeheader()
        for p in report.peers:
            stats = {f"{s}_{m}": (round(x, 3) if v else "") for s in STATS for v in (p.spread(s),)
                     for m, x in (("median", v.median if v else 0.0), ("min", v.low if v else 0.0),
                                  ("max", v.high if v else 0.0))}
            ratios = {f"{n}_vs_reference": ";".join(f"{x:.3f}" for x in vs_reference(report.peers, p, what))
                      for n, what in (("rps", "rps"), ("cpu", "cpu_us"), ("p99", "p99_ms"))}
            w.writerow({"key": p.key, "service": p.service, "store": p.store, "scenario": p.scenario,
                        "workers": p.workers, "connections": p.connections, "rounds": len(p.rounds)} | stats | ratios
                       | {"admitted": ";".join(map(str, p.admitted)), "limit": p.limit, "exact": p.exact,
                          "errors": sum(n for r in p.rounds for n in r.errors.values()), "missing": p.missing})
