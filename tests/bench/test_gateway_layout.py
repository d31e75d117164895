"""The gateway report (``report.html``) read in a real browser at 1,400 px: no figure broken over two
lines, no horizontal scrolling, no chart label cut at its edge, the verdict above every table and
chart. Measured with headless Chromium (scripts/install-system-deps.sh installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.gateway_report import write

from .gateway_synthetic import synthetic_report

# Runs in the page once it has loaded, and leaves what it measured in <pre id="measured">.
MEASURE = """
window.addEventListener('load', () => {
  const page = document.scrollingElement;
  const out = {scrollWidth: page.scrollWidth, clientWidth: page.clientWidth, figures: 0, broken: [],
               cells: 0, wrapping: [], charts: [], verdict: 0, first: 0};
  for (const span of document.querySelectorAll('span.num')) {
    out.figures += 1;
    if (span.getClientRects().length !== 1) out.broken.push(span.textContent);
  }
  for (const td of document.querySelectorAll('td.num')) {
    out.cells += 1;
    if (getComputedStyle(td).whiteSpace !== 'nowrap') out.wrapping.push(td.textContent);
  }
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    let left = Infinity, right = -Infinity;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBoundingClientRect();
      left = Math.min(left, b.left - box.left); right = Math.max(right, b.right - box.left);
    }
    out.charts.push({title: svg.getAttribute('aria-label'), width: box.width, left, right});
  }
  out.verdict = document.getElementById('verdict').getBoundingClientRect().top;
  out.first = Math.min(...[...document.querySelectorAll('table, svg')].map(e => e.getBoundingClientRect().top));
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
"""


def _measure(page: Path, width: int) -> dict[str, Any]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium: scripts/install-system-deps.sh installs it")
    measured_page = page.with_name("measured.html")
    measured_page.write_text(page.read_text().replace("</head>", f"<script>{MEASURE}</script></head>", 1))
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},900",
         "--virtual-time-budget=5000", "--dump-dom", measured_page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, flags=re.DOTALL)
    assert found, done.stderr[-2000:]
    measured: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return measured


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gateway-html")
    write(out, synthetic_report())
    return _measure(out / "report.html", 1400)


def test_no_figure_breaks_over_two_lines(measured: dict[str, Any]) -> None:
    assert measured["figures"] > 100 and measured["cells"] > 50
    assert measured["broken"] == []
    assert measured["wrapping"] == []


def test_the_page_fits_a_1400_px_window_and_opens_with_the_verdict(measured: dict[str, Any]) -> None:
    assert measured["scrollWidth"] <= measured["clientWidth"] == 1400
    assert measured["verdict"] < measured["first"]
    assert len(measured["charts"]) == 3  # one per peer
    for chart in measured["charts"]:
        assert chart["left"] >= 0 and chart["right"] <= chart["width"], chart
