"""More checks at once than the client's pool has connections (``coalesce=False``): the extra ones
wait for a free connection instead of failing, on every topology. redis-py's Sentinel and Cluster
pools raise ``MaxConnectionsError`` when exhausted (only the standalone pool blocks), so before the
store gated its calls, a burst of 200 checks on a healthy Sentinel failed some of them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore

FIXTURES = {"redis": "redis_standalone", "sentinel": "redis_sentinel", "cluster": "redis_cluster"}


@pytest.mark.parametrize("kind", list(FIXTURES))
async def test_a_burst_beyond_the_pool_waits_for_connections(request: pytest.FixtureRequest, kind: str) -> None:
    """200 concurrent checks on a pool of 32 connections (pool_size 8) against a limit of 50:
    exactly 50 allowed, no error."""
    url = request.getfixturevalue(FIXTURES[kind]).url
    store = RedisStore(url, timeout=5, coalesce=False, cache=False)
    (limit,) = make_limits("50/hour", "fixed_window")
    key = f"rw:{{burst|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        results = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(200)), return_exceptions=True)
    finally:
        await store.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of 200 checks failed, e.g. {errors[0]!r}"
    assert sum(d.allowed for d in results if not isinstance(d, BaseException)) == 50


@pytest.mark.parametrize("kind", list(FIXTURES))
async def test_reset_and_clear_of_more_keys_than_the_pool(request: pytest.FixtureRequest, kind: str) -> None:
    """A cluster resets and clears key by key, concurrently: 200 keys on one node (one hash tag)
    take turns for its 32 connections instead of failing."""
    url = request.getfixturevalue(FIXTURES[kind]).url
    prefix = f"rwpool{uuid.uuid4().hex[:8]}"  # clear deletes these keys only
    store = RedisStore(url, timeout=5, coalesce=False, cache=False, prefix=prefix)
    (limit,) = make_limits("1/hour", "fixed_window")
    keys = [f"{prefix}:{{one}}:{i}:{limit.suffix}" for i in range(400)]
    try:
        for start in range(0, 400, 20):  # fewer at once than the pool: only reset and clear exceed it
            await asyncio.gather(*(store.hit([key], [limit], [1.0]) for key in keys[start : start + 20]))
        await store.reset(keys[:200])
        assert all([(await store.hit([key], [limit], [1.0])).allowed for key in keys[:200]])
        await store.clear()
        assert all([(await store.hit([key], [limit], [1.0])).allowed for key in keys[200:]])
    finally:
        await store.close()


async def _silent_server() -> tuple[asyncio.Server, int]:
    """A TCP server that accepts connections and never answers: every call on it hangs."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_check_that_waited_for_the_pool_names_its_limit() -> None:
    """pool_size 1: a pool of 4 connections, all held by checks on a server that never replies; the
    fifth check waits for one of them, times out, and its error names the pool's limit (the others'
    do not: they had a connection, the server never answered)."""
    server, port = await _silent_server()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.2, pool_size=1, coalesce=False)
    (limit,) = make_limits("50/hour", "fixed_window")
    try:
        results = await asyncio.gather(*(store.hit(["rw:{x}:k"], [limit], [1.0]) for _ in range(5)), return_exceptions=True)
    finally:
        await store.close()
        server.close()
        await server.wait_closed()
    assert all(isinstance(r, StoreError) for r in results), results
    messages = [str(r) for r in results]
    assert all("no reply within 200 ms" in m for m in messages), messages
    assert [m for m in messages if "all 4 connections of the client's pool were busy (pool_size=1)" in m] == messages[4:]
