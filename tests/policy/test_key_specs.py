"""The key-spec language (``ip``, ``identity``, ``header:<Name>``, ``bearer``, ``query:<name>``):
one parser for rule keys, ban keys and identity sources, and the same credential read by each."""

from __future__ import annotations

from typing import Any

import pytest

from ratewarden.keys import bearer_token, client_ip, header, header_key, query_key, query_param
from ratewarden.policy import Identity, PolicyError, parse_policy
from ratewarden.policy.keyspec import key_function, parse_key_spec, parse_source


def _scope(headers: list[tuple[bytes, bytes]] = (), query: bytes = b"") -> dict[str, Any]:  # type: ignore[assignment]
    return {"type": "http", "headers": list(headers), "query_string": query, "client": ("10.1.2.3", 5)}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("ip", ("ip", "")), (" Header : X-Key ", ("header", "X-Key")), ("BEARER", ("bearer", "")), ("query:k", ("query", "k"))],
)
def test_specs_parse_to_kind_and_argument(spec: str, expected: tuple[str, str]) -> None:
    assert parse_key_spec(spec) == expected


@pytest.mark.parametrize("spec", ["cookie:x", "header", "header:", "bearer:x", "ip:1", "query"])
def test_bad_rule_keys_and_sources_are_refused_with_the_allowed_forms(spec: str) -> None:
    with pytest.raises(ValueError, match=r"invalid key .*use 'ip', 'identity', 'header:<Name>', 'bearer' or 'query:<name>'"):
        key_function(spec, None)
    with pytest.raises(ValueError, match=r"invalid key source .*use 'header:<Name>', 'bearer' or 'query:<name>'$"):
        parse_source(spec)


def test_ip_and_identity_are_rule_keys_not_sources() -> None:
    for spec in ("ip", "identity"):
        with pytest.raises(ValueError, match="invalid key source"):
            parse_source(spec)
    with pytest.raises(ValueError, match=r"needs an \[identity\] section"):
        key_function("identity", None)


def test_a_spec_means_the_same_key_function_in_rules_and_bans() -> None:
    policy = parse_policy(
        '[[rules]]\npath = "/a"\nrate = "1/s"\nkey = "header:X-Client"\n'
        '[bans]\nkey = "query:client"\n'
    )
    scope = _scope([(b"x-client", b"c1")], b"client=c2")
    assert policy.rules[0].key(scope) == header("X-Client")(scope) == header_key("X-Client", "c1")
    assert policy.bans is not None and policy.bans.key(scope) == query_param("client")(scope) == query_key("client", "c2")
    with pytest.raises(PolicyError, match="invalid key 'cookie:x'"):
        parse_policy('[bans]\nkey = "cookie:x"\n')


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", b"Bearer tok")],
        [(b"authorization", b"Basic dXNlcg=="), (b"authorization", b"Bearer tok")],
        [(b"authorization", b"Bearer   ")],
        [],
    ],
)
def test_identity_and_bearer_key_read_the_same_token(headers: list[tuple[bytes, bytes]]) -> None:
    """Regression: the identity looked through every Authorization header while the ``bearer``
    key read only the first, so one request could be charged per IP yet tiered as a known key."""
    identity = Identity(["bearer"], keys={"tok": "gold"}, unknown_group="free", anonymous_group="anon")
    scope = _scope(headers)
    token_keyed = bearer_token()(scope) != client_ip(scope)
    assert (identity.api_key(scope) is not None) == token_keyed
    assert identity.group(_scope(headers)) == ("gold" if token_keyed else "anon")


def test_identity_sources_strip_and_skip_empty_values() -> None:
    identity = Identity(["header:X-Key", "query:key"], keys={"k": "gold"}, unknown_group="free", anonymous_group="anon")
    assert identity.api_key(_scope([(b"x-key", b"  k  ")])) == "k"
    assert identity.api_key(_scope([(b"x-key", b"   ")], b"key=&key=q")) == "q"
    assert identity.api_key(_scope()) is None
