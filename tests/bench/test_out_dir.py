"""``ratewarden bench --out`` is checked before the run (issue 11, item 13): a path that cannot
hold the reports fails at once with one line, instead of after minutes of measuring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ratewarden.cli import bench as bench_cli
from ratewarden.cli import main


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(opts: Any) -> list[Any]:
        raise AssertionError("the benchmark ran before --out was checked")

    monkeypatch.setattr(bench_cli, "_run_with_progress", run)


@pytest.mark.parametrize("where", ["existing file", "under a file", "unwritable"])
def test_unusable_out_fails_before_the_run(where: str, tmp_path: Path, no_run: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "results.json"
    existing.write_text("{}")
    out = {"existing file": existing, "under a file": existing / "reports", "unwritable": Path("/proc/rw-bench-out")}[where]
    assert main(["bench", "--scenario", "http.low", "--library", "bare", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratewarden bench: --out ") and str(out) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert existing.read_text() == "{}"


def test_a_writable_out_directory_is_accepted_and_left_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ratewarden.bench.services import BenchError

    ran: list[Any] = []

    def stop(opts: Any) -> list[Any]:
        ran.append(opts)
        raise BenchError("stopped by the test")

    monkeypatch.setattr(bench_cli, "_run_with_progress", stop)
    out = tmp_path / "new" / "reports"
    assert main(["bench", "--scenario", "http.low", "--library", "bare", "--out", str(out)]) == 2
    assert ran and out.is_dir() and list(out.iterdir()) == []  # the probe file is gone
