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


@pytest.mark.parametrize(
    ("target", "query", "note"),
    [
        ("/login?next=/", "", "the query string 'next=/' is read as --query"),
        ("/login?next=/#top", "", "the #fragment is dropped"),
        ("http://example.com/login?next=/", "", "the scheme and host are dropped; the query string 'next=/'"),
        ("https://example.com/login", "", "alone; the scheme and host are dropped"),
        ("/login#top", "", "alone; the #fragment is dropped"),
        ("/login?", "", "the empty query string is dropped"),
        ("/login?next=/", "a=b", "the query string 'next=/' is read as --query"),
    ],
)
def test_explain_splits_the_query_off_the_path(target: str, query: str, note: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: --path "/login?next=/" said "no rule matches"; rules match the path alone."""
    policy = str(EXAMPLES / "policy.toml")
    extra = ["--query", query] if query else []
    assert main(["explain", policy, "--path", target, "--method", "POST", *extra]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    assert first.startswith(f"note: --path {target!r}: rules match the path '/login' alone") and note in first
    assert rest[0] == "POST /login: 1 rule(s)" and "login: POST /login: 5/minute" in rest[1]


def test_explain_query_in_path_reaches_the_identity(capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(EXAMPLES / "policy.toml")
    assert main(["explain", policy, "--path", "/api/items?api_key=internal-cron"]) == 0
    assert "group internal (API key)" in capsys.readouterr().out
    assert main(["explain", policy, "--path", "/api/items?x=1", "--query", "api_key=internal-cron"]) == 0
    assert "group internal (API key)" in capsys.readouterr().out


def test_explain_bare_path_has_no_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(EXAMPLES / "policy.toml"), "--path", "/login", "--method", "POST"]) == 0
    assert capsys.readouterr().out.startswith("POST /login: 1 rule(s)")


def test_explain_refuses_a_path_without_a_slash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(EXAMPLES / "policy.toml"), "--path", "login"]) == 2
    assert "--path 'login': expected a path starting with '/'" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "text"), [("p.toml", ""), ("p.yaml", ""), ("p.toml", "# nothing yet\n"),
                                            ("p.yaml", "rules: []\n"), ("p.toml", '[groups.free]\nlimits = "1/s"\n')])
def test_check_fails_on_a_policy_without_rules(name: str, text: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: an empty file passed with "0 rule(s)", "OK" and status 0."""
    path = tmp_path / name
    path.write_text(text)
    assert main(["check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "OK" not in out
    assert f"{path}: the policy has no rules, so it limits nothing (pass --allow-empty" in err


def test_check_allow_empty_accepts_it_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text("")
    assert main(["check", str(path), "--allow-empty"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("OK") and "warning: the policy has no rules" in err


def test_explain_names_a_rule_for_another_method(capsys: pytest.CaptureFixture[str]) -> None:
    """GET /login matches no rule; the POST-only login rule would, and explain says how to see it."""
    policy = str(EXAMPLES / "policy.toml")
    assert main(["explain", policy, "--path", "/login"]) == 0
    out = capsys.readouterr().out
    assert "GET /login: no rule matches (not limited)" in out
    assert "rule 'login' matches this path for POST only (try --method POST)" in out
    assert main(["explain", policy, "--path", "/login", "--method", "POST"]) == 0
    out = capsys.readouterr().out
    assert "1 rule(s)" in out and "only (try --method" not in out
