"""Store services and the live driver's process limits: what the harness sets up before a run."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratewarden.bench.drivers.live import LiveError, raise_fd_limit
from ratewarden.bench.reports.markdown import cluster_tables
from ratewarden.bench.results import Row
from ratewarden.bench.services import REDIS_SERVER, BenchError, StoreService
from tests.servers import valkey_binary

needs_cluster = pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                   reason="redis-server and redis-cli are not installed")


@needs_cluster
def test_private_cluster_has_three_primaries_with_a_replica_each_and_flushes_them_all() -> None:
    import redis

    with StoreService("redis-cluster") as service:
        assert len(service.procs) == 6
        port = service.primaries[0][1]
        nodes = subprocess.run(["redis-cli", "-p", str(port), "CLUSTER", "NODES"], capture_output=True, text=True,
                               timeout=10, check=True).stdout
        roles = [line.split()[2] for line in nodes.splitlines()]
        assert sum("master" in r for r in roles) == 3 and sum("slave" in r for r in roles) == 3
        client = redis.RedisCluster(host="127.0.0.1", port=port)
        try:
            for i in range(60):  # spread over every slot range
                client.set(f"key-{i}", i)
            assert client.dbsize(target_nodes=redis.RedisCluster.PRIMARIES) == 60
            before = service.commands()
            client.get("key-1")
            assert service.commands() == (before or 0) + 1
            service.flush()
            assert client.dbsize(target_nodes=redis.RedisCluster.PRIMARIES) == 0
        finally:
            client.close()
        # An existing cluster given by URL is used as is (discovered from any node).
        with StoreService("redis-cluster", service.url) as again:
            assert again.primaries == service.primaries and not again.procs
    assert all(p.poll() is not None for p in service.procs) or not service.procs


def test_unreachable_cluster_url_is_a_clear_error() -> None:
    with pytest.raises(BenchError, match=r"redis-cluster store at redis\+cluster://127\.0\.0\.1:1 does not answer"):
        StoreService("redis-cluster", "redis+cluster://127.0.0.1:1").start()


def test_fd_limit_is_raised_to_what_1000_connections_need() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"hard open-files limit {hard} is too low to test raising the soft one")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        new = raise_fd_limit(3024)
        assert new >= 3024 and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == new
        assert raise_fd_limit(100) == new  # never lowered
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(LiveError, match="hard limit"):
                raise_fd_limit(hard + 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _row(library: str, store: str, conc: int, rps: float, allowed: int = 100) -> Row:
    return Row(library=library, scenario="live.light", group="live", title="Light", store=store, driver="live",
               concurrency=conc, requests=int(rps), rps=rps, allowed=allowed, throttled=int(rps) - allowed, errors=0,
               success_pct=0.0, throttled_pct=0.0, lat_mean_ms=1.0, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, p999_ms=4.0,
               expected_allowed=None, correct=None, iterations=3, rps_runs=[rps], cpu_pct=90.0, rss_mb=60.0)


def test_cluster_table_pairs_standalone_and_cluster_rows() -> None:
    rows = [_row("ratewarden", "redis", 50, 8000), _row("ratewarden", "redis-cluster", 50, 6000),
            _row("traffik", "redis", 50, 2000), _row("bare", "none", 50, 10000, allowed=10000),
            _row("ratewarden", "redis", 1000, 4000), _row("ratewarden", "redis-cluster", 1000, 1000)]
    [table] = cluster_tables(rows)
    body = {(r[0], r[1]): r for r in table.body}
    assert set(body) == {("50", "ratewarden"), ("50", "traffik"), ("50", "bare (no limiter)"), ("1000", "ratewarden")}
    assert body[("50", "ratewarden")][-1] == "0.75" and body[("1000", "ratewarden")][-1] == "0.25"
    assert body[("50", "traffik")][6] == "—" and body[("50", "ratewarden")][4] == "100 / 7,900 / 0"
    assert cluster_tables([r for r in rows if r.store != "redis-cluster"]) == []


def test_the_private_redis_can_be_valkey(tmp_path: Path) -> None:
    """``--redis-server`` names the server the bench starts for its private Redis: with Valkey's, the
    race scenario runs on a Valkey server and admits exactly its limit, and the report says which."""
    valkey = valkey_binary()
    if not os.access(valkey, os.X_OK):
        pytest.fail(f"no Valkey server at {valkey}: run scripts/install-valkey.sh (make setup does)")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ratewarden.cli", "bench", "--scenario", "race", "--store", "redis", "--library",
            "ratewarden", "--iterations", "1", "--redis-server", valkey, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    results = json.loads((out / "results.json").read_text())
    (row,) = [r["summary"] for r in results["results"] if r["summary"]]
    assert (row["admitted"], row["limit"], row["correct"], row["store"]) == (100, 100, True, "redis")
    assert results["meta"]["method"]["Redis server"].startswith(f"{valkey} (--redis-server)")


def test_the_private_redis_is_started_from_the_named_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    valkey = valkey_binary()
    if not os.access(valkey, os.X_OK):
        pytest.fail(f"no Valkey server at {valkey}: run scripts/install-valkey.sh (make setup does)")
    monkeypatch.setenv(REDIS_SERVER, valkey)
    with StoreService("redis") as service, redis.Redis.from_url(service.url) as client:
        assert "valkey_version" in client.info("server")
    monkeypatch.setenv(REDIS_SERVER, "no-such-redis-server")
    with pytest.raises(BenchError, match="no --redis-url given and no-such-redis-server is not installed "
                                         r"\(--redis-server names it\)"):
        StoreService("redis").start()


def test_a_missing_redis_server_program_is_named() -> None:
    done = subprocess.run([sys.executable, "-m", "ratewarden.cli", "bench", "--redis-server", "/no/such/server",
                           "--scenario", "race"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--redis-server: no program '/no/such/server' (on PATH, or an executable file)" in done.stderr
