"""A single self-contained HTML page: inline CSS and inline SVG charts, no scripts, no network."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path

from ..results import Row
from ..runner import Result
from .markdown import GROUP_TITLES, SHORT_MEASURES, build_tables, library_order, noise_lines, over_limit_lines
from .meta import Meta

__all__ = ["bar_chart", "write_html"]

PALETTE = {"ratewarden": "#1f77b4", "traffik": "#ff7f0e", "slowapi": "#2ca02c", "bare": "#7f7f7f"}
_EXTRA = ("#9467bd", "#8c564b", "#e377c2", "#17becf")

# Sized for a 1,400 px window: the live and flood tables (20 columns) fit it without scrolling, and
# prose keeps a readable line length.
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1340px;color:#222;padding:0 1em}
p,ul{max-width:1100px}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:12px}
th,td{border:1px solid #ccc;padding:2px 5px;text-align:right}th{background:#f3f3f3;font-weight:600}
td:first-child,th:first-child{text-align:left}
h2{border-bottom:2px solid #ddd;margin-top:2em}.chart{margin:1em 0}.meta li{margin:.1em 0}
td.over{background:#fdd;color:#a00;font-weight:bold}p.note{font-size:13px;color:#444;margin-top:-1em}
p.over{color:#a00;font-weight:bold}
"""


def _color(lib: str, i: int) -> str:
    return PALETTE.get(lib, _EXTRA[i % len(_EXTRA)])


# Widths of a character, generous for the wide sans-serif fonts a browser may pick (DejaVu Sans),
# so computed label areas hold their text.
_CHAR_W = {12: 7.4, 15: 9.6}


def _wrap(text: str, width: int, lines: int = 2) -> list[str]:
    """``text`` in at most ``lines`` lines of at most ``width`` characters, broken at spaces (the last
    line cut with ``…`` if the text is longer still)."""
    out: list[str] = []
    rest = text
    while rest and len(out) < lines:
        if len(rest) <= width or len(out) == lines - 1:
            out.append(rest if len(rest) <= width else rest[: width - 1] + "…")
            break
        cut = rest.rfind(" ", 0, width + 1)
        cut = cut if cut > 0 else width
        out.append(rest[:cut])
        rest = rest[cut:].lstrip()
    return out


def _text(x: float, y: float, size: int, lines: list[str], extra: str = "") -> str:
    """An SVG ``<text>`` of one or more lines, each under the last."""
    spans = "".join(f'<tspan x="{x:.1f}" dy="{0 if i == 0 else size + 2}">{escape(line)}</tspan>'
                    for i, line in enumerate(lines))
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{extra}>{spans}</text>'


def _legend(names: list[str], left: float, width: int) -> list[tuple[float, int]]:
    """Where each legend entry goes (x, and 0 or a multiple of 18 down): in a row from ``left``, a
    new row when the next one would pass ``width``."""
    out: list[tuple[float, int]] = []
    x, dy = left, 0
    for name in names:
        w = 30 + _CHAR_W[12] * len(name)
        if x > left and x + w - 14 > width:
            x, dy = left, dy + 18
        out.append((x, dy))
        x += w
    return out


def bar_chart(title: str, categories: Sequence[str], series: Mapping[str, Sequence[float | None]], unit: str,
              flags: Mapping[str, Sequence[bool]] | None = None, decimals: int = 1) -> str:
    """Horizontal grouped bars as an SVG string: one group per category, one bar per series.

    The label column is as wide as the longest category needs (up to 440 px; longer ones take two
    lines), so no label is cut at the chart's edge. ``decimals`` formats the values (0 for counts).
    A bar whose ``flags`` entry is true (a row over its limit) gets a red outline and a ``⚠ over
    limit`` label: a fast bar of a limiter that let too much through is not a win."""
    bar_h, gap, width = 13, 10, 1000
    small, big = _CHAR_W[12], _CHAR_W[15]
    longest = max((len(c) for c in categories), default=0)
    label_w = int(min(max(160.0, longest * small + 16), 440.0))
    fit = int((label_w - 16) / small)
    labels = [_wrap(c, fit) for c in categories]
    n = max(len(series), 1)
    values = [v for vals in series.values() for v in vals if v is not None]
    flagged_any = any(any(f) for f in (flags or {}).values())
    longest_value = max((len(f"{v:,.{decimals}f} {unit}") for v in values), default=0) + (13 if flagged_any else 0)
    plot_w = width - label_w - int(longest_value * (7.0 if flagged_any else 6.4) + 12)
    top = max(values) if values else 1.0
    top = top or 1.0
    heading = _wrap(title, int(width / big))
    head_h = 17 * len(heading)
    legend = _legend(list(series), float(label_w), width)
    legend_h = 24 + max((dy for _, dy in legend), default=0)
    y = head_h + 12
    height = y + legend_h + sum(max(n * bar_h, 14 * len(lines)) + gap for lines in labels) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">' + _text(0, 16, 15, heading, ' font-weight="bold"')]
    for i, (name, (x, dy)) in enumerate(zip(series, legend, strict=True)):
        out.append(f'<rect x="{x:.1f}" y="{y + dy}" width="12" height="12" fill="{_color(name, i)}"/>'
                   f'<text x="{x + 16:.1f}" y="{y + dy + 10}" font-size="12">{escape(name)}</text>')
    y += legend_h
    for ci, lines in enumerate(labels):
        group_h = max(n * bar_h, 14 * len(lines))
        first = y + group_h / 2 + 4 - (len(lines) - 1) * 7
        out.append(_text(label_w - 8, first, 12, lines, ' text-anchor="end"'))
        for si, (name, vals) in enumerate(series.items()):
            v = vals[ci] if ci < len(vals) else None
            by = y + si * bar_h
            if v is None:
                out.append(f'<text x="{label_w + 4}" y="{by + 10}" font-size="10" fill="#999">n/a</text>')
                continue
            w = max(1.0, plot_w * v / top)
            flagged = bool(flags and ci < len(flags.get(name, ())) and flags[name][ci])
            outline = ' stroke="#d00" stroke-width="2"' if flagged else ""
            mark = " ⚠ over limit" if flagged else ""
            colour = ' fill="#d00" font-weight="bold"' if flagged else ""
            out.append(f'<rect x="{label_w}" y="{by}" width="{w:.1f}" height="{bar_h - 2}" fill="{_color(name, si)}"'
                       f"{outline}><title>{escape(name)}: {v:,.{2 if decimals else 0}f} {escape(unit)}{mark}</title></rect>"
                       f'<text x="{label_w + w + 4:.1f}" y="{by + 10}" font-size="10"{colour}>{v:,.{decimals}f} '
                       f"{escape(unit)}{mark}</text>")
        y += group_h + gap
    out.append("</svg>")
    return "".join(out)


def _charts(rows: list[Row]) -> list[str]:
    charts: list[str] = []
    stores = sorted({r.store for r in rows if r.store != "none"}) or ["memory"]
    for store in stores:
        for group in GROUP_TITLES:
            grows = [r for r in rows if r.group == group and r.store in (store, "none")]
            if not grows or group in ("tiered",) or all(r.library == "bare" for r in grows):
                continue
            libs = library_order([r.library for r in grows])
            keys = list(dict.fromkeys((r.scenario, r.concurrency) for r in grows))
            by = {(r.scenario, r.concurrency, r.library): r for r in grows}
            titles = {r.scenario: r.title for r in grows}
            kinds = {r.scenario: SHORT_MEASURES.get(r.measure, "") for r in grows}
            cats = [(f"[{kinds[s]}] " if group == "live" and kinds[s] else "") + titles[s]
                    + (f" c={c}" if group == "live" else "") for s, c in keys]

            def series(field: Callable[[Row], float | None], libraries: list[str], by: dict[tuple[str, int, str], Row] = by,
                       keys: list[tuple[str, int]] = keys) -> dict[str, Sequence[float | None]]:
                return {lib: [field(by[(s, c, lib)]) if (s, c, lib) in by else None for s, c in keys]
                        for lib in libraries}

            prefix = f"{GROUP_TITLES[group]} · {store if group != 'live' or store != 'none' else 'memory'}"
            over = {lib: [by[(s, c, lib)].over_limit if (s, c, lib) in by else False for s, c in keys] for lib in libs}
            if group == "flood":
                limited = [lib for lib in libs if lib != "bare"]
                charts.append(bar_chart(f"{prefix}: admitted (limit {_limits(grows)})", cats,
                                        series(lambda r: None if r.admitted is None else float(r.admitted), limited),
                                        "admitted", over, decimals=0))
            charts.append(bar_chart(f"{prefix}: throughput", cats, series(lambda r: r.rps, libs), "req/s", over))
            charts.append(bar_chart(f"{prefix}: p99 latency", cats, series(lambda r: r.p99_ms, libs), "ms"))
            limited = [lib for lib in libs if lib != "bare"]
            if limited:
                charts.append(bar_chart(f"{prefix}: throttled (429) count", cats,
                                        series(lambda r: float(r.throttled), limited), "", decimals=0))
            if group in ("live", "flood"):
                charts.append(bar_chart(f"{prefix}: server CPU", cats, series(lambda r: r.cpu_pct, libs), "%"))
                charts.append(bar_chart(f"{prefix}: server RSS", cats, series(lambda r: r.rss_mb, libs), "MB"))
    return charts


def _limits(rows: list[Row]) -> str:
    found = sorted({r.limit for r in rows if r.limit is not None})
    return ", ".join(f"{n:,}" for n in found) or "—"


def _cell(text: str) -> str:
    """A table cell; one flagged ``⚠`` (a row over its limit) is red."""
    return f"<td class='over'>{escape(text)}</td>" if "⚠" in text else f"<td>{escape(text)}</td>"


def _notes(intro: str, item: str, lines: list[str]) -> list[str]:
    """``lines`` as a list after ``intro`` (which opens it), each opened by ``item``; none: nothing."""
    if not lines:
        return []
    return [intro, *[f"{item}{escape(line)}</li>" for line in lines], "</ul>"]


def write_html(path: Path, rows: list[Row], meta: Meta, results: Sequence[Result] = ()) -> Path:
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ratewarden bench</title>",
             f"<style>{_CSS}</style></head><body><h1>ratewarden bench</h1><ul class='meta'>",
             f"<li>Command: <code>{escape(meta.command)}</code></li><li>Date: {escape(meta.started)}</li>",
             f"<li>Machine: {escape(meta.machine)}</li><li>Python {escape(meta.python)}; "
             + escape(", ".join(f"{k} {v}" for k, v in meta.versions.items())) + "</li>"]
    parts += [f"<li>{escape(k)}: {escape(str(v))}</li>" for k, v in meta.method.items()]
    parts.append("</ul>")
    parts += _notes("<p>How noisy the machine was (the libraries of a scenario run interleaved in rounds; the "
                    "tables give each row's req/s range over them):</p><ul class='meta'>", "<li>", noise_lines(rows))
    parts += _notes("<p class='over'>⚠ Admitted more than the limit (req/s and ratios of these rows are not "
                    "comparable with rows that held the limit):</p><ul>", "<li class='over'>", over_limit_lines(rows))
    parts.append("<h2>Charts</h2>")
    parts += [f"<div class='chart'>{svg}</div>" for svg in _charts(rows)]
    section = None
    for t in build_tables(rows, results):
        if t.section != section:
            section = t.section
            parts.append(f"<h2>Tables: {escape(section)}</h2>")
        parts.append(f"<h3>{escape(t.title)}</h3><table><tr>"
                     + "".join(f"<th>{escape(h)}</th>" for h in t.header) + "</tr>")
        parts += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.body]
        parts.append("</table>")
        if t.note:
            parts.append(f"<p class='note{' over' if '⚠' in t.note else ''}'>{escape(t.note)}</p>")
    skipped = [(r.task.label, r.skipped) for r in results if r.skipped]
    if skipped:
        parts.append("<h2>Skipped</h2><ul>")
        parts += [f"<li>{escape(label)}: {escape(s)}</li>" for label, s in skipped]
        parts.append("</ul>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
