"""The gateway report's tables as rows of text cells, for the Markdown and HTML writers: every
figure a median with its range over the rounds, every ratio ours ÷ theirs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .gateway_figures import BETTER, DASH, HIGHER, LOWER, NOISE, Spread, paired
from .gateway_rows import GatewayReport, GroupRow, VariantRow, worst
from .gateway_verdict import PeerVerdict

__all__ = ["MEDIAN_RANGE", "capacity_table", "comparison_table", "figure", "group_table", "md_table", "meta_lines",
           "method", "reading", "target_table", "title", "variant_table"]

#: Said once under the tables: what the figures are.
MEDIAN_RANGE = f"median (min{DASH}max over the rounds)"


def figure(s: Spread | None, digits: int = 2, unit: str = "") -> str:
    """The median and its range (``Spread.text``), or ``-`` without a figure."""
    return "-" if s is None else s.text(digits, unit)


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
    """Every variant: req/s and latency, and its average ÷ the same gateway without limiting."""
    out = [["variant", "rounds", "req/s", "avg ms", "p95 ms", "p99 ms", "avg: this row ÷ no limiting", "exact",
            "statuses"]]
    base = {v.gateway: v for v in report.variants if v.limiter == "none" and v.rounds}
    for v in report.variants:
        if v.missing or not v.rounds:
            out.append([v.title, "0", "-", "-", "-", "-", "-", "-", f"MISSING: {v.missing or 'no rounds'}"])
            continue
        b = base.get(v.gateway)
        ratio = "-" if b is None or v is b else figure(Spread.of(paired(v.by_round("mean"), b.by_round("mean"))),
                                                       2, "x")
        statuses: dict[str, int] = {}
        for r in v.rounds:
            for k, n in r.statuses.items():
                statuses[k] = statuses.get(k, 0) + n
        out.append([v.title, str(len(v.rounds)), figure(v.spread("rps"), 0), figure(v.spread("mean")),
                    figure(v.spread("p95")), figure(v.spread("p99")), ratio, worst([g.exact for g in v.groups()]),
                    ", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))])
    return out


def group_table(v: VariantRow) -> list[list[str]]:
    out = [["group", "requests", "avg latency ms", "limited", "success rate", "admitted / limit", "exact"]]
    for g in v.groups():
        out.append([g.group, f"{g.requests:,}", f"{g.lat_avg_ms:.2f}", f"{g.limited:,}", f"{g.success_pct:.1f}%",
                    _admitted(g), g.exact])
    return out


def capacity_table(report: GatewayReport) -> list[list[str]]:
    """Each capacity row against the fixed-answer floor on its own stack, round by round."""
    out = [["protocol", "server", "stack", "decisions/s per worker", "ours ÷ floor req/s", "server CPU %",
            "CPU µs / request", "ours ÷ floor CPU", "non-OK", "rounds"]]
    for c in report.capacity:
        fl = report.capacity_row(c.protocol, "floor")
        if c.missing and not c.rps_runs:
            out.append([c.protocol, c.server, c.stack, "-", "-", "-", "-", "-", "-", f"MISSING: {c.missing}"])
            continue
        ratio = cpu_ratio = "-"
        if fl is not None and c is not fl:
            ratio = figure(Spread.of(paired(c.by_round("rps"), fl.by_round("rps"))), 2, "x")
            cpu_ratio = figure(Spread.of(paired(c.by_round("cpu_us"), fl.by_round("cpu_us"))), 2, "x")
        out.append([c.protocol, c.server, c.stack, figure(Spread.of(c.rps_runs), 0), ratio,
                    figure(Spread.of(c.cpu_pct_runs), 0), figure(Spread.of(c.cpu_us_runs), 1), cpu_ratio, str(c.bad),
                    str(len(c.rps_runs))])
    return out


def _target_figure(t: dict[str, Any], who: str) -> str:
    s = None if t.get(who) is None else Spread(t[who], t[f"{who}_min"], t[f"{who}_max"], t[f"{who}_rounds"])
    unit = " ms" if t["unit"] == "ms" else "x"
    cell = figure(s, 2, unit)
    if t.get(f"{who}_abs") is not None:
        a = Spread(t[f"{who}_abs"], t[f"{who}_abs_min"], t[f"{who}_abs_max"], t[f"{who}_abs_rounds"])
        unit = t.get("abs_unit", "")
        cell += f"; {a.text(0 if unit == 'req/s' else 1 if unit == 'µs' else 2, ' ' + unit)}"
    return cell


def target_table(ts: Sequence[dict[str, Any]]) -> list[list[str]]:
    """target, rule, target value (its sign says which way is better), ours, floor (each median and range), met."""
    out = [["target", "rule", "target", "ours", "floor", "met"]]
    for t in ts:
        if t["direction"] == "exact":
            out.append([t["target"], t["rule"], "exact", t["met"], "-", t["met"]])
            continue
        u = " ms" if t["unit"] == "ms" else "x"
        word = "≤" if t["direction"] == LOWER else "≥"
        out.append([t["target"], t["rule"], f"{word} {t['target_value']:g}{u}", _target_figure(t, "ours"),
                    _target_figure(t, "floor"), t["met"]])
    return out


def _ahead(c_winner: str, peer: str) -> str:
    return {"ours": "ratewarden", "theirs": peer, NOISE: NOISE}.get(c_winner, "n/a")


def comparison_table(v: PeerVerdict) -> list[list[str]]:
    """Every row of ours against the peer's on each metric: both figures and ours ÷ theirs."""
    where = any(c.where for c in v.comparisons)
    out = [["our row"] + (["cell"] if where else []) + ["metric", "ours", v.peer, f"ours ÷ {v.peer}", "ahead"]]
    for c in v.comparisons:
        out.append([c.ours_row] + ([c.where] if where else []) + [
            c.metric, figure(c.ours, c.digits, c.unit), figure(c.theirs, c.digits, c.unit), figure(c.ratio, 2, "x"),
            _ahead(c.winner, v.peer)])
    return out


def title(report: GatewayReport) -> str:
    """``Gateway decision service: ratewarden against HAProxy, nginx and envoyproxy/ratelimit`` (the peers that ran)."""
    peers = [name for name, gw in (("HAProxy", "haproxy"), ("nginx", "nginx")) if any(v.gateway == gw for v in report.variants)]
    peers += ["envoyproxy/ratelimit"] if report.peers else []
    against = ", ".join(peers[:-1]) + f" and {peers[-1]}" if len(peers) > 1 else "".join(peers)
    return "Gateway decision service: ratewarden" + (f" against {against}" if against else "")


def reading() -> str:
    """How to read every figure and ratio, said once."""
    return (f"Every ratio is ours ÷ theirs (ours ÷ the peer, ours ÷ the floor, a row ÷ the same gateway without "
            f"limiting), taken round by round; average latency, p99 and CPU per decision: {BETTER[LOWER]}; req/s: "
            f"{BETTER[HIGHER]}. Every figure is the {MEDIAN_RANGE}. One side wins only when every round agrees; "
            "when the rounds' ratios straddle 1.0 it is within noise. An added latency below zero is measurement "
            "noise, never a pass.")


def method(report: GatewayReport) -> str:
    o = report.options
    pace = f"paced to {o['rate']:g} req/s" if o["rate"] else "as fast as they go (closed loop)"
    limits = ", ".join(f"{g} {n}/min" for g, n in o["limits"].items())
    return (f"{o['requests']} requests per variant per round ({o['workers']} keep-alive workers, {pace}, cut off "
            f"after {o['max_seconds']:g} s), {o['keys_per_group']} fresh API keys per group per round, PUT (1 KiB) "
            f"and GET alternating; limits per key: {limits}; {o['warmup']} warm-up + {o['rounds']} timed rounds, "
            f"variants interleaved (order rotated each round). Backend: nginx `return 200`. ratewarden: "
            f"{report.service or '-'}. Capacity: 1 worker each, server and client on different "
            f"cores, {o['capacity_connections']} connections / concurrent calls, {o['capacity_rounds']} rounds "
            f"of {o['capacity_seconds']:g} s, interleaved; each floor on the same stack as the row it is set against.")


def md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def meta_lines(report: GatewayReport) -> list[str]:
    return [f"{k}: {v}" for k, v in report.meta.items() if v not in ("", None)]
