"""``ratewarden check`` and ``ratewarden explain``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratewarden.cli import main

from .apps import EXAMPLES


@pytest.mark.parametrize("name", ["policy.toml", "policy.yaml"])
def test_check_prints_effective_rules(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLES / name)]) == 0
    out = capsys.readouterr().out
    assert "login: POST /login: 5/minute" in out and "premium: 100/second; 5000/minute" in out
    assert out.rstrip().endswith("OK")


def test_check_rejects_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[rules]]\npath = "/x"\nrate = "3/lightyear"\n')
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3: rules[0].rate: invalid rate '3/lightyear'" in err


def test_explain_shows_group_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(EXAMPLES / "policy.toml")
    assert main(["explain", policy, "--path", "/api/items", "--method", "GET", "--header", "X-API-Key: pk-alice"]) == 0
    out = capsys.readouterr().out
    assert "group premium (API key)" in out and "100/second; 5000/minute" in out and "pk-alice" not in out
    assert main(["explain", policy, "--path", "/api/items", "--query", "api_key=internal-cron"]) == 0
    assert "group internal (API key)" in capsys.readouterr().out
    assert main(["explain", policy, "--path", "/api/items"]) == 0
    assert "group anonymous (no API key), charged as ip:127.0.0.1: 2/second" in capsys.readouterr().out
    assert main(["explain", policy, "--path", "/health"]) == 0
    assert "bypassed" in capsys.readouterr().out
    assert main(["explain", policy, "--path", "/elsewhere"]) == 0
    assert "no rule matches" in capsys.readouterr().out
    assert main(["explain", policy, "--path", "/x", "--header", "nocolon"]) == 2
