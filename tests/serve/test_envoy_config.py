"""envoyproxy/ratelimit's YAML configuration: every README example loads as it is, unknown fields and
bad values name file, line and field, and descriptors match as the Go service matches them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ratewarden.serve.descriptors import match_descriptor, wildcard_match
from ratewarden.serve.envoy_config import (
    EnvoyConfigError,
    is_envoy_config,
    load_envoy_config,
    load_envoy_configs,
    parse_envoy_config,
)

from .readme_examples import (
    ALL,
    EXAMPLE_2,
    EXAMPLE_3,
    EXAMPLE_4_FLAT,
    EXAMPLE_4_NESTED,
    EXAMPLE_5,
    EXAMPLE_6,
    EXAMPLE_7,
    EXAMPLE_9_MIDDLE,
    EXAMPLE_9_MULTIPLE,
    EXAMPLE_9_TRAILING,
    EXAMPLE_11,
)


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_readme_example_loads(name: str) -> None:
    domain = parse_envoy_config(ALL[name], f"{name}.yaml")
    assert domain.domain
    assert domain.root.children


def limit_of(text: str, *entries: tuple[str, str]) -> tuple[int, str] | None:
    found = match_descriptor(parse_envoy_config(text), entries)
    return None if found is None else (found.rate_limit.requests_per_unit, found.rate_limit.unit)


def test_example_2_nested_and_key_only() -> None:
    assert limit_of(EXAMPLE_2, ("message_type", "marketing"), ("to_number", "2061111111")) == (5, "day")
    assert limit_of(EXAMPLE_2, ("to_number", "2061111111")) == (100, "day")
    assert limit_of(EXAMPLE_2, ("message_type", "marketing")) is None  # a placeholder, no limit
    assert limit_of(EXAMPLE_2, ("message_type", "other"), ("to_number", "1")) is None


def test_example_3_value_before_key_only() -> None:
    assert limit_of(EXAMPLE_3, ("remote_address", "50.0.0.1")) == (10, "second")
    assert limit_of(EXAMPLE_3, ("remote_address", "50.0.0.5")) == (0, "second")


def test_example_4_depth_must_match() -> None:
    request = (("key", "value"), ("subkey", "subvalue"))
    assert limit_of(EXAMPLE_4_FLAT, *request) is None
    assert limit_of(EXAMPLE_4_NESTED, *request) == (300, "second")


def test_example_5_unlimited() -> None:
    found = match_descriptor(parse_envoy_config(EXAMPLE_5), [("ldap", "x")])
    assert found is not None and found.rate_limit.unlimited
    assert limit_of(EXAMPLE_5, ("azure", "x")) == (100, "minute")


def test_example_6_shadow_mode() -> None:
    config = parse_envoy_config(EXAMPLE_6)
    a = match_descriptor(config, [("service", "auth-service"), ("user", "user-a")])
    b = match_descriptor(config, [("service", "auth-service"), ("user", "user-b")])
    assert a is not None and a.rate_limit.shadow_mode and a.rate_limit.requests_per_unit == 10
    assert b is not None and not b.rate_limit.shadow_mode and b.rate_limit.requests_per_unit == 20


def test_example_7_names_and_replaces() -> None:
    config = parse_envoy_config(EXAMPLE_7)
    first = match_descriptor(config, [("key_1", "value_1"), ("user", "bkthomps")])
    second = match_descriptor(config, [("key_2", "value_2"), ("user", "bkthomps")])
    assert first is not None and first.rate_limit.name == "specific_limit"
    assert second is not None and second.rate_limit.replaces == ("specific_limit",)


def test_example_9_wildcards() -> None:
    assert limit_of(EXAMPLE_9_TRAILING, ("key1", "value1")) == (20, "minute")
    assert limit_of(EXAMPLE_9_TRAILING, ("key1", "value")) == (20, "minute")
    assert limit_of(EXAMPLE_9_TRAILING, ("key1", "valu")) is None


def test_a_star_before_the_end_is_literal_as_in_the_pinned_reference() -> None:
    """The reference at ``REFERENCE_VERSION`` (src/config/config_impl.go) makes a wildcard of a
    ``key_value`` ending in ``*`` only, matched as a prefix (``strings.HasPrefix``, one ``*`` trimmed):
    a ``*`` before the end is literal (the README's later "middle" and "multiple" forms, and the
    fixture wildcard.yaml's ``midWild: bar*b``, match only themselves)."""
    assert limit_of(EXAMPLE_9_MIDDLE, ("path", "/api/123/action")) is None
    assert limit_of(EXAMPLE_9_MIDDLE, ("path", "/api/*/action")) == (20, "minute")
    assert limit_of(EXAMPLE_9_MULTIPLE, ("route", "/api/v1/resource/123/action")) is None
    assert limit_of(EXAMPLE_9_MULTIPLE, ("route", "/api/*/resource/*/action")) == (20, "minute")
    mid_and_end = "domain: d\ndescriptors:\n  - {key: k, value: 'a*b*', rate_limit: {unit: second, requests_per_unit: 1}}\n"
    assert limit_of(mid_and_end, ("k", "a*bc")) == (1, "second")  # the prefix 'k_a*b', its '*' literal
    assert limit_of(mid_and_end, ("k", "axbc")) is None
    key_only = "domain: d\ndescriptors:\n  - {key: 'ab*', rate_limit: {unit: second, requests_per_unit: 1}}\n"
    assert limit_of(key_only, ("abc", "v")) == (1, "second")  # a key ending in '*' is a wildcard too


def test_example_11_share_threshold_pattern() -> None:
    config = parse_envoy_config(EXAMPLE_11)
    shared = match_descriptor(config, [("files", "files/a.pdf")])
    apart = match_descriptor(config, [("files_no_share", "files_no_share/a.pdf")])
    assert shared is not None and shared.shared == {0: "files/*"}
    assert apart is not None and apart.shared == {}


def test_wildcard_match_as_go() -> None:
    assert wildcard_match(["a_b", ""], "a_bcd")
    assert wildcard_match(["a_", "x", "y"], "a_1x2y")
    assert not wildcard_match(["a_", "x", "y"], "a_1y2x")
    assert not wildcard_match(["a_xy", "xy"], "a_xy")  # the fixed parts may not overlap
    assert wildcard_match(["a_b"], "a_b") and not wildcard_match(["a_b"], "a_bc")


def test_exact_value_wins_over_wildcard_and_first_wildcard_wins() -> None:
    config = parse_envoy_config(
        "domain: d\n"
        "descriptors:\n"
        "  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n"
        "  - {key: k, value: 'ab*', rate_limit: {unit: second, requests_per_unit: 2}}\n"
        "  - {key: k, value: 'a*', rate_limit: {unit: second, requests_per_unit: 3}}\n"
        "  - {key: k, value: abc, rate_limit: {unit: second, requests_per_unit: 4}}\n"
    )

    def rpu(value: str) -> int:
        found = match_descriptor(config, [("k", value)])
        assert found is not None
        return found.rate_limit.requests_per_unit

    assert (rpu("abc"), rpu("abd"), rpu("axe"), rpu("zzz")) == (4, 2, 3, 1)


def test_ratewarden_algorithm_per_descriptor_and_per_domain() -> None:
    config = parse_envoy_config(
        "domain: d\n"
        "algorithm: sliding_window\n"
        "descriptors:\n"
        "  - key: a\n"
        "    algorithm: gcra\n"
        "    rate_limit: {unit: minute, requests_per_unit: 5}\n"
        "  - key: b\n"
        "    rate_limit: {unit: week, requests_per_unit: 5}\n"
    )
    a = match_descriptor(config, [("a", "1")])
    b = match_descriptor(config, [("b", "1")])
    assert a is not None and a.rate_limit.algorithm == "gcra" and a.rate_limit.limit is not None
    assert a.rate_limit.limit.algorithm == "gcra" and a.rate_limit.limit.period == 60
    assert b is not None and b.rate_limit.algorithm == "sliding_window" and b.rate_limit.period == 604800


@pytest.mark.parametrize(
    ("text", "line", "field", "says"),
    [
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limt:\n      unit: second\n", 4, "descriptors[0].rate_limt",
         "unknown field 'rate_limt' (did you mean 'rate_limit'?)"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 1\n", 6,
         "descriptors[0].rate_limit.request_per_unit", "unknown field 'request_per_unit'"),
        ("domain: d\nversion: 2\ndescriptors: []\n", 2, "version", "unknown field 'version'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", 5,
         "descriptors[0].rate_limit.unit", "invalid rate limit unit 'fortnight'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6,
         "descriptors[0].rate_limit.requests_per_unit", "expected a whole number"),
        ("domain: d\ndescriptors:\n  - key: a\n    algorithm: leaky\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
         4, "descriptors[0].algorithm", "unknown algorithm 'leaky'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", 4,
         "descriptors[0].rate_limit.unit", "should not specify rate limit unit when unlimited"),
        ("domain: d\ndescriptors:\n  - value: a\n", 3, "descriptors[0].key", "descriptor has empty key"),
        ("domain: d\ndescriptors:\n  - key: a\n  - key: a\n", 4, "descriptors[1]", "duplicate descriptor composite key 'd.a'"),
        ("domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", 5,
         "descriptors[0].share_threshold", "share_threshold can only be used with wildcard values"),
        ("domain: d\ndescriptors:\n  - key: a\n    value: b*c\n    share_threshold: true\n", 5,
         "descriptors[0].share_threshold", "wildcard values (ending with '*'), but found key 'a_b*c'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n"
         "      replaces:\n        - name: x\n", 9, "descriptors[0].rate_limit.replaces[0]", "replaces should not contain name"),
        ("descriptors: []\n", 1, "domain", "config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", 4, "descriptors[0].shadow_mode", "expected true or false"),
    ],
)
def test_problems_name_file_line_and_field(text: str, line: int, field: str, says: str) -> None:
    with pytest.raises(EnvoyConfigError) as raised:
        parse_envoy_config(text, "limits.yaml")
    message = str(raised.value)
    assert f"limits.yaml:{line}: {field}: " in message, message
    assert says in message, message


def test_every_problem_is_reported_at_once() -> None:
    text = "domain: d\ndescriptors:\n  - key: a\n    colour: red\n  - key: b\n    rate_limit: {unit: eon}\n"
    with pytest.raises(EnvoyConfigError) as raised:
        parse_envoy_config(text, "x.yaml")
    assert [p.line for p in raised.value.problems] == [4, 6]


def test_bad_yaml_names_its_line() -> None:
    with pytest.raises(EnvoyConfigError, match=r"x\.yaml:3: not valid YAML: mapping values are not allowed here"):
        parse_envoy_config("domain: d\ndescriptors:\n  - key: a: b\n", "x.yaml")


def test_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(EXAMPLE_2)
    (tmp_path / "b.yml").write_text(EXAMPLE_3)
    (tmp_path / "notes.txt").write_text("not a config")
    domains = load_envoy_configs([tmp_path])
    assert sorted(domains) == ["edge_proxy_per_ip", "messaging"]
    assert load_envoy_config(tmp_path / "a.yaml").source == str(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text(EXAMPLE_2)
    with pytest.raises(EnvoyConfigError, match="duplicate domain 'messaging'"):
        load_envoy_configs([tmp_path])
    with pytest.raises(EnvoyConfigError, match="cannot read the file"):
        load_envoy_config(tmp_path / "missing.yaml")


def test_is_envoy_config() -> None:
    assert is_envoy_config({"domain": "x", "descriptors": []})
    assert not is_envoy_config({"rules": []})
    assert not is_envoy_config(["domain"])


def test_importing_the_service_imports_neither_yaml_nor_grpc() -> None:
    code = (
        "import sys, ratewarden, ratewarden.serve.rls, ratewarden.serve.envoy_config, ratewarden.serve.descriptors\n"
        "loaded = sorted(m for m in ('yaml', 'grpc', 'google.protobuf') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
