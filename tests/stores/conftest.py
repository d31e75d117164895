"""Session-wide real servers for the store tests (started once, stopped at the end)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers import Memcached, RedisCluster, RedisSentinel, RedisStandalone, have

needs_redis = pytest.mark.skipif(not have("redis-server"), reason="redis-server is not installed (make setup)")
needs_memcached = pytest.mark.skipif(not have("memcached"), reason="memcached is not installed (make setup)")


@pytest.fixture(scope="session")
def redis_standalone() -> Iterator[RedisStandalone]:
    if not have("redis-server"):
        pytest.skip("redis-server is not installed (run scripts/install-system-deps.sh)")
    server = RedisStandalone().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    if not have("redis-server"):
        pytest.skip("redis-server is not installed (run scripts/install-system-deps.sh)")
    cluster = RedisCluster().start()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    if not have("redis-server"):
        pytest.skip("redis-server is not installed (run scripts/install-system-deps.sh)")
    setup = RedisSentinel().start()
    yield setup
    setup.close()


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[Memcached]:
    if not have("memcached"):
        pytest.skip("memcached is not installed (run scripts/install-system-deps.sh)")
    server = Memcached().start()
    yield server
    server.close()
