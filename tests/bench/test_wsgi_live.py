"""``ratewarden bench --wsgi``'s live rows (issue 23): Flask and Django apps under gunicorn with several
sync workers, loaded by wrk. Each row carries admitted / limit from the workers' own counts; a limiter
that counts per process admits up to workers x the limit, and the row is flagged over its limit.

No timed assertion: the speed figures are only checked for being there and consistent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench import wsgi_apps, wsgi_live, wsgi_live_apps
from ratewarden.bench.results import Row, Run
from ratewarden.cli import bench as cli

needs_live = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def _variant(name: str) -> wsgi_live.LiveVariant:
    return next(v for v in wsgi_live.variants(wsgi_live.SCENARIOS["wsgi.limited"]) if v.name == name)


def _run(rps: float, ok: int, refused: int = 0) -> tuple[Run, dict[str, int]]:
    n = ok + refused
    run = Run(requests=n, duration_s=n / rps, status={"2xx": ok, "429": refused},
              latency_ms={"mean": 1.0, "p50": 1.0, "p95": 2.0, "p99": 3.0, "p999": 4.0, "max": 5.0}, admitted=ok)
    return run, {"2xx": ok, "429": refused, "403": 0, "other": 0}


def _row(name: str, made: list[tuple[Run, dict[str, int]]], scenario: str = "wsgi.limited") -> Row:
    runs, served = [r for r, _ in made], [s for _, s in made]
    return wsgi_live.live_row(_variant(name), wsgi_live.SCENARIOS[scenario], "memory", runs, served, 2, 50)


def test_rows_carry_admitted_over_limit_and_min_median() -> None:
    """A shared store's 100 of 100 is exact; a per-process count's 200 of 100 (2 workers) is flagged;
    req/s is the median round's with the slowest round beside it; the ratio is to the bare app of
    the same framework, round by round too."""
    exact = _row("ratewarden.flask", [_run(r, 100, 4000) for r in (5000, 6000, 4000)])
    over = _row("flask-limiter", [_run(r, 200, 3000) for r in (3000, 2500, 3500)])
    bare = _row("flask bare", [_run(r, 5000) for r in (5000, 5000, 5000)])
    floor = _row("floor: fixed 429", [_run(r, 0, 8000) for r in (8000, 8000, 8000)])
    wsgi_live.add_ratios([exact, over, bare, floor])

    assert (exact.admitted, exact.limit, exact.over_limit, exact.exact_cell, exact.store) == (100, 100, False, "yes",
                                                                                             "shm")
    assert (exact.rps, exact.rps_min, exact.rps_max) == pytest.approx((5000, 4000, 6000))
    assert (exact.vs_bare, exact.vs_bare_min, exact.vs_bare_max) == pytest.approx((1.0, 0.8, 1.2))
    assert (over.admitted_cell, over.exact_cell, over.over_limit, over.store) == ("⚠ 200 / 100", "⚠ over", True,
                                                                                  "memory")
    assert "per process" in over.note
    assert (bare.limit, bare.vs_bare, bare.exact_cell) == (None, None, "—")
    assert (floor.admitted, floor.limit, floor.throttled) == (0, None, 8000)
    assert floor.vs_bare == pytest.approx(1.6)

    table = wsgi_live.live_table([exact, over, bare, floor])
    assert "| wsgi.limited | ratewarden.flask | shm | 100 / 100 | yes | 5,000 | 4,000 |" in table
    assert "| wsgi.limited | flask-limiter | memory | ⚠ 200 / 100 | ⚠ over | ⚠ 3,000 | ⚠ 2,500 |" in table
    assert wsgi_live.over_limit_lines([exact, over]) == [
        "⚠ flask-limiter · wsgi.limited · memory: admitted 200 / 100 (2 workers: a per-process count admits up "
        "to 2 x the limit)"]


def test_one_round_over_the_limit_flags_the_row() -> None:
    """The median round may hold the limit while another did not: the row is still flagged."""
    row = _row("django-ratelimit", [_run(3000, 100, 10), _run(3100, 100, 10), _run(2000, 150, 10)])
    assert (row.admitted, row.admitted_max, row.over_limit, row.correct) == (100, 150, True, False)
    assert "403" in row.note


def test_all_allowed_rows_are_exact_when_nothing_is_refused() -> None:
    row = _row("ratewarden.django", [_run(4000, 12_000)], "wsgi.allowed")
    assert (row.limit, row.correct, row.exact_cell, row.measure) == (10**9, True, "yes", "allowed")
    refused = _row("ratewarden.django", [_run(4000, 12_000, 3)], "wsgi.allowed")
    assert refused.exact_cell == "NO"


def test_counted_sums_the_answers_of_every_worker(tmp_path: Path) -> None:
    """Each process counts into its own file; ``read_counts`` sums them by status."""
    statuses = iter(["200 OK", "429 Too Many Requests", "403 Forbidden", "500 Internal Server Error", "200 OK"])

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response(next(statuses), [])
        return [b""]

    counted = wsgi_live_apps.Counted(app, str(tmp_path))
    for _ in range(5):
        wsgi_apps.call(counted, wsgi_apps.base_environ())
    (tmp_path / "99999999").write_bytes((3).to_bytes(8, "little") + bytes(24))  # another worker's file
    assert wsgi_live_apps.read_counts(str(tmp_path)) == (2, {"2xx": 5, "429": 1, "403": 1, "other": 1})
    assert sorted(os.listdir(tmp_path)) == sorted([str(os.getpid()), "99999999"])


def test_cli_runs_the_live_rows_and_writes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--wsgi --driver live``: the live rows only, with --workers, --duration, --concurrency and the
    rounds passed on; wsgi.md and wsgi.json have them, over-limit rows flagged."""
    seen: dict[str, Any] = {}
    over = _row("flask-limiter", [_run(3000, 200, 3000)])

    def fake(phases: list[str], **kw: Any) -> list[Row]:
        seen.update(kw, phases=phases)
        return [over]

    def no_inprocess(*a: Any, **kw: Any) -> Any:
        raise AssertionError("--driver live runs no in-process row")

    monkeypatch.setattr(wsgi_live, "run_live", fake)
    monkeypatch.setattr("ratewarden.bench.wsgi.run", no_inprocess)
    monkeypatch.setattr("ratewarden.bench.drivers.live.require_wrk", lambda: "wrk")
    args = _args("--wsgi", "--driver", "live", "--workers", "3", "--duration", "2", "--concurrency", "20",
                 "--iterations", "4", "--out", str(tmp_path))
    assert cli.run(args) == 0
    assert seen["phases"] == ["memory"]
    assert (seen["workers"], seen["duration"], seen["concurrency"], seen["rounds"]) == (3, 2.0, 20, 4)
    md = (tmp_path / "wsgi.md").read_text()
    assert "## Live: gunicorn + wrk" in md and "gunicorn, 3 sync workers" in md and "⚠ flask-limiter" in md
    assert "In-process" not in md
    data = json.loads((tmp_path / "wsgi.json").read_text())
    assert data["rows"] == [] and data["live"][0]["admitted"] == 200 and data["live"][0]["over_limit"] is True


def test_cli_defaults_and_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(wsgi_live, "run_live", lambda phases, **kw: seen.update(kw) or [])
    monkeypatch.setattr("ratewarden.bench.drivers.live.require_wrk", lambda: "wrk")
    assert cli.run(_args("--wsgi", "--driver", "live", "--out", str(tmp_path))) == 0
    assert (seen["workers"], seen["duration"], seen["concurrency"], seen["rounds"]) == (2, 3.0, 50, 3)
    assert cli.run(_args("--wsgi", "--store", "shm", "--out", str(tmp_path))) == 2
    assert cli.run(_args("--wsgi", "--duration", "0", "--out", str(tmp_path))) == 2


@needs_live
def test_live_rows_under_gunicorn_two_workers() -> None:
    """One short round of the limited scenario, 2 sync workers per server: ratewarden on the shared
    memory store admits exactly its limit; flask-limiter's per-process memory at most 2 x the limit,
    and its row is flagged when over; the floor admits nothing; bare serves everything."""
    only = ("flask bare", "floor: fixed 429", "flask-limiter", "ratewarden.flask", "ratewarden.django")
    rows = {r.library: r for r in wsgi_live.run_live(["memory"], workers=2, duration=1.0, rounds=1, warmup=0,
                                                      concurrency=10, scenarios=["wsgi.limited"], only=only,
                                                      log=lambda _: None)}
    assert set(rows) == {"flask bare", "floor: fixed 429", "flask-limiter", "ratewarden.flask",
                         "ratewarden.django middleware"}
    assert all(r.iterations == 1 and r.requests > 0 and r.rps > 0 for r in rows.values()), \
        {k: r.note for k, r in rows.items()}
    for name in ("ratewarden.flask", "ratewarden.django middleware"):
        r = rows[name]
        assert (r.store, r.admitted, r.limit, r.over_limit, r.exact_cell) == ("shm", 100, 100, False, "yes")
        assert r.throttled > 0
    fl = rows["flask-limiter"]
    assert fl.store == "memory" and fl.limit == 100 and fl.admitted is not None
    assert 100 <= fl.admitted <= 200 and fl.over_limit == (fl.admitted > 100)
    floor, bare = rows["floor: fixed 429"], rows["flask bare"]
    assert (floor.admitted, floor.limit, floor.throttled > 0) == (0, None, True)
    assert bare.limit is None and bare.admitted is not None and bare.admitted >= bare.allowed > 0
    assert rows["ratewarden.flask"].vs_bare is not None and rows["ratewarden.django middleware"].vs_bare is None
