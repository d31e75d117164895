"""Smoke run of every library on a tiny in-process scenario, and the files it writes."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from ratewarden.bench import rlflx
from ratewarden.bench.adapters import LIBRARIES
from ratewarden.bench.reports import write_all
from ratewarden.bench.reports.html_report import bar_chart
from ratewarden.bench.reports.meta import collect_meta
from ratewarden.bench.runner import Options, run_all
from ratewarden.bench.scenarios import SCENARIOS
from ratewarden.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("bench")
    libs = [name for name in LIBRARIES if not rlflx.is_peer(name)]  # the Node rows run live only (test_rlflx)
    opts = Options(scenarios=[SCENARIOS["http.low"], SCENARIOS["mw.selective"], SCENARIOS["ws.low"]],
                   libraries=libs, iterations=2, warmup=0)
    results = run_all(opts)
    write_all(out, results, collect_meta("test", {"Method": "smoke"}))
    return out, libs


def test_every_file_is_written(report: tuple[Path, list[str]]) -> None:
    out, _ = report
    for name in ("results.json", "summary.csv", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "runs").glob("*.json"))


def test_csv_has_one_row_per_library_and_scenario(report: tuple[Path, list[str]]) -> None:
    out, libs = report
    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["library"], r["scenario"]) for r in rows}
    for lib in libs:
        assert (lib, "http.low") in got and (lib, "mw.selective") in got
    assert ("ratewarden", "ws.low") in got and ("slowapi", "ws.low") not in got
    sel = next(r for r in rows if r["library"] == "ratewarden" and r["scenario"] == "mw.selective")
    assert (sel["allowed"], sel["throttled"], sel["correct"]) == ("150", "50", "True")
    assert len(sel["rps_runs"].split(";")) == 2


def test_json_keeps_every_run_and_the_skips(report: tuple[Path, list[str]]) -> None:
    out, _ = report
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["command"] == "test"
    skipped = [r for r in data["results"] if r["skipped"]]
    assert any(r["library"] == "slowapi" and "WebSocket" in r["skipped"] for r in skipped)
    measured = [r for r in data["results"] if r["summary"]]
    assert all(len(r["runs"]) == 2 for r in measured)


def test_markdown_and_html_contain_every_row(report: tuple[Path, list[str]]) -> None:
    out, libs = report
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for lib in libs:
        assert f"{lib} req/s" in md
        assert lib in html
    assert "Selective throttling (mixed paths)" in md and "Low load (50 req, within limit)" in html
    assert "<svg" in html and "<script" not in html and "http://" not in html.split("<body>")[1].replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


def test_bar_chart_scales_bars_to_the_largest_value() -> None:
    svg = bar_chart("t", ["a"], {"x": [50.0], "y": [100.0], "z": [None]}, "req/s")
    assert svg.count("<rect") == 5  # 3 legend swatches + 2 bars
    assert "n/a" in svg


def test_bad_input_gets_a_message_and_a_nonzero_exit(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert main(["bench", "--scenario", "nope"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
    assert main(["bench", "--library", "ratewarden,bogus"]) == 2
    assert "unknown library 'bogus'" in capsys.readouterr().err
    assert main(["bench", "--store", "redis-clustre"]) == 2
    assert "unknown store 'redis-clustre'; choose from memory, shm, redis, redis-cluster, memcached" in capsys.readouterr().err
    assert main(["bench", "--scenario", "http.low", "--store", "redis-cluster", "--redis-cluster-url",
                 "redis+cluster://127.0.0.1:1", "--out", str(tmp_path)]) == 2
    assert "redis-cluster store at redis+cluster://127.0.0.1:1 does not answer" in capsys.readouterr().err
    assert main(["bench", "--scenario", "http.low", "--store", "redis", "--redis-url", "redis://127.0.0.1:1/0",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not answer" in err and "Traceback" not in err
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["bench", "--scenario", "live.light"]) == 2
    assert "wrk" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_live_run_counts_statuses_and_samples_the_server(tmp_path: Path) -> None:
    opts = Options(scenarios=[SCENARIOS["live.light"]], libraries=["ratewarden", "bare"], iterations=1, warmup=0,
                   duration=1.0, concurrency=[10])
    results = run_all(opts)
    rows = {r.row.library: r.row for r in results if r.row}
    rw, bare = rows["ratewarden"], rows["bare"]
    assert rw.allowed == 100 and rw.throttled == rw.requests - 100
    assert bare.throttled == 0 and bare.allowed == bare.requests > 0
    assert rw.cpu_pct is not None and rw.cpu_pct > 0 and rw.rss_mb is not None and rw.rss_mb > 10
    assert rw.vs_bare is not None and rw.vs_bare > 0


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # no command: usage on stderr, as argparse tools do
    err = capsys.readouterr().err
    assert "bench" in err and "demo" in err


def test_in_process_libraries_run_interleaved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round runs every library once, starting with the next one: a burst of load from
    elsewhere spreads over the libraries instead of landing on one row."""
    from ratewarden.bench.drivers import inprocess

    order: list[str] = []
    real = inprocess.run_iteration

    async def recording(app: object, sc: object, concurrency: int | None = None) -> object:
        order.append(next(lib for lib, built in apps.items() if built is app))
        return await real(app, sc, concurrency)  # type: ignore[arg-type]

    apps: dict[str, object] = {}
    from ratewarden.bench import adapters

    loaders = {lib: adapters.load(lib) for lib in ("ratewarden", "bare")}

    def load(lib: str) -> object:
        cls = loaders[lib]

        class Recorded(cls):  # type: ignore[misc, valid-type]
            def build(self) -> object:
                apps[lib] = app = super().build()
                return app

        return Recorded

    monkeypatch.setattr("ratewarden.bench.runner.load", load)
    monkeypatch.setattr(inprocess, "run_iteration", recording)
    opts = Options(scenarios=[SCENARIOS["mw.low"]], libraries=["ratewarden", "bare"], iterations=3, warmup=1)
    results = run_all(opts)
    assert order == ["ratewarden", "bare", "bare", "ratewarden", "ratewarden", "bare", "bare", "ratewarden"]
    assert [len(r.runs) for r in results] == [3, 3]
    assert all(r.row is not None and r.row.correct for r in results)


@pytest.mark.parametrize(("into_window", "slept"), [(58.5, 1.55), (10.0, None), (57.5, 2.55), (56.9, None)])
def test_a_live_run_never_straddles_a_window_edge(
    monkeypatch: pytest.MonkeyPatch, into_window: float, slept: float | None
) -> None:
    """A fixed window restarts at each epoch-aligned edge: a run crossing one would allow a second
    ``limit``, so the runner waits for the next window when the run (plus 2 s) would not fit."""
    from ratewarden.bench import runner

    sleeps: list[float] = []
    monkeypatch.setattr(runner.time, "time", lambda: 1_000_020.0 + into_window)  # 1_000_020 = 60 * 16_667
    monkeypatch.setattr(runner.time, "sleep", sleeps.append)
    runner._clear_of_window_edge(60, 1.0)
    assert sleeps == ([] if slept is None else [pytest.approx(slept)])
