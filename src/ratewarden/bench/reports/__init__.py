"""Report writers: JSON (every run), CSV (one row per configuration), Markdown tables and a standalone HTML page."""

from __future__ import annotations

from pathlib import Path

from ..runner import Result
from .csv_report import write_csv
from .html_report import write_html
from .json_report import write_json
from .markdown import render_markdown
from .meta import Meta

__all__ = ["Meta", "render_markdown", "write_all", "write_csv", "write_html", "write_json"]


def write_all(out: Path, results: list[Result], meta: Meta) -> list[Path]:
    """Write every format into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.row for r in results if r.row]
    paths = write_json(out, results, meta)
    paths.append(write_csv(out / "summary.csv", rows))
    md = out / "report.md"
    md.write_text(render_markdown(rows, meta, skipped=results), encoding="utf-8")
    paths.append(md)
    paths.append(write_html(out / "report.html", rows, meta, results))
    return paths
