"""uvicorn's proxy headers and ``client_ip``: ``--forwarded-allow-ips='*'`` lets any client choose
its own key; the configurations the README recommends instead hold.

uvicorn applies ``ProxyHeadersMiddleware`` around the app (``--proxy-headers``, on by default,
trusting ``--forwarded-allow-ips``): on a trusted connection it replaces ``scope["client"]`` with
an address from ``X-Forwarded-For``. Trusting ``*``, it takes the leftmost entry, which the client
writes, so rotating the header rotates the key. The tests wrap the app in uvicorn's own middleware,
as the server does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.keys import ClientIP, KeyFunc, client_ip
from tests.core.asgi import request

# The README's warning moved to docs/limits.md with its section (issue 39).
README = (Path(__file__).resolve().parents[2] / "docs" / "limits.md").read_text(encoding="utf-8")
PROXY = "10.0.0.5"  # the reverse proxy in front of uvicorn (it appends the peer it saw)
CLIENT = "203.0.113.7"  # one client, sending a new forged X-Forwarded-For with every request
LIMIT = 5
REQUESTS = 15


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _limited(key: KeyFunc) -> RateLimitMiddleware:
    # gcra: no window boundary can fall between the requests and let more through
    return RateLimitMiddleware(_ok, limiter=Limiter(MemoryStore()),
                               rules=[Rule("/**", f"{LIMIT}/min", key=key, algorithm="gcra")])


def _forged(i: int) -> str:
    return f"198.51.100.{i + 1}"


Route = Callable[[int], tuple[tuple[str, int], str]]


def _direct(i: int) -> tuple[tuple[str, int], str]:
    """The client connects to uvicorn itself, with a forged header."""
    return (CLIENT, 40000 + i), _forged(i)


def _through_proxy(i: int) -> tuple[tuple[str, int], str]:
    """The client goes through the proxy, which appends the address it saw to the forged header."""
    return (PROXY, 40000 + i), f"{_forged(i)}, {CLIENT}"


async def _served(app: Any, route: Route) -> int:
    served = 0
    for i in range(REQUESTS):
        peer, forwarded = route(i)
        reply = await request(app, "/items", headers=[("x-forwarded-for", forwarded)], client=peer)
        assert reply.status in (200, 429), reply.status
        served += reply.status == 200
    return served


@pytest.mark.parametrize("route", [_direct, _through_proxy], ids=["direct", "through-proxy"])
async def test_forwarded_allow_ips_star_lets_a_rotating_header_bypass_client_ip(route: Route) -> None:
    """``uvicorn --forwarded-allow-ips='*'``: every request is served, whatever the limit."""
    app = ProxyHeadersMiddleware(_limited(client_ip), trusted_hosts="*")
    assert await _served(app, route) == REQUESTS


@pytest.mark.parametrize("route", [_direct, _through_proxy], ids=["direct", "through-proxy"])
async def test_star_defeats_trusted_proxies_too(route: Route) -> None:
    """``ClientIP(trusted_proxies=...)`` cannot help once uvicorn has rewritten the peer: it sees
    the forged address as the peer, an untrusted one."""
    app = ProxyHeadersMiddleware(_limited(ClientIP(trusted_proxies=[PROXY])), trusted_hosts="*")
    assert await _served(app, route) == REQUESTS


@pytest.mark.parametrize("route", [_direct, _through_proxy], ids=["direct", "through-proxy"])
async def test_trusted_proxies_with_uvicorn_proxy_headers_off(route: Route) -> None:
    """Recommended: ``ClientIP(trusted_proxies=[<proxy>])`` and ``uvicorn --no-proxy-headers``
    (no ProxyHeadersMiddleware): the limit holds, through the proxy or around it."""
    app = _limited(ClientIP(trusted_proxies=[PROXY]))
    assert await _served(app, route) == LIMIT


@pytest.mark.parametrize("route", [_direct, _through_proxy], ids=["direct", "through-proxy"])
async def test_uvicorn_trusting_only_the_proxy(route: Route) -> None:
    """Recommended too: ``uvicorn --forwarded-allow-ips=<proxy ip>`` and ``client_ip``."""
    app = ProxyHeadersMiddleware(_limited(client_ip), trusted_hosts=PROXY)
    assert await _served(app, route) == LIMIT


def test_readme_warns_about_forwarded_allow_ips_star() -> None:
    assert "--forwarded-allow-ips='*'" in README
    warning = README[README.index("--forwarded-allow-ips='*'") - 200:][:2500]
    for advice in ("ClientIP(trusted_proxies=", "--no-proxy-headers", "--forwarded-allow-ips=10."):
        assert advice in warning, advice
