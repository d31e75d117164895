"""The gateway bench's report, named as ``ratewarden bench``'s: ``report.md`` and ``report.html`` (one
page opening with the verdict against each peer), ``results.json``, ``summary.csv`` (one row per
variant x group), ``capacity.csv`` and ``peers.csv``; and the terminal summary (``summary``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .gateway_figures import Spread, paired
from .gateway_html import html
from .gateway_peer_report import write_peer_csv
from .gateway_rows import CapacityRow, GatewayReport, worst
from .gateway_sections import sections
from .gateway_tables import md_table, title
from .gateway_terminal import FILES, summary

__all__ = ["FILES", "html", "markdown", "summary", "write"]


def markdown(report: GatewayReport) -> str:
    """The report: its title, then ``sections`` (without the page's charts)."""
    parts = [f"# {title(report)}", ""]
    for s in sections(report):
        parts += [f"{'#' * s.level} {s.heading}", ""]
        if s.text:
            parts += [s.text, ""]
        if s.notes:
            parts += [*(f"- {note}" for note in s.notes), ""]
        if s.rows:
            parts += [md_table(s.rows), ""]
    return "\n".join(parts)


CSV_COLUMNS = ["variant", "title", "gateway", "limiter", "group", "rounds", "requests", "admitted", "limited",
               "other", "lat_avg_ms", "success_pct", "limit", "expected", "allowance", "exact", "over_limit"] + \
    [f"{n}_{m}" for n in ("rps", "avg_ms", "p95_ms", "p99_ms") for m in ("median", "min", "max")]
CAPACITY_COLUMNS = ["protocol", "server", "stack", "rps_median", "rps_min", "rps_max", "rps_runs", "cpu_pct_runs",
                    "cpu_us_median", "cpu_us_min", "cpu_us_max", "cpu_us_runs", "rps_vs_floor", "cpu_vs_floor",
                    "requests", "bad", "missing"]


def _spread_cells(prefix: str, s: Spread | None, digits: int) -> dict[str, object]:
    return {f"{prefix}_{m}": (round(x, digits) if s else "") for m, x in
            (("median", s.median if s else 0.0), ("min", s.low if s else 0.0), ("max", s.high if s else 0.0))}


def _write_variants(path: Path, report: GatewayReport) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for v in report.variants:
            stats: dict[str, object] = {}
            for name, what in (("rps", "rps"), ("avg_ms", "mean"), ("p95_ms", "p95"), ("p99_ms", "p99")):
                stats |= _spread_cells(name, v.spread(what), 4)
            base = {"variant": v.key, "title": v.title, "gateway": v.gateway, "limiter": v.limiter,
                    "rounds": len(v.rounds)}
            groups = v.groups()
            n = sum(g.requests for g in groups)
            w.writerow(base | stats | {
                "group": "all", "requests": n, "admitted": sum(g.admitted for g in groups),
                "limited": sum(g.limited for g in groups), "other": sum(g.other for g in groups),
                "lat_avg_ms": round(sum(g.lat_avg_ms * g.requests for g in groups) / n, 4) if n else "",
                "success_pct": round(100 * sum(g.admitted for g in groups) / n, 2) if n else "",
                "exact": worst([g.exact for g in groups]), "over_limit": v.over_limit})
            for g in groups:
                w.writerow(base | {
                    "group": g.group, "requests": g.requests, "admitted": g.admitted, "limited": g.limited,
                    "other": g.other, "lat_avg_ms": round(g.lat_avg_ms, 4), "success_pct": round(g.success_pct, 2),
                    "limit": "" if g.limit is None else g.limit, "expected": "" if g.expected is None else g.expected,
                    "allowance": "" if g.allowance is None else g.allowance, "exact": g.exact,
                    "over_limit": g.over_limit})


def _write_capacity(path: Path, report: GatewayReport) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CAPACITY_COLUMNS)
        w.writeheader()
        for c in report.capacity:
            fl = report.capacity_row(c.protocol, "floor")

            def vs(what: str, c: CapacityRow = c, fl: CapacityRow | None = fl) -> str:
                got = [] if fl is None or c is fl else paired(c.by_round(what), fl.by_round(what))
                return ";".join(f"{x:.4f}" for x in got)

            w.writerow({"protocol": c.protocol, "server": c.server, "stack": c.stack,
                        **_spread_cells("rps", Spread.of(c.rps_runs), 1),
                        **_spread_cells("cpu_us", Spread.of(c.cpu_us_runs), 2),
                        "rps_runs": ";".join(f"{x:.1f}" for x in c.rps_runs),
                        "cpu_pct_runs": ";".join(f"{x:.0f}" for x in c.cpu_pct_runs),
                        "cpu_us_runs": ";".join(f"{x:.2f}" for x in c.cpu_us_runs),
                        "rps_vs_floor": vs("rps"), "cpu_vs_floor": vs("cpu_us"), "requests": c.requests,
                        "bad": c.bad, "missing": c.missing})


def write(out: Path | str, report: GatewayReport) -> list[Path]:
    """``FILES`` in ``out``, the report first."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    written = [path / n for n in FILES]
    written[0].write_text(html(report), encoding="utf-8")
    written[1].write_text(markdown(report), encoding="utf-8")
    written[2].write_text(json.dumps(report.as_dict(), indent=2, default=str), encoding="utf-8")
    _write_variants(written[3], report)
    _write_capacity(written[4], report)
    write_peer_csv(written[5], report)
    return written
