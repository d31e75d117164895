"""The gateway report read as a team reads it, on a made-up run (``gateway_synthetic``): the verdict
against each peer first, one chart per peer, every ratio ours ÷ theirs, medians with their range,
a negative added latency as noise, terminal lines within 120 columns, figures that never wrap in
the HTML, the files named as ``ratewarden bench``'s, and progress while the peer rounds run."""

from __future__ import annotations

import csv
import itertools
import re
import time
from html import escape, unescape
from pathlib import Path

import pytest

from ratewarden.bench import gateway, gateway_peer_run, gateway_progress
from ratewarden.bench.gateway_figures import DASH, HIGHER, LOWER, NOISE, Spread, judge, winner
from ratewarden.bench.gateway_peer_rows import PeerRound, PeerRow
from ratewarden.bench.gateway_peers import INSTANCES, PeerOptions, Tools
from ratewarden.bench.gateway_report import FILES, html, markdown, summary, write
from ratewarden.bench.gateway_rows import GatewayReport
from ratewarden.bench.gateway_setup import GatewayOptions
from ratewarden.bench.gateway_terminal import WIDTH
from ratewarden.bench.gateway_verdict import verdicts

from .gateway_synthetic import synthetic_report


def _r(text: str) -> str:
    """``text`` with each ``~`` an en dash, the range's join."""
    return text.replace("~", DASH)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[GatewayReport, Path]:
    report = synthetic_report()
    out = tmp_path_factory.mktemp("gateway-report")
    write(out, report)
    return report, out


def _target(report: GatewayReport, name: str) -> dict[str, object]:
    return next(t for t in report.targets if t["target"] == name)


def test_the_files_are_named_as_the_bench_names_its_own(written: tuple[GatewayReport, Path]) -> None:
    _, out = written
    assert FILES[:4] == ("report.html", "report.md", "results.json", "summary.csv")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert not list(out.glob("gateway*"))


def test_the_page_opens_with_a_verdict_against_each_peer(written: tuple[GatewayReport, Path]) -> None:
    _, out = written
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# Gateway decision service: ratewarden against HAProxy, nginx and envoyproxy/ratelimit"
    assert "Gateways: HAProxy and nginx" not in md
    assert next(line for line in lines if line.startswith("## ")) == "## Verdict"
    bullets = [line for line in lines if line.startswith("- ")][:3]
    assert [b.split(":")[0] for b in bullets] == ["- HAProxy", "- nginx", "- envoyproxy/ratelimit"]
    haproxy, nginx, envoy = bullets
    # who wins, by how much, on which row, at what load and noise, and whether it is exact
    assert _r("HAProxy wins on average latency: ours ÷ HAProxy average latency 1.36 (1.31~1.43)x over 3 rounds") in haproxy
    assert "Row: HAProxy + ratewarden (SPOE, compiled front door) against HAProxy stick tables" in haproxy
    assert "Load: 60 requests per round paced to 750 req/s, 15 keep-alive workers" in haproxy
    assert "Noise: load average 0.50 → 1.20 on 2 cores" in haproxy
    assert "Exact: ours yes (standard 30 / 30, basic 15 / 15); HAProxy yes" in haproxy
    assert "nginx: no verdict: nginx + ratewarden" in nginx and "configuration not available" in nginx
    assert _r("ratewarden wins on req/s: ours ÷ envoyproxy/ratelimit req/s 1.25 (1.24~1.27)x over 3 rounds") in envoy
    assert "(redis, under the limit, 1 connection)" in envoy and "Exact: ours yes (50 / 50 of 200 calls)" in envoy
    html = (out / "report.html").read_text()
    assert html.index("<h2 id=verdict>Verdict</h2>") < min(html.index("<table"), html.index("<svg"))
    assert "<title>Gateway decision service: ratewarden against HAProxy, nginx and envoyproxy/ratelimit</title>" in html


def test_one_chart_per_peer(written: tuple[GatewayReport, Path]) -> None:
    _, out = written
    html = (out / "report.html").read_text()
    sections = re.split(r"<h2[^>]*>", html)
    against = {s.split("<", 1)[0]: s for s in sections if s.startswith("Against ")}
    assert list(against) == ["Against HAProxy", "Against nginx", "Against envoyproxy/ratelimit"]
    for section in against.values():
        assert section.count("<svg") == 1
    assert "HAProxy: latency through the gateway" in against["Against HAProxy"]
    assert "gRPC decisions per second" in against["Against envoyproxy/ratelimit"]


def test_every_ratio_is_ours_over_theirs(written: tuple[GatewayReport, Path]) -> None:
    report, out = written
    md = (out / "report.md").read_text()
    for gone in ("reference req/s / ours", "floor req/s / ours", "vs reference", "vs floor"):
        assert gone not in md
    assert md.count("lower is better") == 1 and md.count("higher is better") == 1  # said once, per metric
    assert "average latency, p99 and CPU per decision: lower is better; req/s: higher is better" in md
    for header in re.findall(r"\| ([^|]*÷[^|]*) \|", md):
        left = header.split(" ÷ ")[0].strip()
        assert left.split()[0] == "ours" or left == "avg: this row", header
    # ours slower than the floor: below 1 by req/s, above 1 by CPU (the numbers in gateway_synthetic)
    rps = _target(report, "service capacity, gRPC ShouldRateLimit")
    assert rps["direction"] == HIGHER and rps["ours"] == pytest.approx(4_429 / 5_800)
    cpu = _target(report, "service capacity, gRPC: server CPU per decision")
    assert cpu["direction"] == LOWER and cpu["ours"] == pytest.approx(220.0 / 168.0, rel=0.05)
    envoy = next(v for v in verdicts(report) if v.peer == "envoyproxy/ratelimit")
    faster = next(c for c in envoy.comparisons if c.metric == "req/s" and c.where.startswith("redis, under")
                  and "compiled" in c.ours_row)
    assert faster.ratio is not None and faster.ratio.median == pytest.approx(10_000 / 8_000)
    assert faster.winner == "ours"


def test_medians_come_with_their_range_never_a_best_round(written: tuple[GatewayReport, Path]) -> None:
    report, out = written
    text = (out / "report.md").read_text() + (out / "report.html").read_text() + summary(report)
    assert not re.search(r"med(ian)? ?/ ?min", text)
    assert _r("| HAProxy, no limiting | 3 | 751 (750~752) | 0.14 (0.13~0.15) | 0.30 (0.27~0.32) | 0.45 (0.40~0.50) |") \
        in text
    assert _r("| 14,700 (6,156~15,000) |") in text  # the capacity row: a slow round shows as the range's low end
    assert "met_min" not in (out / "results.json").read_text()
    with (out / "summary.csv").open() as f:
        row = next(csv.DictReader(f))
    assert (row["p99_ms_median"], row["p99_ms_min"], row["p99_ms_max"]) == ("0.45", "0.4", "0.5")
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert Spread(2.0, 1.0, 3.0, 3).text(1, " ms") == _r("2.0 (1.0~3.0) ms") and Spread(2.0, 2.0, 2.0, 1).text(1) == "2.0"


def test_a_negative_added_latency_is_noise_not_a_pass(written: tuple[GatewayReport, Path]) -> None:
    report, out = written
    added = _target(report, "HAProxy + ratewarden (SPOE, compiled front door): added p99")
    assert added["ours"] == pytest.approx(-0.05) and added["met"] == NOISE
    assert _target(report, "HAProxy + ratewarden (SPOE): added p99")["met"] == "yes"
    assert added["floor"] is None  # the SPOE floor is Python's: not the compiled agent's stack
    assert judge(Spread(-1.34, -1.5, -0.2, 3), LOWER, 1.0, nothing_added=0.0) == NOISE
    assert judge(Spread(0.97, 0.9, 1.1, 3), LOWER, 1.25, nothing_added=1.0) == NOISE  # faster than no check
    assert judge(Spread(0.3, 0.1, 0.5, 3), LOWER, 1.0, nothing_added=0.0) == "yes"
    assert judge(Spread(1.3, 0.1, 1.5, 3), LOWER, 1.0, nothing_added=0.0) == "NO"
    row = next(line for line in (out / "report.md").read_text().splitlines()
               if line.startswith("| HAProxy + ratewarden (SPOE, compiled front door): added p99"))
    assert row.endswith("| within noise |") and "-0.05 (-0.05 to -0.05) ms" in row
    assert winner(Spread(1.05, 0.96, 1.09, 3), HIGHER) == NOISE  # the rounds disagree: nobody wins


def test_the_terminal_summary_fits_120_columns_and_points_to_the_report(written: tuple[GatewayReport, Path]) -> None:
    report, out = written
    path = out / "report.html"
    text = summary(report, path)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH == 120
    assert not any(line.startswith("|") for line in lines)  # no Markdown tables
    assert lines[-1].endswith(str(path)) or str(path) in text
    assert text.index("HAProxy wins") < text.index("Targets:")
    assert "within noise" in text and "Missing (2 rows" in text
    assert "beside it: report.md, results.json, summary.csv, capacity.csv, peers.csv" in " ".join(lines[-3:])


def test_figures_never_wrap_in_the_html(written: tuple[GatewayReport, Path]) -> None:
    _, out = written
    html = (out / "report.html").read_text()
    assert ".num{white-space:nowrap}" in html and "td.num{white-space:nowrap}" in html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", html)
    assert cells
    for cell in cells:
        outside = re.sub(r"<span class=num>.*?</span>", "", cell)
        assert not re.search(r"\d[,.]\d", outside), cell  # every figure inside a span that never wraps
    assert '<td class="num"><span class=num>6,358</span></td>' not in html  # (not a cell of its own here)
    assert re.search(r'<td class="num"><span class=num>3</span></td>', html)  # a figures-only cell never wraps
    assert _r("<span class=num>14,700</span> <span class=num>(6,156~15,000)</span>") in html


def test_the_progress_interval_while_the_peer_rounds_are_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gateway_progress.PROGRESS_SECONDS <= 15
    monkeypatch.setattr(gateway_progress, "PROGRESS_SECONDS", 0.2)
    stamps: list[tuple[float, str]] = []

    def silent_peers(opts: PeerOptions, root: Path, log: object) -> tuple[list[PeerRow], list[str]]:
        time.sleep(1.2)  # a peer round saying nothing
        return [], []

    monkeypatch.setattr(gateway, "run_peers", silent_peers)
    opts = GatewayOptions(variants=[], capacity=False, peers=True)
    start = time.monotonic()
    gateway.run(opts, log=lambda line: stamps.append((time.monotonic(), line)))
    times = [start] + [t for t, _ in stamps]
    assert len(stamps) >= 4, stamps
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.2 + 0.3, stamps
    assert all("still running" in line for _, line in stamps)


def test_the_peer_rounds_say_each_service_and_cell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lines: list[str] = []
    monkeypatch.setattr(gateway_peer_run, "_start", lambda *a: ([], 1))
    monkeypatch.setattr(gateway_peer_run, "_clear_of_minute", lambda seconds: None)

    async def admitted(port: int, value: str) -> int:
        return 50

    monkeypatch.setattr(gateway_peer_run, "_admitted", admitted)
    monkeypatch.setattr(gateway_peer_run, "_measure",
                        lambda tools, procs, redis, port, row, r, opts, protoset: PeerRound(r, 1, 1.0, 1, 1, 1, None))
    rows = {i: [PeerRow(i.service, i.store, s, i.workers, c) for s, c in i.cells] for i in INSTANCES}
    gateway_peer_run._round(0, PeerOptions(rounds=3, requests=100), Tools(), tmp_path, None, rows, lines.append)
    assert sum("starting" in line for line in lines) == len(INSTANCES)
    assert sum("ghz, 100 calls" in line for line in lines) == sum(len(i.cells) for i in INSTANCES)
    assert all(line.startswith("peer round 1/3, service ") for line in lines)
    assert max(len(line) for line in lines) <= WIDTH


def test_a_heartbeat_line_fits_the_terminal() -> None:
    lines: list[str] = []
    with gateway_progress.Heartbeat(lines.append, interval=0.05) as progress:
        progress("peer round 1/3: " + "a step with a very long name " * 10)
        time.sleep(0.3)
    beats = lines[1:]
    assert beats and all(len(line) <= WIDTH and "still running" in line for line in beats)


def test_markdown_without_peers_names_only_the_gateways() -> None:
    md = markdown(synthetic_report(peers=False))
    assert md.startswith("# Gateway decision service: ratewarden against HAProxy and nginx\n")
    assert "envoyproxy/ratelimit" not in md.split("## Method")[0]


def test_the_page_and_the_markdown_read_the_same_sections() -> None:
    """Both renderings walk one list of sections: the same headings in the same order (the page adds
    only the sections of peers it has a chart for and no comparison), and a row over the limit is
    flagged in both."""
    report = synthetic_report(peers=False)
    report.variants[2].rounds[0].groups[0].exact = "⚠ over"
    md, page = markdown(report), html(report)
    md_headings = re.findall(r"^#{2,3} (.*)$", md, flags=re.MULTILINE)
    page_headings = [unescape(re.sub(r"<[^>]+>", "", h)) for h in re.findall(r"<h[23][^>]*>(.*?)</h[23]>", page)]
    assert [h.replace("`", "") for h in md_headings] == [h for h in page_headings if h != "Against nginx"]
    assert "Against nginx" in page_headings and "## Against nginx" not in md  # a chart, no comparison
    assert "### HAProxy, no limiting (`haproxy`), summed over 3 rounds" in md
    assert "<h3>HAProxy, no limiting (<code>haproxy</code>), summed over <span class=num>3</span> rounds</h3>" in page
    flagged = f"over the limit: {report.variants[2].title}"
    assert flagged in md and escape(flagged) in page
