"""Policy files: TOML and YAML load into the same policy; errors name the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratewarden.policy import PolicyError, PolicyRule, load_policy, parse_policy

from .apps import EXAMPLES, tiered_policy


def test_example_policies_load() -> None:
    toml = load_policy(EXAMPLES / "policy.toml")
    yaml = load_policy(EXAMPLES / "policy.yaml")
    assert [r.name for r in toml.rules] == [r.name for r in yaml.rules]
    assert toml.tiers is not None and yaml.tiers is not None
    assert toml.tiers.groups.keys() == yaml.tiers.groups.keys()
    assert toml.tiers.groups["internal"] is None
    assert toml.bans is not None and toml.bans.status == 403 and toml.bans.growth == 2.0
    login = next(r for r in toml.rules if r.name == "login")
    assert isinstance(login, PolicyRule) and login.charge is not None and login.charge.counts(401)
    assert not login.charge.counts(200)
    export = next(r for r in toml.rules if r.name == "export")
    assert isinstance(export, PolicyRule) and export.delay is not None and export.delay.max_wait == 1.0


def test_identity_resolves_keys_hashes_patterns() -> None:
    policy = parse_policy(tiered_policy())
    assert policy.tiers is not None
    ident = policy.tiers.identity
    assert ident.group_of("pk-premium") == "premium"
    assert ident.group_of("trial-42") == "basic"
    assert ident.group_of("who-knows") == "basic"
    scope = {"type": "http", "headers": [(b"authorization", b"Bearer sk-standard")], "client": ("1.2.3.4", 1)}
    group, key = ident.resolve(scope)
    assert group == "standard" and "sk-standard" not in key
    anon = {"type": "http", "headers": [], "client": ("1.2.3.4", 1), "query_string": b""}
    assert ident.resolve(anon) == ("anonymous", "ip:1.2.3.4")
    query = {"type": "http", "headers": [], "client": ("1.2.3.4", 1), "query_string": b"api_key=cron"}
    assert ident.resolve(query)[0] == "internal"


def _problems(text: str, fmt: str = "toml") -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, fmt, "p." + fmt)
    return [str(p) for p in info.value.problems]


def test_toml_errors_name_line_and_field() -> None:
    text = tiered_policy().replace('limits = ["5/min"]', 'limits = ["5/mn"]') + '\n[[rules]]\npath = "/x"\nrat = "1/s"\n'
    problems = _problems(text)
    line_of = {line.strip(): i for i, line in enumerate(text.splitlines(), start=1)}
    bad_rate = line_of['limits = ["5/mn"]']
    bad_field = line_of['rat = "1/s"']
    assert any(p.startswith(f"p.toml:{bad_rate}: groups.basic.limits: invalid rate '5/mn'") for p in problems), problems
    assert any(p.startswith(f"p.toml:{bad_field}: rules[2].rat: unknown field (did you mean 'rate'?)") for p in problems), problems


def test_toml_syntax_error_has_line() -> None:
    problems = _problems('version = 1\n[settings]\nshadow = tru\n')
    assert problems[0].startswith("p.toml:3: invalid TOML")


def test_yaml_errors_name_line_and_field() -> None:
    text = "version: 1\nrules:\n  - path: /a\n    rate: 1/s\n  - path: /b\n    rate: 10/fortnight\n    algorithm: nope\n"
    problems = _problems(text, "yaml")
    assert any(p.startswith("p.yaml:6: rules[1].rate: invalid rate '10/fortnight'") for p in problems), problems
    assert any(p.startswith("p.yaml:7: rules[1].algorithm: unknown algorithm 'nope'") for p in problems), problems


def test_a_misspelled_algorithm_gets_the_likely_name() -> None:
    text = "version: 1\nrules:\n  - path: /a\n    rate: 1/s\n    algorithm: sliding-window\n"
    problems = _problems(text, "yaml")
    assert any("rules[0].algorithm: unknown algorithm 'sliding-window'; did you mean 'sliding_window'?" in p
               for p in problems), problems


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ('[[rules]]\npath = "/a"\n', "each rule needs 'rate'"),
        ('[[rules]]\npath = "a"\nrate = "1/s"\n', "must start with '/'"),
        ('[[rules]]\npath = "/a"\nrate = "1/s"\n[[rules]]\npath = "/a"\nrate = "2/s"\n', "duplicate rule name"),
        ('[[rules]]\npath = "/a"\ntiered = true\n', "need an [identity] section"),
        ('[[rules]]\npath = "/a"\nrate = "1/s"\ncharge = { statuses = ["6xx"] }\n', "invalid status '6xx'"),
        ('[[rules]]\npath = "/a"\nrate = "1/s"\nkey = "cookie:x"\n', "invalid key 'cookie:x'"),
        ('[bans]\nafter = 0\n', "bans.after: must be at least 1"),
        ('[bans]\nstatus = 500\n', "must be 403 or 429"),
        ('[settings]\nshadow = "yes"\n', "expected a boolean"),
        ('version = 2\n', "unsupported version 2"),
    ],
)
def test_invalid_policies_are_rejected_clearly(snippet: str, expected: str) -> None:
    problems = _problems(snippet)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("p.toml") for p in problems)


def test_unknown_file_type(tmp_path: Path) -> None:
    path = tmp_path / "policy.ini"
    path.write_text("")
    with pytest.raises(PolicyError, match=r"unknown policy file type '\.ini'"):
        load_policy(path)


_TIERED = (
    '[identity]\nunknown_group = "free"\nanonymous_group = "free"\n[groups.free]\nlimits = "1/s"\n'
    '[[rules]]\npath = "/api/**"\ntiered = true\n[[rules]]\npath = "/b"\nrate = "1/s"\nkey = "identity"\n'
    '[bans]\nkey = "identity"\n'
)


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (_TIERED.replace("[identity]", '[settings]\nalgorithm = "bogus"\n[identity]'), "settings.algorithm: unknown algorithm"),
        (_TIERED.replace('limits = "1/s"', 'limits = "1/sx"'), "groups.free.limits: invalid rate '1/sx'"),
        (_TIERED.replace('unknown_group = "free"', 'unknown_group = "gold"'), "identity.unknown_group: unknown group 'gold'"),
    ],
)
def test_a_problem_elsewhere_is_the_only_one_reported(broken: str, expected: str) -> None:
    """Regression: a problem in [settings], [groups] or [identity] also reported every tiered rule
    and every key = "identity" as lacking the [identity] section and [groups] that are there."""
    assert parse_policy(_TIERED).tiers is not None
    problems = _problems(broken)
    assert len(problems) == 1 and expected in problems[0], problems
