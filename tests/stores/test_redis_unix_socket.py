"""``unix:///path/redis.sock``: the Redis store on a unix socket (envoyproxy/ratelimit's default
``REDIS_SOCKET_TYPE``), against a real redis-server listening on one: exact under concurrency on
every algorithm, on the async and the blocking path; ``?db=`` chooses the database; a socket that
is not there is a ``StoreError`` naming its path."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisStandalone
from tests.stores.helpers import admitted_by_threads


def _key(suffix: str) -> str:
    return f"rw:{{unix|{uuid.uuid4().hex}}}:{suffix}"


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_200_concurrent_checks_admit_exactly_the_limit(redis_standalone: RedisStandalone, algorithm: str) -> None:
    store = RedisStore(f"unix://{redis_standalone.socket}", timeout=5)
    (limit,) = make_limits("50/hour", algorithm)
    key = _key(limit.suffix)
    try:
        decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(200)))
        assert sum(d.allowed for d in decisions) == 50
    finally:
        await store.close()


def test_threads_on_the_blocking_path_admit_exactly_the_limit(redis_standalone: RedisStandalone) -> None:
    url = f"unix://{redis_standalone.socket}?pool_size=4"
    assert admitted_by_threads(url, "fixed_window", "30/hour", threads=40, checks=120) == 30


async def test_the_db_option_chooses_the_database(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(f"unix://{redis_standalone.socket}?db=5", timeout=5)
    (limit,) = make_limits("3/hour", "fixed_window")
    key = _key(limit.suffix)
    try:
        await store.hit([key], [limit], [1.0])
    finally:
        await store.close()

    def exists(db: int) -> str:
        return subprocess.run(["redis-cli", "-s", redis_standalone.socket, "-n", str(db), "EXISTS", key],
                              capture_output=True, text=True, timeout=10).stdout.strip()

    assert (exists(5), exists(0)) == ("1", "0")


async def test_a_missing_socket_is_a_store_error_naming_it() -> None:
    path = f"/tmp/rw-no-such-{uuid.uuid4().hex[:8]}.sock"
    store = RedisStore(f"unix://{path}", timeout=0.5, connect_timeout=0.5)
    (limit,) = make_limits("3/hour", "fixed_window")
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match=path):
            await store.hit([_key(limit.suffix)], [limit], [1.0])
        assert time.monotonic() - started < 5
    finally:
        await store.close()


@pytest.mark.parametrize(("url", "named"), [
    ("unix://localhost/run/redis.sock", "a unix socket URL names no host"),
    ("unix://", "the socket path must be absolute"),
    ("unix:///run/redis.sock?db=x", "option db='x' must be a database number"),
    ("unix:///run/redis.sock?color=red", "unknown option 'color'"),
])
def test_a_bad_unix_socket_url_is_named(url: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        RedisStore(url)
