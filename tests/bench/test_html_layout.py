"""The HTML report read in a real browser at 1,400 px: no chart label cut at the chart's edge, every
table column (the last is "checks without store") on screen without scrolling, counts as whole
numbers. Measured with headless Chromium (scripts/install-system-deps.sh installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.reports.html_report import write_html
from ratewarden.bench.reports.meta import Meta
from ratewarden.bench.results import Row

TITLES = {
    "live.allowed": ("live", "Light, all allowed (10^9/min, wrk)", "memory", 1_000_000_000),
    "live.light": ("live", "Light, one hot key (100/min, wrk)", "memory", 100),
    "flood.middleware": ("flood", "Flood: 1,000 connections, one client IP vs 100/hour (middleware)", "redis", 100),
}
LIBRARIES = ("ratewarden", "traffik", "slowapi", "bare")

# Runs in the page once it has loaded, and leaves what it measured in <pre id="measured">.
MEASURE = """
window.addEventListener('load', () => {
  const page = document.scrollingElement;
  const out = {scrollWidth: page.scrollWidth, clientWidth: page.clientWidth, charts: [], tables: []};
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    let left = Infinity, right = -Infinity;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBoundingClientRect();
      left = Math.min(left, b.left - box.left); right = Math.max(right, b.right - box.left);
    }
    out.charts.push({title: svg.getAttribute('aria-label'), width: box.width, left, right});
  }
  for (const table of document.querySelectorAll('table')) {
    const heads = table.querySelectorAll('th');
    const last = heads[heads.length - 1];
    out.tables.push({last: last.textContent, right: last.getBoundingClientRect().right});
  }
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
"""


def _row(scenario: str, library: str) -> Row:
    group, title, store, limit = TITLES[scenario]
    bare = library == "bare"
    admitted = 19_679 if bare else min(limit, 14_540)
    return Row(
        library=library, scenario=scenario, group=group, title=title, store=store, driver="live",
        concurrency=1000 if group == "flood" else 50, requests=23_906, rps=23_906.5, allowed=admitted,
        throttled=0 if bare else 23_806, errors=0, success_pct=60.0, throttled_pct=40.0, lat_mean_ms=1024.4,
        p50_ms=1057.9, p95_ms=1500.1, p99_ms=1547.5, p999_ms=1562.5, expected_allowed=None if bare else limit,
        correct=None if bare else True, iterations=5, rps_runs=[2438.7, 8680.2, 3460.1], cpu_pct=92.0,
        rss_mb=73.4, calls_per_request=None if bare else 3.11, vs_bare=None if bare else 1.86,
        admitted=admitted, admitted_max=admitted, limit=None if bare else limit, admitted_source="handler",
        without_store={} if library != "ratewarden" else {"over_limit_cache": 8436, "local_deny": 1200},
        measure="admitted" if group == "flood" else "allowed", rps_min=2438.7, rps_max=13_151.2,
        rps_cv_pct=58.0, vs_bare_min=None if bare else 1.14, vs_bare_max=None if bare else 4.82,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    rows = [_row(scenario, library) for scenario in TITLES for library in LIBRARIES]
    meta = Meta(command="ratewarden bench --quick", started="2026-01-01 00:00 UTC", machine="test")
    return write_html(out / "report.html", rows, meta)


def _measure(report: Path, width: int) -> dict[str, Any]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium: scripts/install-system-deps.sh installs it")
    page = report.with_name("measured.html")
    page.write_text(report.read_text().replace("</head>", f"<script>{MEASURE}</script></head>", 1))
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},900",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, flags=re.DOTALL)
    assert found, done.stderr[-2000:]
    measured: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return measured


def test_the_report_fits_a_1400_px_window(report: Path) -> None:
    measured = _measure(report, 1400)
    assert measured["scrollWidth"] <= measured["clientWidth"] == 1400  # no horizontal scrolling
    for table in measured["tables"]:
        assert table["right"] <= 1400, table  # every column on screen, "checks without store" too
    assert any(t["last"] == "checks without store" for t in measured["tables"])
    assert measured["charts"]
    for chart in measured["charts"]:
        assert chart["left"] >= 0 and chart["right"] <= chart["width"], chart  # no label cut at an edge


def test_chart_labels_are_whole_and_counts_are_whole_numbers(report: Path) -> None:
    html = report.read_text()
    flood = [svg for svg in re.findall(r"<svg.*?</svg>", html, flags=re.DOTALL) if "Flood" in svg]
    assert flood
    for svg in flood:
        label = " ".join(re.sub(r"<[^>]+>", " ", svg).split())
        assert "Flood: 1,000 connections, one client IP vs 100/hour (middleware)" in label
    admitted = next(svg for svg in flood if ": admitted (limit" in svg)
    assert ">100 admitted<" in admitted and "100.0" not in admitted
    throttled = next(svg for svg in flood if "throttled (429) count" in svg)
    assert ">23,806 <" in throttled and "23,806.0" not in throttled
