"""Fuzzing with hypothesis (issue 11): the rate parser, the policy loader (TOML and YAML text) and
the forwarding-header parsers raise only their documented exceptions, in bounded time."""

from __future__ import annotations

import contextlib
import string
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratewarden.keys import ClientIP
from ratewarden.policy import Policy, PolicyError, parse_policy
from ratewarden.rates import Rate, parse_rate, parse_rates
from tests.core.asgi import http_scope

FUZZ = settings(max_examples=300, deadline=timedelta(milliseconds=500), suppress_health_check=[HealthCheck.too_slow])

# --- rates -------------------------------------------------------------------------------------

_UNITS = ["ms", "s", "sec", "m", "min", "minute", "h", "hour", "d", "day", "w", "week", "x", "", "seconds"]
_rate_like = st.builds(
    lambda amount, sep, count, unit, burst: f"{amount}{sep}{count}{unit}{burst}",
    st.one_of(st.integers(-5, 10**30).map(str), st.text(string.digits + " .-", max_size=6)),
    st.sampled_from(["/", " per ", "per", "//", " / ", ""]),
    st.one_of(st.just(""), st.integers(0, 10**400).map(str), st.floats(allow_nan=True).map(str),
              st.text(string.digits + ".", max_size=8)),
    st.sampled_from(_UNITS),
    st.one_of(st.just(""), st.integers(-3, 10**20).map(lambda b: f" burst {b}"), st.just(" burst")),
)
_rate_text = st.one_of(_rate_like, st.text(max_size=60), st.text(string.printable, max_size=400))


@FUZZ
@given(_rate_text)
def test_rate_parser_raises_only_value_error(text: str) -> None:
    try:
        rate = parse_rate(text)
    except ValueError:
        return
    assert isinstance(rate, Rate) and rate.limit > 0 and 0 < rate.period < float("inf")
    str(rate)
    assert rate.ident


@FUZZ
@given(st.lists(_rate_like, min_size=1, max_size=4).map(lambda parts: "; ".join(parts)))
def test_rate_lists_raise_only_value_error(text: str) -> None:
    try:
        rates = parse_rates(text)
    except ValueError:
        return
    assert rates and all(isinstance(r, Rate) for r in rates)


@settings(deadline=timedelta(milliseconds=500), max_examples=20)
@given(st.integers(1_000, 50_000), st.sampled_from([" ", "\t", "1", "/", "burst "]))
def test_long_rate_strings_stay_fast(n: int, filler: str) -> None:
    with contextlib.suppress(ValueError):
        parse_rates(filler * n + "x")


# --- policy files ------------------------------------------------------------------------------

_TOML_LINES = [
    "version = 1", "[[rules]]", 'path = "/api/**"', 'rate = "10/s"', 'name = "api"', 'key = "header:X-Key"',
    'algorithm = "gcra"', "[settings]", "shadow = true", "[bans]", "after = 3", 'duration = "5m"',
    "[rules.delay]", "max_wait = 1.5", "burst = 2", 'charge = { statuses = [401, "5xx"] }', "[identity]",
    'sources = ["header:X-API-Key"]', "[groups.basic]", 'limits = ["1/s"]', "[[rules]]", 'tiers = "groups"',
    'methods = ["GET"]', "cost = 2", 'cost = "x"', "rate = 5", "rate = []", 'path = "re:("', "x = [", "= 1",
    '"quoted key" = 1', "a.b.c = 1", "[a.b]", "[[a.b]]", "k = 1979-05-27T07:32:00Z", "k = inf", "k = nan",
    'k = """multi', "k = {", "",
]
_YAML_LINES = [
    "version: 1", "rules:", "  - path: /api/**", "    rate: 10/s", "    name: api", "    key: header:X-Key",
    "    delay: {max_wait: 1.5, burst: 2}", "    charge: {statuses: [401, 5xx]}", "settings:", "  shadow: true",
    "bans:", "  after: 3", "  duration: 5m", "groups:", "  basic:", "    limits: [1/s]", "identity:",
    "  sources: [header:X-API-Key]", "  - 1", "- a", "rate: [1/s", "&a x", "*a", "!!python/object:os.system",
    "k: 2001-12-14", "k: .inf", "k: ~", "? complex", ": x", "'unterminated", "k: |", "  text", "\t- tab", "",
]


def _document(lines: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(st.sampled_from(lines), max_size=25).map("\n".join),
        st.text(max_size=200),
        st.lists(st.one_of(st.sampled_from(lines), st.text(max_size=15)), max_size=15).map("\n".join),
    )


@FUZZ
@given(_document(_TOML_LINES))
def test_toml_policy_loader_raises_only_policy_error(text: str) -> None:
    try:
        policy = parse_policy(text, "toml")
    except PolicyError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        return
    assert isinstance(policy, Policy)


@FUZZ
@given(_document(_YAML_LINES))
def test_yaml_policy_loader_raises_only_policy_error(text: str) -> None:
    try:
        policy = parse_policy(text, "yaml")
    except PolicyError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        assert all("\n" not in p.message for p in exc.problems if "YAML" in p.message)
        return
    assert isinstance(policy, Policy)


@settings(deadline=timedelta(seconds=1), max_examples=20)
@given(st.integers(100, 20_000), st.sampled_from([("toml", "a = ", "[", "]"), ("yaml", "rules: ", "[", "]"),
                                                  ("yaml", "", "- ", ""), ("toml", "", "[", "]"),
                                                  ("yaml", "rules: ", "{a: ", "}"), ("yaml", "", "? ", "")]))
def test_deeply_nested_policies_raise_policy_error(depth: int, shape: tuple[str, str, str, str]) -> None:
    fmt, head, open_, close = shape
    text = head + open_ * depth + close * depth
    with contextlib.suppress(PolicyError):
        parse_policy(text, fmt)


# --- forwarding headers ------------------------------------------------------------------------

PROXY = ClientIP(trusted_proxies=["10.0.0.0/8", "fd00::/8"])
_addresses = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]:443"),
    st.sampled_from(["10.0.0.1", "10.9.9.9", "fd00::1", "unknown", "_hidden", "", " ", '"', "[", "]:80", "::ffff:10.0.0.1"]),
    st.text(string.printable, max_size=20),
)
_latin1 = st.text(st.characters(max_codepoint=255), max_size=80)
_xff = st.one_of(st.lists(_addresses, max_size=50).map(", ".join), _latin1)
_forwarded = st.one_of(
    st.lists(
        st.builds(lambda a, extra: f'for="{a}"{extra}' if ":" in a else f"for={a}{extra}", _addresses,
                  st.sampled_from(["", ";proto=https", ";by=10.0.0.1", ";for", ";=", ";For=1.2.3.4"])),
        max_size=50,
    ).map(", ".join),
    _latin1,
)


@FUZZ
@given(st.one_of(st.none(), _xff), st.one_of(st.none(), _forwarded),
       st.sampled_from(["10.1.2.3", "fd00::2", "198.51.100.1", "not-an-ip", ""]))
def test_forwarding_header_parsers_never_raise(xff: str | None, forwarded: str | None, peer: str) -> None:
    headers = []
    if xff is not None:
        headers.append((b"x-forwarded-for", xff.encode("latin-1")))
    if forwarded is not None:
        headers.append((b"forwarded", forwarded.encode("latin-1")))
    scope = http_scope("/", headers=headers, client=(peer, 1))
    key = PROXY(scope)
    assert isinstance(key, str) and key
    if peer == "198.51.100.1":  # an untrusted peer: headers are never read
        assert key == "198.51.100.1"
