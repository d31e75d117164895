"""The gateway bench's terminal summary (``summary``): the verdict against each peer and the targets,
every line within ``WIDTH`` columns, and where the whole report is."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .gateway_figures import Spread
from .gateway_rows import GatewayReport
from .gateway_tables import figure, reading, title
from .gateway_verdict import verdicts

__all__ = ["FILES", "WIDTH", "summary", "text_table"]

WIDTH = 120
#: What the report writer leaves in --out, the report first (``gateway_report.write``).
FILES = ("report.html", "report.md", "results.json", "summary.csv", "capacity.csv", "peers.csv")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def text_table(rows: list[list[str]], width: int = WIDTH) -> list[str]:
    """``rows`` (the first the header) as aligned columns within ``width``: the widest columns are cut
    (with ``…``) until the table fits."""
    gap = 2
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    while sum(widths) + gap * (len(widths) - 1) > width and max(widths) > 8:
        widths[widths.index(max(widths))] -= 1
    lines = []
    for n, r in enumerate(rows):
        cells = [_cut(c, w).ljust(w) if i == 0 or not c.lstrip("-")[:1].isdigit() else _cut(c, w).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append((" " * gap).join(cells).rstrip())
        if n == 0:
            lines.append((" " * gap).join("-" * w for w in widths))
    return lines


def _targets(report: GatewayReport) -> list[str]:
    rows = [["target", "ours", "target", "met"]]
    for t in report.targets:
        if t["direction"] == "exact":
            rows.append([t["target"], t["met"], "exact", t["met"]])
            continue
        s = None if t["ours"] is None else Spread(t["ours"], t["ours_min"], t["ours_max"], t["ours_rounds"])
        unit = " ms" if t["unit"] == "ms" else "x"
        word = "≤" if t["direction"] == "lower" else "≥"
        rows.append([t["target"], figure(s, 2, unit), f"{word} {t['target_value']:g}{unit}", t["met"]])
    return text_table(rows)


def summary(report: GatewayReport, report_path: Path | str | None = None) -> str:
    """Title, the verdict against each peer, the targets (median and range), the rows missing, and
    the file with everything else."""
    lines = [_cut(title(report), WIDTH), "", *textwrap.wrap(reading(), WIDTH)]
    for v in verdicts(report):
        lines += textwrap.wrap(v.sentence(), WIDTH, initial_indent="- ", subsequent_indent="  ")
    if report.targets:
        lines += ["", "Targets:", *_targets(report)]
    missing = [v.title for v in report.variants if v.missing] + [p.key for p in report.peers if not p.rounds] \
        + [f"capacity {c.protocol} {c.server}" for c in report.capacity if c.missing and not c.rps_runs]
    if missing:
        lines += ["", *textwrap.wrap(f"Missing ({len(missing)} rows, the report says why): {', '.join(missing)}", WIDTH, subsequent_indent="  ")]
    where = str(report_path) if report_path else "report.html in --out"
    lines += ["", *textwrap.wrap(f"Full report (the charts, every table, each round's spread): {where}; beside it: "
                                 f"{', '.join(FILES[1:])}", WIDTH, break_on_hyphens=False)]
    return "\n".join(_cut(line, WIDTH) for line in lines)
