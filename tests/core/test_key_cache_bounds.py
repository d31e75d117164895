"""The key functions' caches are bounded in bytes, not only in entries.

Regression: behind a trusted proxy, 64 KB ``Forwarded`` / ``X-Forwarded-For`` values were cached
whole (up to 10,000 of them per cache), and the worker grew to 663 MB. Every request here is one
a client can send through a trusted proxy; after thousands of them the caches must hold a bounded
number of bytes and the client identity of normal requests must still be right.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratewarden import keys
from ratewarden.keys import MAX_FORWARDED_HOPS, ClientIP, path_param
from tests.core.asgi import http_scope

PEER = "10.1.2.3"  # a trusted proxy
BIG = 64 * 1024
REQUESTS = 4096
LONGEST_ADDRESS = 64  # an IPv6 address with an IPv4 tail and a zone id, with room to spare
# What a full cache may hold: every entry's key at most LONGEST_ADDRESS characters and its value
# at most "invalid:" plus as many (the bound the fix gives); far below one 64 KB entry per request.
ENTRY_BYTES = sys.getsizeof("x" * LONGEST_ADDRESS) + sys.getsizeof("invalid:" + "x" * LONGEST_ADDRESS)
CACHE_BYTES = 2 * keys._CACHE_LIMIT * ENTRY_BYTES


def _proxy(header: str) -> ClientIP:
    return ClientIP(trusted_proxies=["10.0.0.0/8", "fd00::/8"], forwarded_header=header)


def _scope(name: str, *values: str, peer: str = PEER) -> dict[str, Any]:
    return http_scope("/", headers=[(name, v) for v in values], client=(peer, 1))


def _cached_bytes(key: ClientIP) -> int:
    caches: list[dict[str, Any]] = [key._norm_cache, key._trust_cache]
    return sum(sys.getsizeof(k) + sys.getsizeof(v) for cache in caches for k, v in cache.items())


def _pad(i: int, tail: str, piece: Callable[[int], str]) -> str:
    """A header value of BIG characters: distinct ``piece``s (request ``i``), then ``tail``."""
    out: list[str] = []
    size = len(tail)
    n = 0
    while size < BIG:
        out.append(piece(i * 100_000 + n))
        size += len(out[-1])
        n += 1
    return "".join(out)[: BIG - len(tail)] + tail


def _ip(n: int) -> str:
    return f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"


def _xff_values() -> Iterator[str]:
    """Four shapes of 64 KB X-Forwarded-For values, distinct per request."""
    for i in range(REQUESTS):
        shape = i % 4
        if shape == 0:  # one huge entry
            yield f"{i}-" + "z" * (BIG - 8)
        elif shape == 1:  # thousands of distinct trusted hops
            yield _pad(i, "10.0.0.1", lambda n: _ip(n) + ", ")
        elif shape == 2:  # entries of 1,000 characters each
            yield _pad(i, "", lambda n: f"{n:08d}" + "y" * 990 + ", ")
        else:  # garbage, then a huge rightmost entry
            yield "1.1.1.1, " + f"{i}:" + "f" * (BIG - 20)


def _forwarded_values() -> Iterator[str]:
    """Four shapes of 64 KB Forwarded values, distinct per request."""
    for i in range(REQUESTS):
        shape = i % 4
        if shape == 0:  # one huge for= value
            yield f'for="{i}' + "z" * (BIG - 16) + '"'
        elif shape == 1:  # one element with thousands of for= pairs
            yield _pad(i, "for=10.0.0.1", lambda n: f"for={_ip(n)};")
        elif shape == 2:  # thousands of trusted elements
            yield _pad(i, "for=10.0.0.1", lambda n: f"for={_ip(n)}, ")
        else:  # bracketed garbage without its closing bracket
            yield f"for=[{i}" + ":" * (BIG - 12)


@pytest.mark.parametrize(
    ("header", "name", "values"),
    [("X-Forwarded-For", "x-forwarded-for", _xff_values), ("Forwarded", "forwarded", _forwarded_values)],
)
def test_thousands_of_64kb_forwarding_headers_leave_the_caches_bounded(
    header: str, name: str, values: Callable[[], Iterator[str]]
) -> None:
    key = _proxy(header)
    for n, value in enumerate(values()):
        assert len(value) >= BIG - 16
        got = key(_scope(name, value))
        assert isinstance(got, str) and len(got) <= len("invalid:") + LONGEST_ADDRESS
        # Checked as it goes: before the fix each request added up to 128 KB, so it fails early.
        assert _cached_bytes(key) <= CACHE_BYTES, f"after {n + 1} requests"
    assert all(len(k) <= LONGEST_ADDRESS for k in (*key._norm_cache, *key._trust_cache))
    # Normal requests are still keyed right, cached or not.
    forwarded = header == "Forwarded"
    for _ in range(2):
        if forwarded:
            assert key(_scope(name, "for=5.6.7.8")) == "5.6.7.8"
            assert key(_scope(name, 'for="[2001:db8::1]:4711", for=10.0.0.2')) == "2001:db8::/64"
            assert key(_scope(name, "for=10.9.9.9, for=10.0.0.2")) == PEER
        else:
            assert key(_scope(name, "5.6.7.8")) == "5.6.7.8"
            assert key(_scope(name, "1.1.1.1, 2001:db8::5, 10.0.0.2")) == "2001:db8::/64"
            assert key(_scope(name, "10.9.9.9, 10.0.0.2")) == PEER
        assert key(_scope(name, peer="198.51.100.1")) == "198.51.100.1"
        assert key(_scope(name, peer="fd00::7")) == "fd00::/64"


def test_a_huge_client_written_prefix_does_not_hide_the_proxy_written_hops() -> None:
    """The client may write any amount to the left; what the trusted proxies appended is read."""
    xff, fwd = _proxy("X-Forwarded-For"), _proxy("Forwarded")
    junk = "9.9.9.9, " * (BIG // 9)
    assert xff(_scope("x-forwarded-for", junk + "5.6.7.8, 10.0.0.2")) == "5.6.7.8"
    assert xff(_scope("x-forwarded-for", junk, "5.6.7.8", "10.0.0.2")) == "5.6.7.8"  # separate lines
    assert xff(_scope("x-forwarded-for", "x" * BIG + ", 5.6.7.8")) == "5.6.7.8"
    assert fwd(_scope("forwarded", "for=9.9.9.9, " * (BIG // 13) + "for=5.6.7.8;proto=https")) == "5.6.7.8"
    assert fwd(_scope("forwarded", "for=9.9.9.9;" * (BIG // 12), "for=5.6.7.8")) == "5.6.7.8"
    # MAX_FORWARDED_HOPS still decides how far the walk goes.
    trusted = ", ".join(["10.0.0.1"] * MAX_FORWARDED_HOPS)
    assert xff(_scope("x-forwarded-for", junk + "5.6.7.8, " + trusted)) == PEER


def test_one_forwarded_element_yields_one_address() -> None:
    """RFC 7239 allows one ``for`` per element: a repeated one is not a hop of its own, so one
    element cannot make the walk examine (and cache) thousands of addresses."""
    key = _proxy("Forwarded")
    element = ";".join(f"for={_ip(n)}" for n in range(5000))
    assert key(_scope("forwarded", element)) == PEER  # all trusted: the peer
    assert len(key._trust_cache) <= 1 + MAX_FORWARDED_HOPS
    assert key(_scope("forwarded", "for=5.6.7.8;for=10.0.0.9")) == "5.6.7.8"


def test_overlong_addresses_are_invalid_and_never_cached() -> None:
    key = _proxy("X-Forwarded-For")
    long_address = "2001:db8::1%" + "e" * 100
    assert key.normalize(long_address) == "invalid:" + long_address[:64]
    assert not key._is_trusted("10.0.0.1" + " " * 100)
    assert long_address not in key._norm_cache and not any(len(k) > LONGEST_ADDRESS for k in key._trust_cache)
    # The longest real forms are still addresses.
    assert key.normalize("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255") == "ffff:ffff:ffff:ffff::/64"
    assert key.normalize("[fe80::1%eth0]") == "fe80::/64"


def _routes_app() -> Starlette:
    async def item(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/items/{item_id}", item)])


def test_the_route_cache_does_not_keep_64kb_paths() -> None:
    """Middleware resolves path parameters itself, caching per path: a client choosing the path
    must not fill that cache with 64 KB entries."""
    app = _routes_app()
    key = path_param("item_id", fallback=None)
    keys._ROUTE_CACHE.clear()
    limit = keys._CACHE_LIMIT * 2 * sys.getsizeof("x" * 1024)  # path and parameters of 1 KB each

    def cached_bytes() -> int:
        return sum(sys.getsizeof(p) + sum(sys.getsizeof(v) for v in params.values())
                   for (_, _, p), (_, _, params) in keys._ROUTE_CACHE.items())

    for i in range(REQUESTS // 4):
        value = f"{i}-" + "x" * BIG
        scope = http_scope("/items/" + value)
        scope["app"] = app
        assert key(scope) == f"p.item_id:{value}"  # still resolved, only not kept
        assert cached_bytes() <= limit, f"after {i + 1} requests"
    scope = http_scope("/items/42")
    scope["app"] = app
    assert key(scope) == "p.item_id:42"
    assert key(scope) == "p.item_id:42"
    keys._ROUTE_CACHE.clear()
