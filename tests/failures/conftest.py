"""Real servers for the failure matrix: the store tests' session fixtures, plus a Sentinel setup
slow to fail over (so pausing or restarting its primary is an outage, not a failover)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import RedisSentinel, have
from tests.stores.conftest import memcached_server, redis_cluster, redis_standalone

__all__ = ["matrix_sentinel", "memcached_server", "redis_cluster", "redis_standalone"]


@pytest.fixture(scope="session")
def matrix_sentinel() -> Iterator[RedisSentinel]:
    if not have("redis-server"):
        pytest.skip("redis-server is not installed (run scripts/install-system-deps.sh)")
    setup = RedisSentinel(down_after_ms=60_000).start()
    yield setup
    setup.close()
