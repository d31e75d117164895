"""The gateway report as one HTML page (``html``): the verdict against each peer first, then one
chart per peer (``reports.html_report.bar_chart``) with its comparison table, the targets and the
details. Every figure sits in a ``num`` span that never wraps, and a cell of one figure never wraps: a
median and its range may take two lines, each figure whole."""

from __future__ import annotations

import re
from html import escape

from .gateway_peer_report import peer_method, peer_table
from .gateway_peer_rows import SHORT
from .gateway_rows import GatewayReport
from .gateway_tables import (
    capacity_table,
    comparison_table,
    group_table,
    meta_lines,
    method,
    reading,
    target_table,
    title,
    variant_table,
)
from .gateway_verdict import GATEWAY_PEERS, REFERENCE, PeerVerdict, verdicts
from .reports.html_report import _CSS, bar_chart

__all__ = ["FIGURE", "html", "peer_chart"]

_NUMBER = r"(?<![\w.])(?:[\u2264\u2265] )?[-\u2212+]?\d[\d,]*(?:\.\d+)?(?:x|%| ms| µs| req/s)?(?![\w])"
#: A figure: a number with its unit, or a range in brackets (two numbers joined by an en dash).
FIGURE = re.compile(rf"\({_NUMBER}\u2013{_NUMBER}\)(?:x| ms| µs| req/s)?|{_NUMBER}")
_CSS_MORE = ".num{white-space:nowrap}td.num{white-space:nowrap}ul.verdict li{margin:.4em 0}"


def _figures(text: str) -> str:
    """``text`` escaped, each figure in a span that never wraps."""
    out, at = [], 0
    for m in FIGURE.finditer(text):
        out += [escape(text[at:m.start()]), f"<span class=num>{escape(m.group())}</span>"]
        at = m.end()
    return "".join(out) + escape(text[at:])


def _td(text: str) -> str:
    classes = (["over"] if text.startswith("⚠") else []) + (["num"] if FIGURE.fullmatch(text) else [])
    return f"<td{' class=' + chr(34) + ' '.join(classes) + chr(34) if classes else ''}>{_figures(text)}</td>"


def table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def _gateway_chart(report: GatewayReport, peer: str, gateway: str) -> str:
    live = [v for v in report.variants if v.gateway == gateway and v.rounds]
    if not live:
        return ""
    rounds = max(len(v.rounds) for v in live)
    flags = [v.over_limit for v in live]

    def med(what: str) -> list[float | None]:
        return [s.median if s else None for s in (v.spread(what) for v in live)]

    return bar_chart(f"{peer}: latency through the gateway, median of {rounds} rounds (lower is better)",
                     [v.title for v in live], {"avg ms": med("mean"), "p99 ms": med("p99")}, "ms",
                     {"avg ms": flags, "p99 ms": flags}, decimals=2)


def _envoy_chart(report: GatewayReport) -> str:
    live = [p for p in report.peers if p.rounds]
    if not live:
        return ""
    cells = list(dict.fromkeys((p.store, p.scenario, p.connections) for p in live))
    series: dict[str, list[float | None]] = {}
    for service, workers in dict.fromkeys((p.service, p.workers) for p in live):
        got = {(p.store, p.scenario, p.connections): p.spread("rps") for p in live
               if (p.service, p.workers) == (service, workers)}
        name = SHORT.get(service, service) + (f", {workers} workers" if workers > 1 else "")
        series[name] = [s.median if (s := got.get(c)) else None for c in cells]
    rounds = max(len(p.rounds) for p in live)
    return bar_chart(f"{REFERENCE}: gRPC decisions per second, median of {rounds} rounds (higher is better)",
                     [f"{st} · {sc} the limit · {c} conn" for st, sc, c in cells], series, "req/s", decimals=0)


def peer_chart(report: GatewayReport, v: PeerVerdict) -> str:
    """The one chart of a peer: latency through its gateway, or gRPC req/s beside the reference."""
    gateway = {peer: key.split("-")[0] for peer, key, _ in GATEWAY_PEERS}.get(v.peer)
    return _gateway_chart(report, v.peer, gateway) if gateway else _envoy_chart(report)


def html(report: GatewayReport) -> str:
    """The page: title, verdict, a chart and a table per peer, targets, details, method."""
    found = verdicts(report)
    head = title(report)
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(head)}</title>"
             f"<style>{_CSS}{_CSS_MORE}</style></head><body><h1>{escape(head)}</h1>",
             f"<h2 id=verdict>Verdict</h2><p>{_figures(reading())}</p><ul class=verdict>" +
             "".join(f"<li>{_figures(v.sentence())}</li>" for v in found) + "</ul>"]
    for v in found:
        chart = peer_chart(report, v)
        if chart or v.comparisons:
            parts.append(f"<h2>Against {escape(v.peer)}</h2>")
        if chart:
            parts.append(f"<div class=chart>{chart}</div>")
        if v.comparisons:
            parts.append(table(comparison_table(v)))
    if report.targets:
        parts += ["<h2>Targets</h2>", table(target_table(report.targets))]
    if report.variants:
        parts += ["<h2>Latency through the gateway</h2>", table(variant_table(report))]
        for row in (r for r in report.variants if r.rounds):
            parts += [f"<h3>{escape(row.title)}</h3>", table(group_table(row))]
    if report.capacity:
        parts += ["<h2>Service capacity</h2>", table(capacity_table(report))]
    if report.peers:
        parts += ["<h2>gRPC beside envoyproxy/ratelimit</h2>", f"<p>{_figures(peer_method(report))}</p>",
                  "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in report.peer_notes) + "</ul>",
                  table(peer_table(report))]
    parts += ["<h2>Method</h2>", f"<p>{_figures(method(report))}</p>",
              "<ul class=meta>" + "".join(f"<li>{escape(line[2:])}</li>" for line in meta_lines(report)) + "</ul>",
              "</body></html>"]
    return "\n".join(parts)
