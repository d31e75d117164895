"""``twemproxy=1``: the Redis store through twemproxy (nutcracker), envoyproxy/ratelimit's default way
to Redis (``REDIS_URL=/var/run/nutcracker/ratelimit.sock``), against a real nutcracker in front of the
suite's redis-server. twemproxy closes the connection on ``HELLO``, ``CLIENT``, ``TIME`` and ``SCRIPT``;
with the option none is sent, and checks stay exact on every algorithm, on both paths."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.errors import ConfigurationError
from ratewarden.limits import make_limits
from ratewarden.stores import open_store
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.servers import HOST, Twemproxy
from tests.stores.helpers import admitted_by_threads


def _flush(twemproxy: Twemproxy) -> str:
    """``SCRIPT FLUSH`` on the Redis behind the proxy (straight, as twemproxy refuses it)."""
    flushed = subprocess.run(["redis-cli", "-h", HOST, "-p", str(twemproxy.redis_port), "SCRIPT", "FLUSH"],
                             capture_output=True, text=True, timeout=10)
    return flushed.stdout.strip()


def _key(suffix: str) -> str:
    return f"rw:{{tw|{uuid.uuid4().hex}}}:{suffix}"


async def _admitted(url: str, algorithm: str, limit_text: str, checks: int) -> int:
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits(limit_text, algorithm)
    key = _key(limit.suffix)
    try:
        decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(checks)))
        return sum(d.allowed for d in decisions)
    finally:
        await store.close()


async def test_without_the_option_twemproxy_closes_the_connection(twemproxy: Twemproxy) -> None:
    with pytest.raises(StoreError, match="ConnectionError"):  # closed by twemproxy
        await _admitted(f"unix://{twemproxy.socket}", "fixed_window", "5/hour", 1)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_200_concurrent_checks_admit_exactly_the_limit(twemproxy: Twemproxy, algorithm: str) -> None:
    assert await _admitted(f"unix://{twemproxy.socket}?twemproxy=1", algorithm, "50/hour", 200) == 50


async def test_over_tcp_too(twemproxy: Twemproxy) -> None:
    assert await _admitted(f"redis://{HOST}:{twemproxy.port}/0?twemproxy=1", "gcra", "40/hour", 120) == 40


def test_threads_on_the_blocking_path_admit_exactly_the_limit(twemproxy: Twemproxy) -> None:
    url = f"unix://{twemproxy.socket}?twemproxy=1&pool_size=4"
    assert admitted_by_threads(url, "sliding_window", "30/hour", threads=40, checks=120) == 30


async def test_a_server_that_lost_the_script_gets_it_by_eval(twemproxy: Twemproxy) -> None:
    """No ``SCRIPT LOAD`` through the proxy: after ``SCRIPT FLUSH`` the calls come back ``NOSCRIPT``
    and are sent again with the script's body, still counted once each."""
    store = RedisStore(f"unix://{twemproxy.socket}?twemproxy=1", timeout=5)
    (limit,) = make_limits("10/hour", "fixed_window")
    key = _key(limit.suffix)
    try:
        assert (await store.hit([key], [limit], [1.0])).remaining == 9
        assert _flush(twemproxy) == "OK"
        decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(5)))
        assert sorted(d.remaining for d in decisions) == [4, 5, 6, 7, 8]
        assert _flush(twemproxy) == "OK"  # again, for the blocking path's own NOSCRIPT
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 3
    finally:
        await store.close()


@pytest.mark.parametrize(("url", "named"), [
    (f"redis+cluster://{HOST}:7000?twemproxy=1", "twemproxy=1 is for one proxy address"),
    (f"redis://{HOST}:22121/0?twemproxy=1&client_name=rw", "client_name cannot go with twemproxy=1"),
    (f"redis://{HOST}:22121/2?twemproxy=1", "database 2 cannot go with twemproxy=1"),
    (f"redis://{HOST}:22121/0?twemproxy=2", "option twemproxy='2' must be 0 or 1"),
    (f"memcached://{HOST}:11211?twemproxy=1", "unknown option 'twemproxy'"),
])
def test_what_twemproxy_cannot_carry_is_refused(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        open_store(url)


async def test_clear_is_refused_as_a_store_error(twemproxy: Twemproxy) -> None:
    """twemproxy refuses ``SCAN`` (docs/stores.md says so): a ``StoreError``, not a hang or a crash."""
    store = RedisStore(f"unix://{twemproxy.socket}?twemproxy=1", timeout=2)
    try:
        with pytest.raises(StoreError, match="clear"):
            await store.clear()
    finally:
        await store.close()
