"""Issue 21, item 4: the report says what each row measures, how exact and how noisy it was.

``--quick`` has an all-allowed live row next to the flooded hot key, each under a heading that
says what it measures; every row carries admitted / limit and an exact verdict per library; an
over-limit live row is flagged in every format; the spread over rounds is in every format; and
the live driver runs the libraries in interleaved rounds, as the in-process driver does.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.drivers import live
from ratewarden.bench.drivers.live import ServerStats
from ratewarden.bench.reports import write_all
from ratewarden.bench.reports.meta import collect_meta
from ratewarden.bench.results import Run, spread
from ratewarden.bench.runner import Options, Result, Task, _add_ratios, _groups, _row, plan_tasks, run_all
from ratewarden.bench.scenarios import MEASURES, QUICK_LIVE, SCENARIOS
from ratewarden.cli import bench as cli
from ratewarden.cli import bench_plan

ALLOWED = MEASURES["allowed"]
REJECTED = MEASURES["rejected"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def _run(rps: float, allowed: int, throttled: int = 0, admitted: int | None = None) -> Run:
    requests = allowed + throttled
    return Run(requests=requests, duration_s=requests / rps, status={"2xx": allowed, "429": throttled},
               latency_ms={"mean": 1.0, "p50": 1.0, "p95": 2.0, "p99": 3.0, "p999": 4.0, "max": 5.0},
               admitted=admitted if admitted is not None else allowed)


def _results(over: bool = False) -> list[Result]:
    """Live records as the runner makes them, three rounds each: all allowed, and a hot key where
    ratewarden (when ``over``) let 150 through against 100."""
    made: dict[tuple[str, str], list[Run]] = {
        ("live.allowed", "ratewarden"): [_run(r, 9000) for r in (9000, 9400, 8200)],
        ("live.allowed", "traffik"): [_run(r, 9900) for r in (9900, 9800, 10100)],
        ("live.allowed", "bare"): [_run(r, 10_000) for r in (10_000, 9900, 10_200)],
        ("live.light", "ratewarden"): [_run(r, 100, 20_000, 150 if over else 100) for r in (20_000, 21_000, 19_000)],
        ("live.light", "traffik"): [_run(r, 100, 11_000) for r in (11_000, 12_000, 11_500)],
        ("live.light", "bare"): [_run(r, 10_000) for r in (10_000, 9800, 10_100)],
    }
    results = []
    for (key, lib), runs in made.items():
        task = Task(SCENARIOS[key], lib, "none" if lib == "bare" else "memory", 50)
        results.append(Result(task, _row(task, runs, "live"), runs))
    _add_ratios([r.row for r in results if r.row])
    return results


def _written(tmp_path: Path, results: list[Result]) -> dict[str, Any]:
    write_all(tmp_path, results, collect_meta("test", {"Method": "live"}))
    with (tmp_path / "summary.csv").open() as f:
        csv_rows = {(r["scenario"], r["library"]): r for r in csv.DictReader(f)}
    data = json.loads((tmp_path / "results.json").read_text())
    js = {(r["scenario"], r["library"]): r["summary"] for r in data["results"] if r["summary"]}
    return {"csv": csv_rows, "json": js, "md": (tmp_path / "report.md").read_text(),
            "html": (tmp_path / "report.html").read_text()}


def _md_line(md: str, title: str, lib: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {title}") and f"| {lib} |" in ln)
    return [c.strip() for c in line.strip("|").split("|")]


def test_quick_has_an_all_allowed_live_row_beside_the_hot_key(tmp_path: Path) -> None:
    assert "live.allowed" in QUICK_LIVE and "live.light" in QUICK_LIVE
    planned = bench_plan.plan(_args("--quick", "--out", str(tmp_path)))
    assert not isinstance(planned, str)
    opts, _ = planned
    live_tasks = [t for t in plan_tasks(opts) if t.scenario.group == "live"]
    assert {t.scenario.key for t in live_tasks} == {"live.allowed", "live.light"}
    assert {t.scenario.measures for t in live_tasks} == {"allowed", "rejected"}
    assert opts.iterations == 3 and opts.duration == 2.0  # interleaved short rounds: a spread, and still quick


def test_headings_say_what_each_row_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _written(tmp_path, _results())
    md = out["md"]
    assert f"### Live server (uvicorn + wrk) · {ALLOWED}" in md
    assert f"### Live server (uvicorn + wrk) · {REJECTED}" in md
    assert "overhead against no limiter" not in md
    allowed_at, rejected_at = md.index(ALLOWED), md.index(REJECTED)
    light = md.index("| Light, one hot key")
    assert allowed_at < md.index("| Light, all allowed") < rejected_at < light  # each row under its heading
    assert f"Live server (uvicorn + wrk) · {ALLOWED}" in out["html"] and REJECTED in out["html"]
    assert out["csv"][("live.allowed", "ratewarden")]["measure"] == "allowed"
    assert out["json"][("live.light", "traffik")]["measure"] == "rejected"
    cli._summary(_results())
    term = capsys.readouterr().out
    assert ALLOWED in term and REJECTED in term
    assert term.index(ALLOWED) < term.index("live.allowed") < term.index(REJECTED) < term.index("live.light")


def test_in_process_tables_are_headed_by_what_they_measure() -> None:
    from ratewarden.bench.reports.markdown import build_tables

    assert (SCENARIOS["http.low"].measures, SCENARIOS["http.high"].measures) == ("allowed", "mixed")
    assert SCENARIOS["keys.hot"].measures == "rejected" and SCENARIOS["strategy.gcra"].measures == "mixed"
    opts = Options(scenarios=[SCENARIOS["http.low"], SCENARIOS["http.high"]], libraries=["ratewarden", "bare"],
                   iterations=2, warmup=0)
    results = run_all(opts)
    titles = [t.title for t in build_tables([r.row for r in results if r.row], results)]
    assert f"HTTP dependency mode · {ALLOWED}" in titles
    assert f"HTTP dependency mode · {MEASURES['mixed']}" in titles
    exact = next(t for t in build_tables([r.row for r in results if r.row]) if "exact limiter" in t.title)
    assert exact.header == ["Library", "Exact", "Deviations"]  # per library, not one total
    assert exact.body == [["ratewarden", "2/2 exact", "all exact"]]


def test_live_rows_carry_admitted_limit_and_exact_per_library(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    results = _results()
    rows = {(r.task.scenario.key, r.task.library): r.row for r in results if r.row}
    rw = rows[("live.light", "ratewarden")]
    assert (rw.admitted, rw.limit, rw.expected_allowed, rw.correct, rw.exact_cell) == (100, 100, 100, True, "yes")
    al = rows[("live.allowed", "traffik")]
    assert (al.admitted, al.limit, al.correct, al.exact_cell) == (9900, 1_000_000_000, True, "yes")
    assert rows[("live.light", "bare")].exact_cell == "—"
    md = _written(tmp_path, results)["md"]
    for title, lib, admitted in (("Light, one hot key", "ratewarden", "100 / 100"),
                                 ("Light, one hot key", "traffik", "100 / 100"),
                                 ("Light, all allowed", "ratewarden", "9,000 / 1,000,000,000"),
                                 ("Light, all allowed", "bare", "10,000 / no limit")):
        cells = _md_line(md, title, lib)
        assert cells[3] == admitted and cells[6] == ("—" if lib == "bare" else "yes"), (title, lib)
    cli._summary(results)
    term = capsys.readouterr().out
    for lib in ("ratewarden", "traffik"):
        line = next(ln for ln in term.splitlines() if "live.light" in ln and lib in ln)
        assert re.search(r"\byes\b.*100 / 100", line), line  # the exact column is no longer empty


def test_a_live_row_under_its_limit_or_with_429s_when_all_are_allowed_is_not_exact() -> None:
    task = Task(SCENARIOS["live.light"], "traffik", "memory", 50)
    under = _row(task, [_run(9000, 90, 9000, 90)], "live")
    assert (under.correct, under.over_limit, under.exact_cell) == (False, False, "NO")
    allowed = Task(SCENARIOS["live.allowed"], "slowapi", "memory", 50)
    throttled = _row(allowed, [_run(9000, 8000, 1000)], "live")
    assert (throttled.expected_allowed, throttled.correct, throttled.exact_cell) == (9000, False, "NO")
    many = _row(Task(SCENARIOS["live.many-keys"], "slowapi", "memory", 50), [_run(9000, 9000)], "live")
    assert (many.correct, many.exact_cell) == (None, "within")  # only a ceiling is known


def test_an_over_limit_live_row_is_flagged_in_every_format(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    results = _results(over=True)
    out = _written(tmp_path, results)
    key = ("live.light", "ratewarden")
    assert out["csv"][key]["over_limit"] == "True" and out["csv"][("live.light", "traffik")]["over_limit"] == "False"
    assert (out["csv"][key]["admitted"], out["csv"][key]["limit"], out["csv"][key]["correct"]) == ("150", "100",
                                                                                                   "False")
    assert out["json"][key]["over_limit"] is True and out["json"][("live.allowed", "ratewarden")]["over_limit"] is False
    cells = _md_line(out["md"], "Light, one hot key", "ratewarden")
    assert cells[3] == "⚠ 150 / 100" and cells[4].startswith("⚠ ") and cells[5].startswith("⚠ ")
    assert cells[6] == "⚠ over" and cells[8].startswith("⚠ ")  # exact, ratio over rounds
    assert "⚠" not in "".join(_md_line(out["md"], "Light, one hot key", "traffik"))
    assert "**⚠ Admitted more than the limit**" in out["md"] and "ratewarden · live.light · memory" in out["md"]
    html = out["html"]
    assert "<td class='over'>⚠ 150 / 100</td>" in html and "<td class='over'>⚠ over</td>" in html
    assert "⚠ over limit" in html  # the throughput chart's flagged bar
    cli._summary(results)
    term = capsys.readouterr().out
    line = next(ln for ln in term.splitlines() if "live.light" in ln and "ratewarden" in ln)
    assert line.count("⚠") >= 4 and "150 / 100" in line
    assert "1 row(s) admitted more than the limit" in term


def test_spread_over_rounds_in_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = spread([10.0, 12.0, 14.0])
    assert s is not None and (s.min, s.median, s.max) == (10.0, 12.0, 14.0)
    assert s.cv_pct == pytest.approx(100 * 2.0 / 12.0)
    one = spread([5.0])
    assert one is not None and one.cv_pct is None and spread([]) is None
    results = _results()
    rw = next(r.row for r in results if r.row and r.row.scenario == "live.allowed" and r.row.library == "ratewarden")
    assert (rw.rps, rw.rps_min, rw.rps_max) == (9000, 8200, 9400) and rw.rps_cv_pct is not None
    # Round by round against bare: 9000/10000, 9400/9900, 8200/10200.
    assert rw.vs_bare_min == pytest.approx(8200 / 10_200) and rw.vs_bare_max == pytest.approx(9400 / 9900)
    assert rw.spread_cell == f"8,200-9,400 (cv {rw.rps_cv_pct:.0f}%)" and rw.ratio_spread_cell == "0.80-0.95"
    out = _written(tmp_path, results)
    c = out["csv"][("live.allowed", "ratewarden")]
    assert (float(c["rps_min"]), float(c["rps_max"]), float(c["vs_bare_min"])) == (8200, 9400, 0.8039)
    assert float(c["rps_cv_pct"]) > 0
    js = out["json"][("live.allowed", "ratewarden")]
    assert js["rps_min"] == 8200 and js["rps_cv_pct"] == pytest.approx(rw.rps_cv_pct)
    cells = _md_line(out["md"], "Light, all allowed", "ratewarden")
    assert cells[7] == rw.spread_cell and cells[8] == "0.80-0.95"
    assert "**How noisy the machine was**" in out["md"] and "coefficient of variation median" in out["md"]
    assert "How noisy the machine was" in out["html"] and rw.spread_cell in out["html"]
    cli._summary(results, "load average (1/5/15 min) 9.00/8.00/7.00 at the start")
    term = capsys.readouterr().out
    assert "how noisy the machine was" in term and "9.00/8.00/7.00" in term and "8,200-9,400" in term


class _FakeServer:
    """Stands in for a uvicorn server: records when it starts, resets and stops."""

    events: list[str] = []

    def __init__(self, library: str, scenario: Any, store: Any, cores: Any, workers: int = 1) -> None:
        self.library = library

    def __enter__(self) -> _FakeServer:
        self.events.append(f"start {self.library}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append(f"stop {self.library}")

    def reset(self) -> None:
        pass

    def stats(self) -> ServerStats:
        return ServerStats(None, None)

    def settled_stats(self) -> ServerStats:
        return ServerStats(None, None)


def test_the_live_driver_runs_the_libraries_in_interleaved_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every server is up first; then each round runs every library once, starting one further on,
    warm-up round first (shorter); one server per library, stopped at the end."""
    _FakeServer.events = []

    def run_iteration(server: _FakeServer, sc: Any, duration: float, concurrency: int, cores: Any,
                      hot_key: str = "") -> Run:
        server.events.append(f"run {server.library} {duration:g}")
        return _run(1000, 100, 900) if server.library != "bare" else _run(1000, 1000)

    monkeypatch.setattr(live, "LiveServer", _FakeServer)
    monkeypatch.setattr(live, "run_iteration", run_iteration)
    monkeypatch.setattr(live, "require_wrk", lambda: "wrk")
    monkeypatch.setattr("ratewarden.bench.runner._clear_of_window_edge", lambda window, duration: None)
    opts = Options(scenarios=[SCENARIOS["live.light"]], libraries=["ratewarden", "traffik", "bare"], iterations=2,
                   warmup=1, duration=3.0, warmup_duration=1.0)
    results = run_all(opts)
    assert _FakeServer.events == [
        "start ratewarden", "start traffik", "start bare",
        "run ratewarden 1", "run traffik 1", "run bare 1",  # warm-up round
        "run traffik 3", "run bare 3", "run ratewarden 3",
        "run bare 3", "run ratewarden 3", "run traffik 3",
        "stop bare", "stop traffik", "stop ratewarden",
    ]
    assert [len(r.runs) for r in results] == [2, 2, 2]
    assert live.rounds(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)] and live.rounds(0, 3) == []


def test_live_groups_are_one_scenario_on_one_store_and_multi_worker_rows_stay_alone() -> None:
    opts = Options(scenarios=[SCENARIOS["live.light"], SCENARIOS["flood.middleware"], SCENARIOS["live.workers"]],
                   libraries=["ratewarden", "slowapi", "bare"], flood_stores=["redis", "memory"],
                   worker_stores=["memory", "shm"], workers=2)
    groups = [[(t.scenario.key, t.library, t.store) for t in g] for g in _groups(plan_tasks(opts))]
    assert [("live.light", "ratewarden", "memory"), ("live.light", "slowapi", "memory"),
            ("live.light", "bare", "none")] in groups
    assert [("flood.middleware", "ratewarden", "redis"), ("flood.middleware", "slowapi", "redis"),
            ("flood.middleware", "bare", "none")] in groups
    assert [("flood.middleware", "ratewarden", "memory"), ("flood.middleware", "slowapi", "memory")] in groups
    workers = [g for g in groups if g[0][0] == "live.workers"]
    assert workers and all(len(g) == 1 for g in workers)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_all_allowed_live_rows_run_end_to_end() -> None:
    """Two short interleaved rounds of live.allowed: the server counts what it served, nothing is
    rejected, and each row has its spread and its round-by-round ratio to no limiter."""
    opts = Options(scenarios=[SCENARIOS["live.allowed"]], libraries=["ratewarden", "bare"], iterations=2, warmup=0,
                   duration=1.0, concurrency=[10])
    rows = {r.task.library: r.row for r in run_all(opts) if r.row}
    rw, bare = rows["ratewarden"], rows["bare"]
    assert rw.admitted_source == "handler" and rw.throttled == 0 and rw.admitted and rw.admitted >= rw.allowed > 0
    assert (rw.limit, rw.over_limit, rw.correct, rw.exact_cell, rw.measure) == (1_000_000_000, False, True, "yes",
                                                                                 "allowed")
    assert rw.rps_min is not None and rw.rps_max is not None and rw.rps_min <= rw.rps <= rw.rps_max
    assert rw.vs_bare_min is not None and rw.vs_bare_max is not None and bare.rps_cv_pct is not None
