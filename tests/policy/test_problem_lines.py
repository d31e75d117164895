"""Issue 21, item 5: each problem once, at its own line, without a doubled prefix, in file order."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratewarden.cli import main
from ratewarden.policy import PolicyError, parse_policy

_RULE = '[[rules]]\npath = "/x"\nrate = "1/s"\n'


def _problems(text: str, format: str = "toml") -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, format)
    return [str(p) for p in info.value.problems]


def test_a_misspelt_rules_table_names_its_line() -> None:
    (problem,) = _problems('version = 1\n\n[[rule]]\npath = "/x"\nrate = "1/s"\n')
    assert problem.startswith("<policy>:3: rule: unknown field (did you mean 'rules'?)")


def test_a_misspelt_rule_key_names_its_line() -> None:
    problems = _problems('[[rules]]\npath = "/x"\nrate = "1/s"\n[[rules]]\npath = "/y"\nrate = "1/s"\nalgoritm = "gcra"\n')
    assert problems == [
        "<policy>:7: rules[1].algoritm: unknown field (did you mean 'algorithm'?); expected one of: path, name, "
        "methods, rate, tiered, key, algorithm, cost, bypass, shadow, delay, charge"
    ]


def test_a_misspelt_dotted_key_names_its_line() -> None:
    problems = _problems(_RULE + 'charge.statuse = [401]\n')
    assert problems[0].startswith("<policy>:4: rules[0].charge.statuse: unknown field (did you mean 'statuses'?)")


def test_bad_bans_status_is_at_its_line_once() -> None:
    (problem,) = _problems(_RULE + '\n[bans]\nafter = 20\nstatus = 500\n')
    assert problem == "<policy>:7: bans.status: must be 403 or 429, got 500"


def test_bad_bans_status_is_reported_beside_other_bans_errors() -> None:
    problems = _problems(_RULE + '\n[bans]\nafter = "x"\nstatus = 500\ngrowth = 0.5\n')
    assert problems == [
        "<policy>:6: bans.after: expected an integer, got the string 'x'",
        "<policy>:7: bans.status: must be 403 or 429, got 500",
        "<policy>:8: bans.growth: must be 1 (constant) or more, got 0.5",
    ]


def test_bans_errors_in_yaml_are_at_their_lines() -> None:
    problems = _problems("rules:\n  - path: /x\n    rate: 1/s\nbans:\n  after: 0\n  status: 200\n", "yaml")
    assert problems == [
        "<policy>:5: bans.after: must be at least 1 rejection, got 0",
        "<policy>:6: bans.status: must be 403 or 429, got 200",
    ]


def test_delay_errors_are_at_their_field_without_a_doubled_prefix() -> None:
    (problem,) = _problems(_RULE + "delay = { burst = -1 }\n")
    assert problem == "<policy>:4: rules[0].delay.burst: must be at least 1, got -1"
    (problem,) = _problems(_RULE + 'delay = { max_wait = "1s", max_waiting = 0 }\n')
    assert problem == "<policy>:4: rules[0].delay.max_waiting: must be at least 1, got 0"


def test_problems_are_sorted_by_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        '[[rules]]\npath = "/x"\nrate = "1/s"\nalgorithm = "zz"\n'  # line 4
        '\n[bans]\nstatus = 500\n'  # line 7
        '\n[groups.free]\nlimits = "1/sx"\n'  # line 10
        '\n[settings]\nalgorithm = "nope"\n'  # line 13
    )
    lines = [int(p.split(":")[1]) for p in _problems(text)]
    assert lines == [4, 7, 10, 13]
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{path}: invalid policy (4 problem(s)):"
    assert [int(line.strip().split(":")[1]) for line in err[1:]] == [4, 7, 10, 13]
