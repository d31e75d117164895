"""The gateway report as one HTML page (``html``): the verdict against each peer first, then one
chart per peer (``reports.html_report.bar_chart``) with its comparison table, the targets and the
details. Every figure sits in a ``num`` span that never wraps, and a cell of one figure never wraps: a
median and its range may take two lines, each figure whole."""

from __future__ import annotations

import re
from html import escape

from .gateway_peer_rows import SHORT
from .gateway_rows import GatewayReport
from .gateway_sections import sections
from .gateway_tables import title
from .gateway_verdict import GATEWAY_PEERS, REFERENCE, PeerVerdict
from .reports.html_report import _CSS, bar_chart

__all__ = ["FIGURE", "html", "peer_chart"]

_NUMBER = r"(?<![\w.])(?:[\u2264\u2265] )?[-\u2212+]?\d[\d,]*(?:\.\d+)?(?:x|%| ms| µs| req/s)?(?![\w])"
#: A figure: a number with its unit, or a range in brackets (two numbers joined by an en dash).
FIGURE = re.compile(rf"\({_NUMBER}\u2013{_NUMBER}\)(?:x| ms| µs| req/s)?|{_NUMBER}")
_CODE = re.compile(r"`([^`]+)`")
_CSS_MORE = ".num{white-space:nowrap}td.num{white-space:nowrap}ul.verdict li{margin:.4em 0}ul.method li{margin:.1em 0}"


def _figures(text: str) -> str:
    """``text`` escaped, each figure in a span that never wraps."""
    out, at = [], 0
    for m in FIGURE.finditer(text):
        out += [escape(text[at:m.start()]), f"<span class=num>{escape(m.group())}</span>"]
        at = m.end()
    return "".join(out) + escape(text[at:])


def _text(text: str) -> str:
    """``_figures(text)``, with `code` in backquotes as ``<code>``."""
    return _CODE.sub(r"<code>\1</code>", _figures(text))


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
    """The page: its title, then ``sections`` with a chart per peer."""
    head = escape(title(report))
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{head}</title>"
             f"<style>{_CSS}{_CSS_MORE}</style></head><body><h1>{head}</h1>"]
    for s in sections(report, peer_chart):
        tag, name = f"h{s.level}", f" id={s.name}" if s.name else ""
        parts.append(f"<{tag}{name}>{_text(s.heading)}</{tag}>")
        if s.text:
            parts.append(f"<p>{_text(s.text)}</p>")
        if s.notes:
            parts.append(f"<ul class={s.name}>" if s.name else "<ul>")
            parts += [f"<li>{_figures(note)}</li>" for note in s.notes] + ["</ul>"]
        if s.chart:
            parts.append(f"<div class=chart>{s.chart}</div>")
        if s.rows:
            parts.append(table(s.rows))
    parts.append("</body></html>")
    return "\n".join(parts)
