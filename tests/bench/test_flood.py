"""The flood scenarios (issue 19) and the admitted / limit figure every report carries.

A limiter that lets more than its limit through must never look like a fast win: the row is
flagged (``over_limit``) in the terminal summary, the Markdown, the CSV, the JSON and the HTML.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.adapters import load
from ratewarden.bench.apps import BenchApp, handler_runs
from ratewarden.bench.drivers import inprocess
from ratewarden.bench.drivers.live import ServerStats, count_admitted
from ratewarden.bench.reports import write_all
from ratewarden.bench.reports.meta import collect_meta
from ratewarden.bench.results import Run
from ratewarden.bench.runner import Options, Result, Task, _add_ratios, _row, plan_tasks, run_all
from ratewarden.bench.scenarios import FLOOD_CONNECTIONS, SCENARIOS, Scenario, resolve
from ratewarden.cli import bench as cli
from ratewarden.cli import bench_plan

FLOOD = ("flood.middleware", "flood.dependency")
needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_flood_resolves_by_group_and_key() -> None:
    assert [s.key for s in resolve(["flood"])] == list(FLOOD)
    assert [s.key for s in resolve(["flood.dependency"])] == ["flood.dependency"]
    for key in FLOOD:
        sc = SCENARIOS[key]
        assert (sc.limit, sc.window_s, sc.algorithm, sc.identity, sc.mode, sc.workers) == (
            100, 3600, "fixed_window", "ip", "live", 1)
        assert sc.concurrency == FLOOD_CONNECTIONS == 1000
    assert {SCENARIOS[k].integration for k in FLOOD} == {"middleware", "dependency"}


def test_cli_floods_redis_memcached_and_memory_unless_told(tmp_path: Path) -> None:
    planned = bench_plan.plan(_args("--scenario", "flood", "--out", str(tmp_path), "--flood-duration", "1.5"))
    assert not isinstance(planned, str)
    opts, _ = planned
    expected = [s for s in ("redis", "memcached") if shutil.which(f"{s}-server" if s == "redis" else s)]
    assert opts.flood_stores == [*expected, "memory"]
    assert opts.flood_duration == 1.5
    tasks = plan_tasks(opts)
    assert {t.concurrency for t in tasks} == {1000}
    assert [t.library for t in tasks].count("bare") == 2  # once per flood scenario, not per store
    told = bench_plan.plan(_args("--scenario", "flood.middleware", "--store", "redis", "--out", str(tmp_path)))
    assert not isinstance(told, str) and told[0].flood_stores == ["redis"]
    assert bench_plan.plan(_args("--scenario", "flood", "--flood-duration", "0", "--out", str(tmp_path))) == (
        "--concurrency, --iterations, --duration and --flood-duration must be positive (--warmup >= 0)")


def test_bench_app_counts_handler_runs_and_checks_without_the_store() -> None:
    """``/__bench__/stats``: the limited handlers' own count (never the exempt route) and, for
    ratewarden, ``Limiter.without_store()`` when the limiter has it."""
    adapter = load("ratewarden")(SCENARIOS["http.high"], _spec())
    app = BenchApp(adapter.build(), adapter.start, adapter.reset, adapter.stop, adapter.without_store)
    spec = inprocess.plan(SCENARIOS["http.high"])[0][0]

    async def go() -> dict[str, Any]:
        statuses = [await inprocess.call(app, spec) for _ in range(120)]
        await inprocess.call(app, inprocess.RequestSpec("GET", "/unthrottled", ((b"host", b"bench"),)))
        assert statuses.count(200) == 100 and statuses.count(429) == 20
        return app.stats()

    stats = asyncio.run(go())
    assert stats["admitted"] == 100
    if hasattr(adapter.limiter, "without_store"):
        assert isinstance(stats["without_store"], dict) and set(stats["without_store"]) >= {"timeout", "unreachable"}
    else:
        assert stats["without_store"] is None
    bare = load("bare")(SCENARIOS["http.high"], _spec()).build()
    assert handler_runs(bare) is not None and BenchApp(bare, _noop, _noop, _noop).stats()["without_store"] is None


async def _noop() -> None:
    return None


def _spec() -> Any:
    from ratewarden.bench.adapters import StoreSpec

    return StoreSpec()


def test_count_admitted_takes_the_servers_deltas() -> None:
    run = _run(allowed=90)
    count_admitted(run, ServerStats(500, {"timeout": 3, "over_limit_cache": 10}),
                   ServerStats(750, {"timeout": 3, "over_limit_cache": 910, "local_limiter": 4}))
    assert run.admitted == 250 and run.without_store == {"over_limit_cache": 900, "local_limiter": 4}
    silent = _run(allowed=90)
    count_admitted(silent, None, ServerStats(1, None))
    assert silent.admitted is None and silent.without_store == {}


def _run(allowed: int, admitted: int | None = None, rps_requests: int = 10_000,
         without: dict[str, int] | None = None) -> Run:
    return Run(requests=rps_requests, duration_s=2.0, status={"2xx": allowed, "429": rps_requests - allowed},
               latency_ms={"mean": 1.0, "p50": 1.0, "p95": 2.0, "p99": 3.0, "p999": 4.0, "max": 5.0},
               admitted=admitted, without_store=without or {})


def _results() -> list[Result]:
    """A flood record as the live runner makes it: a fast ratewarden row over its limit (one of its
    three iterations over), a slower traffik row that held it, and bare."""
    sc = SCENARIOS["flood.middleware"]
    made = {
        "ratewarden": [_run(95, 100, 20_000), _run(95, 512, 30_000), _run(95, 100, 40_000)],
        "traffik": [_run(100, 100, 8_000)] * 3,
        "bare": [_run(3000, 3100, 6_000)] * 3,
    }
    made["ratewarden"][1].without_store = {"timeout": 412, "over_limit_cache": 0}
    results = []
    for lib, runs in made.items():
        task = Task(sc, lib, "none" if lib == "bare" else "redis", 1000)
        results.append(Result(task, _row(task, runs, "live"), runs))
    _add_ratios([r.row for r in results if r.row])
    return results


def test_the_flag_is_set_by_the_worst_iteration_and_only_over_the_limit() -> None:
    rows = {r.task.library: r.row for r in _results() if r.row}
    rw, tr, bare = rows["ratewarden"], rows["traffik"], rows["bare"]
    assert (rw.admitted, rw.admitted_max, rw.limit, rw.over_limit) == (512, 512, 100, True)  # median by req/s
    assert rw.admitted_source == "handler" and rw.without_store == {"timeout": 412}
    assert rw.admitted_cell == "⚠ 512 / 100" and rw.vs_bare and rw.vs_bare > 1
    assert (tr.admitted, tr.limit, tr.over_limit, tr.admitted_cell) == (100, 100, False, "100 / 100")
    assert (bare.limit, bare.over_limit, bare.admitted_cell) == (None, False, "3,100 / no limit")
    task = Task(SCENARIOS["flood.middleware"], "traffik", "redis", 1000)
    mixed = _row(task, [_run(100, 100, 30_000), _run(100, 130, 10_000), _run(100, 100, 20_000)], "live")
    assert mixed.admitted == 100 and mixed.over_limit and mixed.admitted_cell == "⚠ 100 / 100 (max 130)"
    fallback = _row(task, [_run(100)], "live")  # no server count: the 2xx responses stand in
    assert (fallback.admitted, fallback.admitted_source, fallback.over_limit) == (100, "2xx", False)
    assert _row(task, [_run(101)], "live").over_limit


def _written(tmp_path: Path, results: list[Result]) -> dict[str, Any]:
    write_all(tmp_path, results, collect_meta("test", {"Method": "flood"}))
    with (tmp_path / "summary.csv").open() as f:
        csv_rows = {r["library"]: r for r in csv.DictReader(f)}
    data = json.loads((tmp_path / "results.json").read_text())
    return {"csv": csv_rows, "json": {r["library"]: r["summary"] for r in data["results"] if r["summary"]},
            "md": (tmp_path / "report.md").read_text(), "html": (tmp_path / "report.html").read_text()}


def test_an_over_limit_row_is_flagged_in_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _results()
    out = _written(tmp_path, results)
    assert out["csv"]["ratewarden"]["over_limit"] == "True" and out["csv"]["traffik"]["over_limit"] == "False"
    assert (out["csv"]["ratewarden"]["admitted"], out["csv"]["ratewarden"]["limit"]) == ("512", "100")
    assert json.loads(out["csv"]["ratewarden"]["without_store"]) == {"timeout": 412}
    assert out["csv"]["traffik"]["without_store"] == ""
    assert out["json"]["ratewarden"]["over_limit"] is True and out["json"]["traffik"]["over_limit"] is False
    assert out["json"]["ratewarden"]["without_store"] == {"timeout": 412}
    md = out["md"]
    line = next(ln for ln in md.splitlines() if ln.startswith("| Flood") and "| ratewarden |" in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "⚠ 512 / 100" and cells[4].startswith("⚠ ") and cells[5].startswith("⚠ ")  # req/s, x bare
    assert cells[-1] == "timeout 412"
    held = next(ln for ln in md.splitlines() if ln.startswith("| Flood") and "| traffik |" in ln)
    assert "⚠" not in held and "| 100 / 100 |" in held
    assert "**⚠ Admitted more than the limit**" in md and "ratewarden · flood.middleware · redis" in md
    html = out["html"]
    assert "<td class='over'>⚠ 512 / 100</td>" in html
    assert re.search(r"<td class='over'>⚠ [\d,]+</td><td class='over'>⚠ [\d.]+x</td>", html)  # req/s, ratio
    assert "<td>100 / 100</td>" in html and "⚠ over limit" in html  # the chart's flagged bar
    assert "<td>timeout 412</td>" in html
    cli._summary(results)
    term = capsys.readouterr().out
    rw = next(ln for ln in term.splitlines() if "ratewarden" in ln and "flood" in ln)
    tr = next(ln for ln in term.splitlines() if "traffik" in ln and "flood" in ln)
    assert rw.count("⚠") >= 3 and "512 / 100" in rw and "⚠" not in tr and "100 / 100" in tr
    assert "1 row(s) admitted more than the limit" in term
    assert "ratewarden · flood.middleware · redis: timeout 412" in term


def test_rows_that_hold_the_limit_carry_no_flag_anywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = [r for r in _results() if r.task.library != "ratewarden"]
    out = _written(tmp_path, results)
    assert all(r["over_limit"] == "False" for r in out["csv"].values())
    assert all(r["over_limit"] is False for r in out["json"].values())
    assert "⚠" not in out["md"] and "⚠" not in out["html"] and "class='over'" not in out["html"]
    assert "| 100 / 100 |" in out["md"] and "| 3,100 / no limit |" in out["md"]
    cli._summary(results)
    assert "⚠" not in capsys.readouterr().out


def test_a_misconfigured_limiter_is_flagged_end_to_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ratewarden adapter given twice the scenario's limit admits 200 of the 200 requests that an
    exact limiter answers with 100: the runner flags its row, and the reports show the flag."""
    real = load("ratewarden")

    class Lenient(real):  # type: ignore[misc, valid-type]
        def __init__(self, scenario: Scenario, store: Any) -> None:
            from dataclasses import replace

            super().__init__(replace(scenario, limit=scenario.limit * 2), store)

    monkeypatch.setattr("ratewarden.bench.runner.load", lambda lib: Lenient if lib == "ratewarden" else load(lib))
    opts = Options(scenarios=[SCENARIOS["http.high"]], libraries=["ratewarden", "bare"], iterations=1, warmup=0)
    results = run_all(opts)
    rw = next(r.row for r in results if r.row and r.row.library == "ratewarden")
    assert (rw.admitted, rw.limit, rw.over_limit, rw.correct) == (200, 100, True, False)
    out = _written(tmp_path, results)
    assert out["csv"]["ratewarden"]["over_limit"] == "True" and out["csv"]["bare"]["over_limit"] == "False"
    assert "⚠ 200 / 100" in out["md"] and "<td class='over'>⚠ 200 / 100</td>" in out["html"]
    cell = next(c for c in out["md"].splitlines() if c.startswith("| High load"))
    assert "⚠" in cell.split("|")[1 + 1]  # the ratewarden req/s cell, ratio included, is flagged


@needs_wrk
@pytest.mark.redis  # the bench starts its own redis-server
def test_flood_runs_end_to_end_on_redis(tmp_path: Path) -> None:
    """1,000 connections for one second on a private redis-server: every library's row has its
    admitted count (the server's own) beside the limit, and the flag says whether it held."""
    libraries = ["ratewarden", "traffik", "slowapi", "bare"]
    opts = Options(scenarios=[SCENARIOS["flood.middleware"]], libraries=libraries, iterations=1, warmup=0,
                   flood_stores=["redis"], flood_duration=1.0)
    results = run_all(opts)
    rows = {r.task.library: r.row for r in results if r.row}
    assert set(rows) == set(libraries), [r.skipped for r in results if r.skipped]
    for lib, row in rows.items():
        assert row.concurrency == 1000 and row.requests > 0 and row.admitted is not None
        assert row.admitted_source == "handler"
        if lib == "bare":
            assert row.limit is None and not row.over_limit and row.admitted >= row.allowed > 0
        else:
            assert row.store == "redis" and row.limit == 100
            assert row.over_limit == (row.admitted > 100)
    write_all(tmp_path, results, collect_meta("test", {"Method": "flood"}))
    md = (tmp_path / "report.md").read_text()
    assert "## live · store redis" in md and "admitted / limit" in md
    for lib in libraries:
        assert re.search(rf"\| {lib} \| 1000 \| (⚠ )?[\d,]+ / ({'no limit' if lib == 'bare' else '100'})", md), lib


def test_quick_floods_once_on_the_first_shared_store(tmp_path: Path) -> None:
    planned = bench_plan.plan(_args("--quick", "--out", str(tmp_path)))
    assert not isinstance(planned, str)
    opts, _ = planned
    flood = [t for t in plan_tasks(opts) if t.scenario.group == "flood"]
    store = "redis" if shutil.which("redis-server") else "memcached" if shutil.which("memcached") else "memory"
    assert {(t.scenario.key, t.store) for t in flood if t.library != "bare"} == {("flood.middleware", store)}
    assert [t.library for t in flood] == ["ratewarden", "traffik", "slowapi", "bare"]
    assert opts.flood_duration == 2.0 and opts.stores == ["memory"]


def test_explicit_values_are_kept_whatever_the_mode(tmp_path: Path) -> None:
    """``--quick`` shortens only what was not given: an explicit ``--iterations 5`` or
    ``--duration 10`` (a plain default) stays as given."""
    quick = bench_plan.plan(_args("--quick", "--out", str(tmp_path)))
    assert not isinstance(quick, str)
    assert (quick[0].iterations, quick[0].duration, quick[0].flood_duration) == (3, 2.0, 2.0)
    told = bench_plan.plan(_args("--quick", "--iterations", "5", "--duration", "10", "--flood-duration", "3",
                           "--out", str(tmp_path)))
    assert not isinstance(told, str)
    assert (told[0].iterations, told[0].duration, told[0].flood_duration) == (5, 10.0, 3.0)
    plain = bench_plan.plan(_args("--scenario", "flood", "--out", str(tmp_path)))
    assert not isinstance(plain, str)
    assert (plain[0].iterations, plain[0].flood_duration) == (3, 3.0)
