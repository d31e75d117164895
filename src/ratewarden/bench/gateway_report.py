"""The gateway bench's report: its tables, the terminal summary, and the files ``write`` leaves
(``gateway.json``, ``gateway.csv``, ``gateway-capacity.csv``, ``gateway.md``, ``gateway.html``,
``gateway-peers.csv``)."""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .gateway_peer_report import peer_method, peer_table, write_peer_csv
from .gateway_rows import GatewayReport, GroupRow, VariantRow, worst

__all__ = ["capacity_table", "group_table", "html", "markdown", "summary", "target_table", "variant_table", "write"]


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pair(s: tuple[float, float] | None, digits: int = 2) -> str:
    return "-" if s is None else f"{_f(s[1], digits)} / {_f(s[0], digits)}"


def _admitted(g: GroupRow) -> str:
    if g.limit is None:
        return f"{g.admitted:,} / no limit"
    cell = f"{g.admitted:,} / {g.limit:,}"
    if g.expected is not None and g.expected != g.limit:
        cell += f" (exact: {g.expected:,})"
    if g.allowance is not None and g.exact == "within":
        cell += f" (leaky bucket: ≤ {g.allowance:,})"
    return ("⚠ " + cell) if g.over_limit else cell


def variant_table(report: GatewayReport) -> list[list[str]]:
    head = ["variant", "rounds", "req/s (med / min)", "avg ms (med / min)", "p95 ms (med / min)",
            "p99 ms (med / min)", "avg vs no limiting", "exact", "statuses"]
    out = [head]
    base = {v.gateway: v for v in report.variants if v.limiter == "none" and v.rounds}
    for v in report.variants:
        if v.missing or not v.rounds:
            out.append([v.title, "0", "-", "-", "-", "-", "-", "-", f"MISSING: {v.missing or 'no rounds'}"])
            continue
        b = base.get(v.gateway)
        ratio = "-" if b is None or v is b else f"{v.stat('mean')[1] / b.stat('mean')[1]:.2f}x"  # type: ignore[index]
        statuses: dict[str, int] = {}
        for r in v.rounds:
            for k, n in r.statuses.items():
                statuses[k] = statuses.get(k, 0) + n
        exact = worst([g.exact for g in v.groups()])
        out.append([v.title, str(len(v.rounds)), _pair(v.stat("rps"), 0), _pair(v.stat("mean")), _pair(v.stat("p95")),
                    _pair(v.stat("p99")), ratio, exact, ", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))])
    return out


def group_table(v: VariantRow) -> list[list[str]]:
    out = [["group", "requests", "avg latency ms", "limited", "success rate", "admitted / limit", "exact"]]
    for g in v.groups():
        out.append([g.group, f"{g.requests:,}", f"{g.lat_avg_ms:.2f}", f"{g.limited:,}", f"{g.success_pct:.1f}%",
                    _admitted(g), g.exact])
    return out


def capacity_table(report: GatewayReport) -> list[list[str]]:
    out = [["protocol", "server", "stack", "decisions/s per worker (med / min)", "vs floor (cost)",
            "server CPU % (med)", "CPU µs / request (med / min)", "vs floor (CPU)", "non-OK", "rounds"]]
    for c in report.capacity:
        fl = report.capacity_row(c.protocol, "floor")
        s = c.stat()
        if c.missing and not c.rps_runs:
            out.append([c.protocol, c.server, c.stack, "-", "-", "-", "-", "-", "-", f"MISSING: {c.missing}"])
            continue
        ratio = "-" if fl is None or s is None or c is fl else f"{fl.stat()[1] / s[1]:.2f}x"  # type: ignore[index]
        cpu = f"{statistics.median(c.cpu_pct_runs):.0f}" if c.cpu_pct_runs else "-"
        us, fus = c.cpu_stat(), (fl.cpu_stat() if fl else None)
        cpu_ratio = "-" if us is None or fus is None or c is fl else f"{us[1] / fus[1]:.2f}x"
        out.append([c.protocol, c.server, c.stack, _pair(s, 0), ratio, cpu, _pair(us, 1), cpu_ratio, str(c.bad),
                    str(len(c.rps_runs))])
    return out


def target_table(ts: Sequence[dict[str, Any]]) -> list[list[str]]:
    def met(x: Any) -> str:
        return "n/a" if x is None else ("yes" if x else "NO")

    out = [["target", "rule", "target", "ours (med / min)", "floor (med / min)", "met (med / min)"]]
    for t in ts:
        if t["unit"] == "":
            out.append([t["target"], t["rule"], "exact", met(t["ours"]), "-", met(t["met"])])
            continue
        u = " ms" if t["unit"] == "ms" else "x"
        ours = f"{_f(t['ours'])} / {_f(t['ours_min'])}{u}"
        floor = f"{_f(t['floor'])} / {_f(t['floor_min'])}{u}"
        if "ours_rps" in t:
            ours += f" ({_f(t['ours_rps'], 0)} / {_f(t['ours_rps_min'], 0)} req/s)"
            floor = f"1.00x ({_f(t['floor_rps'], 0)} / {_f(t['floor_rps_min'], 0)} req/s)"
        if "ours_us" in t:
            ours += f" ({_f(t['ours_us'], 1)} / {_f(t['ours_us_min'], 1)} µs)"
            floor = f"1.00x ({_f(t['floor_us'], 1)} / {_f(t['floor_us_min'], 1)} µs)"
        out.append([t["target"], t["rule"], f"{t['target_value']:g}{u}", ours, floor,
                    f"{met(t['met'])} / {met(t['met_min'])}"])
    return out


def _md(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def _method(report: GatewayReport) -> str:
    o = report.options
    pace = f"paced to {o['rate']:g} req/s" if o["rate"] else "as fast as they go (closed loop)"
    limits = ", ".join(f"{g} {n}/min" for g, n in o["limits"].items())
    return (f"{o['requests']} requests per variant per round ({o['workers']} keep-alive workers, {pace}, cut off "
            f"after {o['max_seconds']:g} s), {o['keys_per_group']} fresh API keys per group per round, PUT (1 KiB) "
            f"and GET alternating; limits per key: {limits}; {o['warmup']} warm-up + {o['rounds']} timed rounds, "
            f"variants interleaved (order rotated each round). Backend: nginx `return 200`. ratewarden: "
            f"{report.service or '-'}. Capacity: 1 worker each, server and client on different "
            f"cores, {o['capacity_connections']} connections / concurrent calls, {o['capacity_rounds']} rounds "
            f"of {o['capacity_seconds']:g} s, interleaved.")


def summary(report: GatewayReport) -> str:
    """The terminal summary: targets, the variants, capacity, the peer rows (Markdown tables)."""
    tables = [target_table(report.targets)] + ([variant_table(report)] if report.variants else []) \
        + ([capacity_table(report)] if report.capacity else []) + ([peer_table(report)] if report.peers else [])
    return "\n\n".join([_md(t) for t in tables] + [line for line in (report.meta.get("load", ""),) if line])


def _meta_lines(report: GatewayReport) -> list[str]:
    return [f"- {k}: {v}" for k, v in report.meta.items() if v not in ("", None)]


def markdown(report: GatewayReport) -> str:
    parts = ["# Gateways: HAProxy and nginx", "", _method(report), "", *_meta_lines(report), "", "## Targets", "", _md(target_table(report.targets)),
             "", "## Latency through the gateway (median / min over the rounds)", "",
             _md(variant_table(report)), ""]
    for v in report.variants:
        if v.rounds:
            parts += [f"### {v.title} (`{v.key}`), summed over {len(v.rounds)} rounds", "", _md(group_table(v)), ""]
    if report.capacity:
        parts += ["## Service capacity", "", _md(capacity_table(report)), ""]
    if report.peers:
        parts += ["## gRPC beside envoyproxy/ratelimit", "", peer_method(report), "",
                  *[f"- {n}" for n in report.peer_notes], "", _md(peer_table(report)), ""]
    over = [v.title for v in report.variants if v.over_limit]
    if over:
        parts += [f"⚠ over the limit: {', '.join(over)}", ""]
    return "\n".join(parts)


def _html_table(rows: list[list[str]]) -> str:
    from html import escape

    head = "".join(f"<th>{escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f'<td{" class=over" if c.startswith("⚠") else ""}>{escape(c)}</td>'
                                    for c in r) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def html(report: GatewayReport) -> str:
    from html import escape

    from .reports.html_report import _CSS, bar_chart

    live = [v for v in report.variants if v.rounds]
    charts = [
        bar_chart("Latency through the gateway (median over rounds)", [v.title for v in live],
                  {"avg ms": [v.stat("mean")[1] for v in live],  # type: ignore[index]
                   "p99 ms": [v.stat("p99")[1] for v in live]},  # type: ignore[index]
                  "ms", {"avg ms": [v.over_limit for v in live], "p99 ms": [v.over_limit for v in live]}),
    ]
    caps = [c for c in report.capacity if c.rps_runs]
    if caps:
        charts.append(bar_chart("Service capacity: decisions/s per worker (median)",
                                [f"{c.protocol} · {c.server}" for c in caps],
                                {"req/s": [c.stat()[1] for c in caps]}, "req/s"))  # type: ignore[index]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>Gateways: HAProxy and nginx</title><style>{_CSS}</style>"
             f"</head><body><h1>Gateways: HAProxy and nginx</h1><p>{escape(_method(report))}</p>",
             "<ul class=meta>" + "".join(f"<li>{escape(line[2:])}</li>" for line in _meta_lines(report)) + "</ul>",
             "<h2>Targets</h2>", _html_table(target_table(report.targets)),
             "<h2>Latency through the gateway</h2>", _html_table(variant_table(report))]
    parts += [f'<div class="chart">{c}</div>' for c in charts[:1]]
    for v in live:
        parts += [f"<h3>{escape(v.title)}</h3>", _html_table(group_table(v))]
    if report.capacity:
        parts += ["<h2>Service capacity</h2>", _html_table(capacity_table(report))]
    parts += [f'<div class="chart">{c}</div>' for c in charts[1:]]
    if report.peers:
        parts += ["<h2>gRPC beside envoyproxy/ratelimit</h2>", f"<p>{escape(peer_method(report))}</p>",
                  "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in report.peer_notes) + "</ul>",
                  _html_table(peer_table(report))]
    parts.append("</body></html>")
    return "\n".join(parts)


CSV_COLUMNS = ["variant", "title", "gateway", "limiter", "group", "rounds", "requests", "admitted", "limited",
               "other", "lat_avg_ms", "success_pct", "limit", "expected", "allowance", "exact", "over_limit",
               "rps_median", "rps_min", "avg_ms_median", "avg_ms_min", "p95_ms_median", "p95_ms_min",
               "p99_ms_median", "p99_ms_min"]
CAPACITY_COLUMNS = ["protocol", "server", "stack", "rps_median", "rps_min", "rps_runs", "cpu_pct_runs", "cpu_us_median", "cpu_us_min", "cpu_us_runs", "vs_floor_cpu", "requests", "bad",
                    "vs_floor_cost", "missing"]


def write(out: Path | str, report: GatewayReport) -> list[Path]:
    """``gateway.json``, ``gateway.csv`` (one row per variant x group, plus ``all``),
    ``gateway-capacity.csv``, ``gateway.md``, ``gateway.html`` and ``gateway-peers.csv`` in ``out``."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    written = [path / n for n in ("gateway.json", "gateway.csv", "gateway-capacity.csv", "gateway.md", "gateway.html",
                                  "gateway-peers.csv")]
    write_peer_csv(written[5], report)
    written[0].write_text(json.dumps(report.as_dict(), indent=2, default=str), encoding="utf-8")
    with written[1].open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for v in report.variants:
            stats = {f"{name}_{m}": (round(s[j], 4) if s else "") for name, what in
                     (("rps", "rps"), ("avg_ms", "mean"), ("p95_ms", "p95"), ("p99_ms", "p99"))
                     for s in (v.stat(what),) for m, j in (("median", 1), ("min", 0))}
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
    with written[2].open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CAPACITY_COLUMNS)
        w.writeheader()
        for c in report.capacity:
            s, fl = c.stat(), report.capacity_row(c.protocol, "floor")
            fs = fl.stat() if fl else None
            cs, fcs = c.cpu_stat(), (fl.cpu_stat() if fl else None)
            w.writerow({"protocol": c.protocol, "server": c.server, "stack": c.stack,
                        "rps_median": round(s[1], 1) if s else "", "rps_min": round(s[0], 1) if s else "",
                        "rps_runs": ";".join(f"{x:.1f}" for x in c.rps_runs),
                        "cpu_pct_runs": ";".join(f"{x:.0f}" for x in c.cpu_pct_runs),
                        "cpu_us_median": round(cs[1], 2) if cs else "", "cpu_us_min": round(cs[0], 2) if cs else "",
                        "cpu_us_runs": ";".join(f"{x:.2f}" for x in c.cpu_us_runs),
                        "vs_floor_cpu": round(cs[1] / fcs[1], 4) if cs and fcs else "", "requests": c.requests, "bad": c.bad,
                        "vs_floor_cost": round(fs[1] / s[1], 4) if s and fs else "", "missing": c.missing})
    written[3].write_text(markdown(report), encoding="utf-8")
    written[4].write_text(html(report), encoding="utf-8")
    return written
