"""Issue 19, "exact under a flood": one uvicorn worker, 1,000 keep-alive connections from one client
(wrk), ``100/hour`` per client IP. The handler's own count (``/__count``) must be exactly the limit on
every store and integration path, and a store outage mid-flood must neither answer 5xx nor admit more
than the limit from the store plus the limit from the local insurance limiter.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from urllib.parse import unquote

import pytest

from tests.flood.load import AppServer, Flood, app_server, clear_of_window_edge, flood, raise_fd_limit
from tests.servers import HOST, Server, have, redis_cmd

LIMIT = 100
RATE = f"{LIMIT}/hour"
CONNECTIONS = 1000
SECONDS = 3.0

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("redis_standalone", marks=pytest.mark.redis, id="redis"),
    pytest.param("redis_sentinel", marks=pytest.mark.redis, id="sentinel"),
    pytest.param("redis_cluster", marks=pytest.mark.cluster, id="cluster"),
    pytest.param("memcached_server", marks=pytest.mark.memcached, id="memcached"),
]
REMOTE = [p for p in STORES if p.id != "memory"]


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    if not have("wrk"):
        pytest.fail("wrk is not installed: run scripts/install-system-deps.sh (make setup does)")
    raise_fd_limit()


def _store_url(request: pytest.FixtureRequest, fixture: str) -> str:
    if fixture == "memory":
        return "memory://"
    url: str = request.getfixturevalue(fixture).url
    return url


def _prefix() -> str:
    return f"flood{uuid.uuid4().hex[:10]}"


def _describe(result: Flood) -> str:
    return (f"admitted {result.admitted} of {LIMIT}; server statuses {result.statuses}; client "
            f"{result.load.statuses} errors {result.load.errors} at {result.load.rate:.0f} req/s; "
            f"without store {result.without_store}")


@pytest.mark.parametrize("path", ["middleware", "edge"])
@pytest.mark.parametrize("store", STORES)
def test_flood_admits_exactly_the_limit(request: pytest.FixtureRequest, store: str, path: str) -> None:
    url = _store_url(request, store)
    clear_of_window_edge(3600, SECONDS + 15)
    with app_server(url, path, RATE, _prefix()) as app:
        result = flood(app, CONNECTIONS, SECONDS)
    assert result.admitted == LIMIT, _describe(result)
    assert set(result.statuses) == {200, 429}, _describe(result)
    assert result.load.statuses.get(200, 0) <= LIMIT, _describe(result)


@pytest.mark.parametrize("path", ["dependency", "decorator"])
@pytest.mark.parametrize("store", [p for p in REMOTE if p.id in ("redis", "memcached")])
def test_flood_admits_exactly_the_limit_on_every_integration(request: pytest.FixtureRequest, store: str, path: str) -> None:
    """The plain FastAPI dependency (no ``install``) and the Starlette decorator, on the remote stores."""
    test_flood_admits_exactly_the_limit(request, store, path)


# The outage: the store is SIGSTOPped mid-flood (sockets open, nothing answered) for OUTAGE seconds.

BEFORE, OUTAGE, AFTER = 1.0, 2.0, 2.0


def _outage(server: Server) -> None:
    time.sleep(BEFORE)
    with server.paused():
        time.sleep(OUTAGE)


def _redis_count(port: int, prefix: str, route: str) -> int:
    """What the store itself counted for ``route`` (fixed window state ``"start count"``), via redis-cli."""
    keys = [k for k in redis_cmd(port, "--scan", "--pattern", f"{prefix}:*").split() if f"{route}|" in k]
    assert len(keys) == 1, keys
    return int(float(redis_cmd(port, "GET", keys[0]).split()[1]))


def _memcached_ask(port: int, command: bytes, end: bytes) -> bytes:
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(command)
        data = b""
        while not data.endswith(end):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _memcached_count(port: int, prefix: str, route: str) -> int:
    """What memcached itself holds for ``route`` (fixed window state ``"start,count"``), found with
    ``lru_crawler metadump`` (the middleware's keys are plain ASCII, stored unhashed)."""
    dump = _memcached_ask(port, b"lru_crawler metadump all\r\n", b"END\r\n").decode()
    keys = [line.split()[0].removeprefix("key=") for line in dump.splitlines() if line.startswith("key=")]
    ours = [unquote(k) for k in keys if unquote(k).startswith(f"{prefix}:") and f"{route}|" in unquote(k)]
    assert len(ours) == 1, ours
    reply = _memcached_ask(port, f"get {ours[0]}\r\n".encode(), b"END\r\n").decode()
    return int(float(reply.splitlines()[1].split(",")[1]))


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("memcached", marks=pytest.mark.memcached)])
def outage_store(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Server]]:
    """(kind, URL, server process) of the store to pause."""
    if request.param == "redis":
        redis = request.getfixturevalue("redis_standalone")
        yield "redis", redis.url, redis.server
    else:
        memcached = request.getfixturevalue("memcached_server")
        yield "memcached", memcached.url, memcached.server


def test_store_outage_mid_flood(outage_store: tuple[str, str, Server]) -> None:
    kind, url, server = outage_store
    prefix = _prefix()
    clear_of_window_edge(3600, BEFORE + OUTAGE + AFTER + SECONDS + 20)
    app: AppServer
    with app_server(url, "middleware", RATE, prefix) as app:
        first = flood(app, CONNECTIONS, BEFORE + OUTAGE + AFTER, "/a", during=lambda: _outage(server))
        time.sleep(1.0)
        second = flood(app, CONNECTIONS, SECONDS, "/b")
    assert server.running
    count = _redis_count(server.port, prefix, "/b") if kind == "redis" else _memcached_count(server.port, prefix, "/b")
    problems = []
    # Never a 5xx: the default on_error="open" admits or refuses, it does not fail the request.
    if not set(first.statuses) <= {200, 429} or not set(second.statuses) <= {200, 429}:
        problems.append("statuses other than 200 and 429")
    # At most the limit from the store plus the limit from the local insurance limiter.
    if not LIMIT <= first.admitted <= 2 * LIMIT:
        problems.append(f"the outage flood admitted {first.admitted}, not {LIMIT}..{2 * LIMIT}")
    # After the outage the store decides again: a fresh route gets exactly the limit, counted there.
    if second.admitted != LIMIT or count != LIMIT:
        problems.append(f"after the outage: admitted {second.admitted}, the store counted {count}, not {LIMIT}")
    assert not problems, "; ".join(problems) + f"\noutage flood: {_describe(first)}\nafter: {_describe(second)}"
