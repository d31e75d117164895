"""Every adapter enforces the scenario's limit on the shared app shape, or says why it cannot."""

from __future__ import annotations

import shutil
from typing import Any

import psutil
import pytest

from ratewarden.bench.adapters import LIBRARIES, OPT_IN, StoreSpec, Unsupported, load
from ratewarden.bench.drivers.inprocess import run_iteration
from ratewarden.bench.scenarios import SCENARIOS
from ratewarden.bench.services import StoreService

LIMITERS = [name for name in LIBRARIES if name != "bare" and name not in OPT_IN]  # the opt-in ones: their own tests


async def measure(library: str, key: str, service: StoreService | None = None) -> tuple[int, int]:
    """One iteration from a clean store; on a remote store a discarded warm-up comes first, as in the harness
    (the first checks open connections and load scripts, which can exceed a limiter's own timeout)."""
    adapter = load(library)(SCENARIOS[key], service.spec if service else StoreSpec())
    app = adapter.build()
    await adapter.start()
    try:
        if service:
            await run_iteration(app, SCENARIOS[key])
            service.flush()
        await adapter.reset()
        run = await run_iteration(app, SCENARIOS[key])
    finally:
        await adapter.stop()
    assert run.errors == 0
    return run.allowed, run.throttled


@pytest.mark.parametrize("library", LIMITERS)
@pytest.mark.parametrize("key", ["http.high", "mw.high", "mw.selective", "race", "distributed"])
async def test_limiters_allow_exactly_the_limit(library: str, key: str) -> None:
    sc = SCENARIOS[key]
    allowed, throttled = await measure(library, key)
    assert allowed == sc.expected_allowed
    assert allowed + throttled == sc.total_requests


async def test_bare_app_never_throttles() -> None:
    assert await measure("bare", "http.high") == (200, 0)


@pytest.mark.parametrize("library", ["ratewarden", "traffik", "limits"])
async def test_websocket_messages_are_limited(library: str) -> None:
    assert await measure(library, "ws.high") == (100, 100)


async def test_tiers_limit_only_the_small_tier() -> None:
    for library in LIMITERS:
        adapter = load(library)(SCENARIOS["tiered"], StoreSpec())
        app = adapter.build()
        await adapter.start()
        run = await run_iteration(app, SCENARIOS["tiered"])
        await adapter.stop()
        assert run.groups["basic"]["limited"] == 20, library
        assert run.groups["premium"]["limited"] == 0 and run.groups["standard"]["limited"] == 0


def test_unsupported_combinations_say_why() -> None:
    with pytest.raises(Unsupported, match="WebSocket"):
        load("slowapi")(SCENARIOS["ws.low"], StoreSpec()).build()
    with pytest.raises(Unsupported, match="gcra"):
        load("slowapi")(SCENARIOS["strategy.gcra"], StoreSpec()).build()
    with pytest.raises(Unsupported, match="headers"):
        load("limits")(SCENARIOS["headers.always"], StoreSpec()).build()
    with pytest.raises(Unsupported, match="path-rule"):
        load("limits")(SCENARIOS["rules.single"], StoreSpec()).build()
    with pytest.raises(Unsupported, match="token_bucket"):
        load("limits")(SCENARIOS["strategy.token_bucket"], StoreSpec()).build()
    with pytest.raises(KeyError):
        load("nonexistent")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
async def test_redis_store_rows_count_store_commands() -> None:
    with StoreService("redis") as service:
        before = service.commands()
        assert await measure("ratewarden", "http.low", service) == (50, 0)
        after = service.commands()
        assert before is not None and after is not None and after - before >= 100  # warm-up + measured
        service.flush()


@pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                    reason="redis-server and redis-cli are not installed")
async def test_every_limiter_runs_on_a_private_redis_cluster() -> None:
    with StoreService("redis-cluster") as service:
        assert service.spec.url.startswith("redis+cluster://127.0.0.1:")
        assert len(service.primaries) == 3
        for library in LIMITERS:
            service.flush()
            before = service.commands()
            assert await measure(library, "http.high", service) == (100, 100), library
            after = service.commands()
            # Checks reach the primaries (counts summed over all three); warm-up + measured iteration.
            assert before is not None and after is not None and after - before >= 100, library
    assert not service.procs


def _connections_to(ports: list[int]) -> list[Any]:
    """This process's TCP connections to ``ports`` (closed ones aside)."""
    proc = psutil.Process()
    listing = proc.net_connections if hasattr(proc, "net_connections") else proc.connections  # psutil < 6
    return [c for c in listing(kind="tcp") if c.raddr and c.raddr.port in ports and c.status != psutil.CONN_CLOSE]


@pytest.mark.parametrize("library", LIMITERS)
@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
async def test_stop_closes_every_connection_to_the_store(library: str, kind: str, request: pytest.FixtureRequest) -> None:
    """An adapter's stop() leaves no connection of its limiter's client open: the bench runs
    every library in one process, and a client left open holds its sockets until collected."""
    server = request.getfixturevalue("redis_standalone" if kind == "redis" else "redis_cluster")
    ports = [server.port] if kind == "redis" else server.ports
    assert _connections_to(ports) == []
    adapter = load(library)(SCENARIOS["http.low"], StoreSpec(kind, server.url))
    app = adapter.build()
    await adapter.start()
    try:
        run = await run_iteration(app, SCENARIOS["http.low"])
        assert run.errors == 0 and _connections_to(ports)  # it did connect
    finally:
        await adapter.stop()
    assert _connections_to(ports) == []
