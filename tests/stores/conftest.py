"""Session-wide real servers for the store tests (started once, stopped at the end)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import Memcached, RedisCluster, RedisSentinel, RedisStandalone, have


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
