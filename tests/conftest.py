"""Session-wide real servers (started once, stopped at the end) and a marker per backend.

A test that uses a server fixture, directly or through another fixture, is marked with that
backend (``redis``, ``sentinel``, ``cluster``, ``memcached``), so ``pytest -m "not cluster"`` or
``pytest -m memcached`` select by what a test needs.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import warnings
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import pytest

from tests.servers import (
    Memcached,
    RedisCluster,
    RedisSentinel,
    RedisStandalone,
    Twemproxy,
    ValkeyStandalone,
    have,
    valkey_binary,
)

BACKENDS = {
    "redis_standalone": "redis",
    "redis_sentinel": "sentinel",
    "matrix_sentinel": "sentinel",
    "redis_cluster": "cluster",
    "memcached_server": "memcached",
}


def _third_party() -> tuple[tuple[str, type[Warning]], ...]:
    # starlette before 0.40 (the oldest supported, scripts/oldest-deps.txt, is older) leaves its
    # TestClient's anyio memory streams open (closed since starlette PR #2693).
    try:
        starlette = tuple(int(part) for part in version("starlette").split(".")[:2])
    except PackageNotFoundError:  # the wheel builds' server-free tests run without it
        return ()
    return (("Unclosed <MemoryObject", ResourceWarning),) if starlette < (0, 40) else ()


_THIRD_PARTY = _third_party()
"""Warnings that are third parties' and not errors here, as (message regex, category): ignored in
each test (``pytest_configure``) and in the end-of-run listing (``pytest_sessionfinish``)."""


def pytest_configure(config: pytest.Config) -> None:
    for message, category in _THIRD_PARTY:
        config.addinivalue_line("filterwarnings", f"ignore:{message}:{category.__name__}")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_FromWorkers())


class _FromWorkers:
    """Under pytest-xdist (``-n``), the controller lists what the workers found left open."""

    @staticmethod
    def pytest_testnodedown(node: object, error: object) -> None:
        _LEFT_OPEN.extend(getattr(node, "workeroutput", {}).get("left_open", ()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & BACKENDS.keys():
            item.add_marker(BACKENDS[fixture])


HOUR_GUARD = 45.0
MINUTE_GUARD = 2.0


@pytest.fixture(autouse=True)
def _clear_of_window_edges() -> None:
    """Start no test in the last ``HOUR_GUARD`` seconds of a wall-clock hour, nor in the last
    ``MINUTE_GUARD`` seconds of a minute.

    Many tests count against per-minute and per-hour fixed windows on the real clock, as users do;
    one that straddles the window's end sees a fresh window and admits more than it asserts (CI
    runs saw 4 admitted of 3 across 11:00, and a ban test's minute end inside its 1.2 s sleep).
    Waiting costs under a minute an hour of tests, plus about 3 %.
    """
    now = time.time()
    left = 3600.0 - now % 3600.0
    if left >= HOUR_GUARD:
        left = 60.0 - now % 60.0
        if left >= MINUTE_GUARD:
            return
    time.sleep(left + 0.2)


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage once a test's fixtures are torn down (its event loop too), so a socket or
    file it left open is reported against it (a ResourceWarning: an error, see pyproject.toml),
    not against whichever later test the collector happens to run in. What survives is frozen
    (``gc.freeze``): the next test's collection looks at its own objects only, in a millisecond
    or so instead of ~70 ms for the whole heap."""
    yield
    gc.collect()
    gc.freeze()


_LEFT_OPEN: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What survived a test and was left open later (a module- or session-scoped fixture's client,
    torn down after the per-test collection and frozen with it) is listed at the end of the run,
    not raised: it cannot be pinned on one test. An xdist worker hands its list to the controller."""
    gc.unfreeze()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for message, category in _THIRD_PARTY:  # added last, so checked first
            warnings.filterwarnings("ignore", message, category)
        gc.collect()
        gc.collect()
    _LEFT_OPEN.extend(str(w.message) for w in caught if issubclass(w.category, ResourceWarning))
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["left_open"] = list(_LEFT_OPEN)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT_OPEN:
        terminalreporter.section("left open by longer-lived fixtures (found at the end of the run)")
        for line in sorted(set(_LEFT_OPEN)):
            terminalreporter.line(f"{_LEFT_OPEN.count(line)} x {line}")


def _need(binary: str) -> None:
    if not have(binary):
        pytest.fail(f"{binary} is not installed: run scripts/install-system-deps.sh (make setup does)")


@pytest.fixture(scope="session")
def redis_standalone() -> Iterator[RedisStandalone]:
    _need("redis-server")
    server = RedisStandalone().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def valkey_standalone() -> Iterator[ValkeyStandalone]:
    if not os.access(valkey_binary(), os.X_OK):
        pytest.fail(f"no Valkey server at {valkey_binary()}: run scripts/install-valkey.sh (make setup does)")
    server = ValkeyStandalone().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def twemproxy(redis_standalone: RedisStandalone) -> Iterator[Twemproxy]:
    """nutcracker (twemproxy) in front of the session's Redis."""
    proxy = Twemproxy(redis_standalone.port)
    if not os.access(proxy.binary, os.X_OK):
        pytest.fail("nutcracker is not installed: run scripts/install-system-deps.sh (make setup does)")
    yield proxy.start()
    proxy.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    _need("redis-server")
    cluster = RedisCluster().start()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    _need("redis-server")
    setup = RedisSentinel().start()
    yield setup
    setup.close()


@pytest.fixture(scope="session")
def matrix_sentinel() -> Iterator[RedisSentinel]:
    """A Sentinel set-up slow to fail over (60 s), so pausing or restarting its primary is an
    outage, not a failover (the failure matrix)."""
    _need("redis-server")
    setup = RedisSentinel(down_after_ms=60_000).start()
    yield setup
    setup.close()


@pytest.fixture
def private_memcached() -> Iterator[Memcached]:
    """A memcached of the test's own, which it may pause (SIGSTOP): resumed before it is closed."""
    _need("memcached")
    server = Memcached().start()
    yield server
    assert server.server.proc is not None
    os.kill(server.server.proc.pid, signal.SIGCONT)
    server.close()


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[Memcached]:
    _need("memcached")
    server = Memcached().start()
    yield server
    server.close()
