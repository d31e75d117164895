"""``ratewarden check`` on files it cannot use (issue 11, item 13): one clear line and a non-zero
exit, never a traceback; YAML and TOML syntax errors name their line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ratewarden.cli import main
from ratewarden.policy import PolicyError, parse_policy


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["check", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err.strip()


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", b'rate = "caf\xe9"\n'])
def test_binary_or_non_utf8_file_is_one_line(suffix: str, content: bytes, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"policy{suffix}"
    path.write_bytes(content)
    status, err = _check(path, capsys)
    assert status == 1
    assert len(err.splitlines()) == 1 and str(path) in err and "UTF-8" in err


def test_yaml_without_pyyaml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules: []\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    status, err = _check(path, capsys)
    assert status == 2
    assert len(err.splitlines()) == 1 and "PyYAML" in err and "ratewarden[policy]" in err


def test_yaml_syntax_error_is_one_line_with_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  - path: /x\n    rate: [1/s\n")
    status, err = _check(path, capsys)
    assert status == 1
    assert len(err.splitlines()) == 1
    assert f"{path}:4:" in err and "column" in err and "invalid YAML" in err


def test_yaml_error_problem_is_one_line() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy("a: b: c\n", "yaml")
    (problem,) = info.value.problems
    assert "\n" not in problem.message and problem.line == 1 and "column 5" in problem.message


def test_toml_error_at_end_of_document_names_the_line() -> None:
    text = '[[rules]]\npath = "/x"\nrate'
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "toml")
    (problem,) = info.value.problems
    assert problem.line == 3
    assert str(problem).startswith("<policy>:3: invalid TOML")


def test_toml_error_elsewhere_keeps_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[rules]]\npath = "/x"\nrate = = 3\n[[rules]]\n')
    status, err = _check(path, capsys)
    assert status == 1 and f"{path}:3: invalid TOML" in err and len(err.splitlines()) == 1
