"""Key functions: client IP behind (un)trusted proxies, IPv6 grouping, headers, params, compose."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.errors import ConfigurationError
from ratewarden.keys import (
    ClientIP,
    bearer_token,
    client_ip,
    compose,
    header,
    header_key,
    path_param,
    query_key,
    query_param,
    route_template,
)
from tests.core.asgi import http_scope, request
from tests.vectors.runner import FakeClock

PROXY = ClientIP(trusted_proxies=["10.0.0.0/8", "fd00::/8"])
FORWARDED_PROXY = ClientIP(trusted_proxies=["10.0.0.0/8", "fd00::/8"], forwarded_header="Forwarded")


def scope(peer: str | None = "198.51.100.1", headers: list[tuple[str, str]] | None = None, **kw: Any) -> dict[str, Any]:
    return http_scope("/", headers=headers or [], client=(peer, 1234) if peer is not None else None, **kw)


# --- client IP ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [("x-forwarded-for", "5.6.7.8")],
        [("x-forwarded-for", "5.6.7.8, 9.9.9.9")],
        [("forwarded", "for=5.6.7.8")],
        [("x-real-ip", "5.6.7.8")],
    ],
)
def test_spoofed_forwarding_headers_from_an_untrusted_peer_are_ignored(headers: list[tuple[str, str]]) -> None:
    assert client_ip(scope("198.51.100.1", headers)) == "198.51.100.1"
    assert PROXY(scope("198.51.100.1", headers)) == "198.51.100.1"


def test_forwarding_headers_from_a_trusted_proxy_are_used() -> None:
    assert PROXY(scope("10.1.2.3", [("x-forwarded-for", "5.6.7.8")])) == "5.6.7.8"
    # The chain is walked from the right: trusted hops are skipped, the first untrusted one wins,
    # so a client cannot smuggle an address by prepending it.
    chain = [("x-forwarded-for", "1.1.1.1, 5.6.7.8, 10.0.0.2")]
    assert PROXY(scope("10.1.2.3", chain)) == "5.6.7.8"
    # Every hop trusted: the leftmost entry may come from the client itself, so the peer is the key.
    assert PROXY(scope("10.1.2.3", [("x-forwarded-for", "10.9.9.9, 10.0.0.2")])) == "10.1.2.3"
    # No header at all: the proxy itself.
    assert PROXY(scope("10.1.2.3")) == "10.1.2.3"
    # IPv6 proxies and clients work the same way.
    assert PROXY(scope("fd00::1", [("x-forwarded-for", "2001:db8::5")])) == "2001:db8::/64"
    assert PROXY(scope("2001:db8::7", [("x-forwarded-for", "5.6.7.8")])) == "2001:db8::/64"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("for=5.6.7.8", "5.6.7.8"),
        ('for="5.6.7.8:4711"', "5.6.7.8"),
        ('for="[2001:db8::1]:4711"', "2001:db8::/64"),
        ("for=5.6.7.8;proto=https;by=10.0.0.1", "5.6.7.8"),
        ("for=1.1.1.1, for=5.6.7.8", "5.6.7.8"),
        ("For=5.6.7.8", "5.6.7.8"),
    ],
)
def test_rfc7239_forwarded_header(value: str, expected: str) -> None:
    assert FORWARDED_PROXY(scope("10.1.2.3", [("forwarded", value)])) == expected
    # Read only when the proxies are said to set it: by default X-Forwarded-For alone counts.
    assert PROXY(scope("10.1.2.3", [("forwarded", value)])) == "10.1.2.3"


def test_a_client_sent_forwarded_header_is_ignored_behind_an_x_forwarded_for_proxy() -> None:
    """Issue 20, defect 2: the client sends ``Forwarded: for=<anything>``, the trusted proxy (nginx,
    an ALB) passes it on and appends X-Forwarded-For. ``Forwarded`` won whenever present, so every
    request had a new identity of the client's choosing."""
    keys = {PROXY(scope("10.1.2.3", [("forwarded", f"for=7.7.7.{n}"), ("x-forwarded-for", "5.6.7.8")]))
            for n in range(10)}
    assert keys == {"5.6.7.8"}
    # And the other way round, behind proxies that set Forwarded.
    keys = {FORWARDED_PROXY(scope("10.1.2.3", [("x-forwarded-for", f"7.7.7.{n}"), ("forwarded", "for=5.6.7.8")]))
            for n in range(10)}
    assert keys == {"5.6.7.8"}


def test_every_line_of_the_forwarding_header_is_one_list() -> None:
    """Issue 20, defect 2: the client sends its own X-Forwarded-For line and the proxy adds a second
    one (HAProxy's ``option forwardfor``); only the first line, the client's, was read."""
    keys = {PROXY(scope("10.1.2.3", [("x-forwarded-for", f"7.7.7.{n}"), ("x-forwarded-for", "5.6.7.8")]))
            for n in range(10)}
    assert keys == {"5.6.7.8"}
    lines = [("forwarded", f"for=7.7.7.{n}") for n in range(3)] + [("forwarded", "for=5.6.7.8")]
    assert FORWARDED_PROXY(scope("10.1.2.3", lines)) == "5.6.7.8"
    # Trusted hops over several lines are skipped as within one line.
    assert PROXY(scope("10.1.2.3", [("x-forwarded-for", "5.6.7.8, 10.9.9.9"), ("x-forwarded-for", "10.0.0.7")])) == "5.6.7.8"


def test_the_forwarding_header_must_be_one_a_proxy_sets() -> None:
    assert ClientIP(forwarded_header="x-forwarded-for") is not None
    with pytest.raises(ConfigurationError, match="forwarded_header"):
        ClientIP(trusted_proxies=["10.0.0.0/8"], forwarded_header="X-Real-IP")


def test_garbage_forwarded_addresses_do_not_crash_and_are_marked() -> None:
    key = PROXY(scope("10.1.2.3", [("x-forwarded-for", "not-an-ip, " + "z" * 1000)]))
    assert key.startswith("invalid:") and len(key) < 100


def test_ipv6_grouped_by_prefix() -> None:
    assert client_ip(scope("2001:db8:1:2::1")) == "2001:db8:1:2::/64"
    assert client_ip(scope("2001:db8:1:2:ffff::9")) == "2001:db8:1:2::/64"
    assert client_ip(scope("2001:db8:1:3::1")) == "2001:db8:1:3::/64"
    narrow = ClientIP(ipv6_prefix=128)
    assert narrow(scope("2001:db8:1:2::1")) != narrow(scope("2001:db8:1:2::2"))
    wide = ClientIP(ipv6_prefix=48)
    assert wide(scope("2001:db8:1:2::1")) == wide(scope("2001:db8:1:3::1")) == "2001:db8:1::/48"
    with pytest.raises(ValueError, match="ipv6_prefix"):
        ClientIP(ipv6_prefix=0)
    with pytest.raises(ValueError, match="trusted proxy"):
        ClientIP(trusted_proxies=["10.0.0.0/33"])


def test_ipv4_mapped_addresses_are_normalised() -> None:
    assert client_ip(scope("::ffff:192.0.2.1")) == "192.0.2.1"
    assert client_ip(scope("::ffff:192.0.2.1")) == client_ip(scope("192.0.2.1"))
    # A mapped peer inside a trusted IPv4 range is trusted.
    assert PROXY(scope("::ffff:10.0.0.5", [("x-forwarded-for", "5.6.7.8")])) == "5.6.7.8"
    assert PROXY(scope("10.0.0.5", [("x-forwarded-for", "::ffff:5.6.7.8")])) == "5.6.7.8"


def test_alternating_peers_each_get_their_own_key() -> None:
    """The last peer's key is reused for the next request from it, never for another peer."""
    key = ClientIP()
    peers = ["198.51.100.1", "2001:db8:1:2::1", "198.51.100.1", "::ffff:192.0.2.1", "2001:db8:1:2::1", ""]
    got = [key(scope(peer)) for peer in peers]
    assert got == ["198.51.100.1", "2001:db8:1:2::/64", "198.51.100.1", "192.0.2.1", "2001:db8:1:2::/64", "unknown"]
    assert key(scope("198.51.100.2")) == "198.51.100.2"
    assert key(scope("198.51.100.2", [("x-forwarded-for", "5.6.7.8")])) == "198.51.100.2"  # not a proxy


def test_missing_or_odd_client() -> None:
    assert client_ip(scope(None)) == "unknown"
    assert client_ip({"type": "http", "client": None}) == "unknown"
    assert client_ip(scope("[2001:db8::1]")) == "2001:db8::/64"
    assert client_ip(scope("unix-socket-peer")).startswith("invalid:")


# --- other keys ---------------------------------------------------------------------------------


def test_header_key_and_fallback() -> None:
    api_key = header("X-API-Key")
    key = api_key(scope(headers=[("x-api-key", "abc")]))
    assert key == header_key("X-API-Key", "abc") == header_key("x-api-key", "abc")
    assert isinstance(key, str) and key.startswith("x-api-key:") and len(key) == len("x-api-key:") + 24
    assert api_key(scope(headers=[("x-api-key", "abd")])) != key
    # Absent: falls back to the client IP, so a missing header never means "unlimited".
    assert api_key(scope("198.51.100.9")) == "198.51.100.9"
    assert header("X-API-Key", fallback=None)(scope()) is None
    hashed = header("X-API-Key", hashed=True)(scope(headers=[("x-api-key", "secret")]))
    assert isinstance(hashed, str) and "secret" not in hashed
    # The opt-out stores the value itself.
    raw = header("X-Tenant", hashed=False)(scope(headers=[("x-tenant", "acme")]))
    assert raw == "x-tenant:acme" == header_key("X-Tenant", "acme", hashed=False)


def test_bearer_token_is_hashed() -> None:
    key = bearer_token()
    a = key(scope(headers=[("authorization", "Bearer s3cr3t-token")]))
    b = key(scope(headers=[("authorization", "bearer s3cr3t-token")]))
    c = key(scope(headers=[("authorization", "Bearer other")]))
    assert isinstance(a, str) and a.startswith("bearer:") and "s3cr3t" not in a
    assert a == b != c
    assert key(scope("198.51.100.4", [("authorization", "Basic dXNlcjpwdw==")])) == "198.51.100.4"
    assert key(scope("198.51.100.4", [("authorization", "Bearer ")])) == "198.51.100.4"


def test_query_param_key() -> None:
    key = query_param("api_key")
    assert key(scope(query=b"x=1&api_key=k1")) == query_key("api_key", "k1")
    assert key(scope(query=b"api_key=k%20two")) == query_key("api_key", "k two")
    assert "k1" not in query_key("api_key", "k1") and query_key("api_key", "k1").startswith("q.api_key:")
    raw = query_param("api_key", hashed=False)
    assert raw(scope(query=b"api_key=k%20two")) == "q.api_key:k two" == query_key("api_key", "k two", hashed=False)
    assert key(scope("198.51.100.2", query=b"other=1")) == "198.51.100.2"
    assert query_param("t", fallback=None)(scope(query=b"t=")) is None


async def test_compose_and_async_keys() -> None:
    async def tenant(s: MutableMapping[str, Any]) -> str:
        return "tenant-a"

    key = compose(client_ip, tenant, header("X-User", fallback=None))
    value = await key(scope("198.51.100.3", [("x-user", "bob")]))  # type: ignore[misc]
    assert value == f"198.51.100.3|tenant-a|{header_key('X-User', 'bob')}"
    assert await key(scope("198.51.100.3")) == "198.51.100.3|tenant-a|"  # type: ignore[misc]
    with pytest.raises(ValueError):
        compose()


# --- keys through the middleware ---------------------------------------------------------------


@pytest.fixture
def limiter() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


async def handler(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def router_app(limiter: Limiter, rules: list[Rule]) -> Starlette:
    app = Starlette(
        routes=[
            Route("/items/{item_id}", handler),
            Route("/users/{user_id}", handler),
            Route("/orgs/{org}/repos/{repo}", handler),
        ]
    )
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=rules)
    return app


async def test_spoofed_x_forwarded_for_cannot_buy_a_fresh_allowance(limiter: Limiter) -> None:
    app = router_app(limiter, [Rule("/**", "3/min", key=PROXY)])
    statuses = [
        (await request(app, "/items/1", headers=[("x-forwarded-for", f"5.6.7.{i}")], client=("198.51.100.1", 1))).status
        for i in range(5)
    ]
    assert statuses == [200, 200, 200, 429, 429]
    # Through a trusted proxy, distinct forwarded clients are distinct keys.
    statuses = [
        (await request(app, "/items/1", headers=[("x-forwarded-for", f"5.6.7.{i}")], client=("10.0.0.1", 1))).status
        for i in range(5)
    ]
    assert statuses == [200] * 5


async def test_ipv6_clients_in_one_64_share_a_limit(limiter: Limiter) -> None:
    app = router_app(limiter, [Rule("/**", "2/min")])
    clients = [("2001:db8::1", 1), ("2001:db8::ffff:2", 1), ("2001:db8::3", 1), ("2001:db8:0:1::1", 1)]
    statuses = [(await request(app, "/items/1", client=c)).status for c in clients]
    assert statuses == [200, 200, 429, 200]


async def test_route_template_key_shares_one_limit_per_template(limiter: Limiter) -> None:
    app = router_app(limiter, [Rule("/**", "2/min", key=route_template)])
    statuses = [(await request(app, p)).status for p in ["/items/1", "/items/2", "/items/3", "/users/1", "/nope"]]
    assert statuses == [200, 200, 429, 200, 404]  # unmatched: its own key, routed to a 404
    assert route_template(http_scope("/x")) == "<unmatched>"


async def test_path_param_key_resolved_before_routing(limiter: Limiter) -> None:
    app = router_app(limiter, [Rule("/orgs/**", "1/min", key=path_param("org"))])
    paths = ["/orgs/acme/repos/a", "/orgs/acme/repos/b", "/orgs/other/repos/a"]
    assert [(await request(app, p)).status for p in paths] == [200, 429, 200]


async def test_header_bearer_and_query_keys_through_middleware(limiter: Limiter) -> None:
    app = router_app(
        limiter,
        [
            Rule("/items/**", "1/min", key=header("X-API-Key")),
            Rule("/users/**", "1/min", key=bearer_token()),
            Rule("/orgs/**", "1/min", key=query_param("token")),
        ],
    )
    for path, make in [
        ("/items/1", lambda v: {"headers": [("x-api-key", v)]}),
        ("/users/1", lambda v: {"headers": [("authorization", f"Bearer {v}")]}),
        ("/orgs/a/repos/b", lambda v: {"query": f"token={v}"}),
    ]:
        got = [(await request(app, path, **make(v))).status for v in ["a", "a", "b"]]
        assert got == [200, 429, 200], path


async def test_async_key_function_and_async_callable_object(limiter: Limiter) -> None:
    async def by_user(s: MutableMapping[str, Any]) -> str:
        return dict(s["headers"]).get(b"x-user", b"anon").decode()

    class ByTenant:
        async def __call__(self, s: MutableMapping[str, Any]) -> str:
            return dict(s["headers"]).get(b"x-tenant", b"none").decode()

    app = router_app(
        limiter, [Rule("/items/**", "1/min", key=by_user), Rule("/users/**", "1/min", key=ByTenant())]
    )
    for path, name in [("/items/1", "x-user"), ("/users/1", "x-tenant")]:
        got = [(await request(app, path, headers=[(name, v)])).status for v in ["a", "a", "b"]]
        assert got == [200, 429, 200], path


async def test_key_function_returning_none_is_still_limited(limiter: Limiter) -> None:
    app = router_app(limiter, [Rule("/**", "1/min", key=header("X-Missing", fallback=None))])
    assert [(await request(app, "/items/1")).status for _ in range(2)] == [200, 429]
