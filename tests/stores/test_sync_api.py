"""The sync facade (``hit_sync`` and friends) on every store, from plain code and from a loop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden import Limiter
from ratewarden.limits import make_limits
from ratewarden.metrics import Metrics
from ratewarden.stores.base import Store, StoreError
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.redis import RedisStore
from tests.servers import Memcached, RedisStandalone, redis_cmd


@pytest.mark.parametrize("coalesce", [True, False])
def test_hit_sync_on_redis_from_plain_code_works_every_time(redis_standalone: RedisStandalone, coalesce: bool) -> None:
    limiter = Limiter(RedisStore(redis_standalone.url, timeout=5, coalesce=coalesce))
    key = uuid.uuid4().hex
    try:
        remaining = [limiter.hit_sync(key, "100/hour", algorithm="fixed_window").remaining for _ in range(10)]
        assert remaining == list(range(99, 89, -1))
        assert limiter.peek_sync(key, "100/hour", algorithm="fixed_window").remaining == 90
        stored = redis_cmd(redis_standalone.port, "GET", f"rw:{{|{key}}}:fixed_window:100/3600000").split()
        assert float(stored[1]) == 10  # charged exactly once per call
        limiter.reset_sync(key, "100/hour", algorithm="fixed_window")
        assert limiter.hit_sync(key, "100/hour", algorithm="fixed_window").remaining == 99
    finally:
        limiter.close_sync()


def test_hit_sync_on_memcached_from_plain_code_works_every_time(memcached_server: Memcached) -> None:
    limiter = Limiter(MemcachedStore(memcached_server.url, timeout=5))
    key = uuid.uuid4().hex
    try:
        assert [limiter.hit_sync(key, "5/hour").remaining for _ in range(6)] == [4, 3, 2, 1, 0, 0]
        assert limiter.peek_sync(key, "5/hour").remaining == 0
        limiter.reset_sync(key, "5/hour")
        assert limiter.hit_sync(key, "5/hour").remaining == 4
    finally:
        limiter.close_sync()


def test_sync_calls_from_many_threads_share_one_redis_store(redis_standalone: RedisStandalone) -> None:
    limiter = Limiter(RedisStore(redis_standalone.url, timeout=5))
    key = uuid.uuid4().hex
    allowed: list[bool] = []

    def worker() -> None:
        for _ in range(20):
            allowed.append(limiter.hit_sync(key, "50/hour").allowed)

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    limiter.close_sync()
    assert sum(allowed) == 50 and len(allowed) == 100


async def test_every_sync_method_works_inside_a_running_loop_with_a_wrapped_store() -> None:
    limiter = Limiter(Metrics().instrument(MemoryStore()))
    assert limiter.hit_sync("k", "2/min").remaining == 1
    assert limiter.peek_sync("k", "2/min").remaining == 1
    limiter.reset_sync("k", "2/min")
    assert limiter.peek_sync("k", "2/min").remaining == 2
    limiter.hit_sync("k", "2/min")
    limiter.clear_sync()
    assert limiter.peek_sync("k", "2/min").remaining == 2
    assert (await limiter.peek("k", "2/min")).remaining == 2
    await limiter.close()


def test_sync_methods_from_plain_code_with_a_wrapped_store() -> None:
    limiter = Limiter(Metrics().instrument(MemoryStore()))
    assert limiter.hit_sync("k", "2/min").remaining == 1
    assert limiter.peek_sync("k", "2/min").remaining == 1
    limiter.clear_sync()
    assert limiter.peek_sync("k", "2/min").remaining == 2
    limiter.close_sync()


def test_close_sync_stops_the_private_loop_thread(redis_standalone: RedisStandalone) -> None:
    before = threading.active_count()
    limiter = Limiter(RedisStore(redis_standalone.url, timeout=5))
    limiter.hit_sync(uuid.uuid4().hex, "10/min")
    assert threading.active_count() == before + 1
    limiter.close_sync()
    assert threading.active_count() == before
    asyncio.run(asyncio.sleep(0))  # no loop left behind in this thread


@pytest.mark.parametrize("store", ["notastore", 42, MemoryStore])
def test_limiter_rejects_what_is_not_a_store_at_once(store: object) -> None:
    # Both builds, at construction (the compiled one through its own argument check).
    with pytest.raises(TypeError, match="Store or None") as info:
        Limiter(store)  # type: ignore[arg-type]
    kind = type(store)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    assert f"got {name}" in str(info.value)


def test_the_sync_example_in_the_docs_runs(redis_standalone: RedisStandalone) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "stores.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "hit_sync" in b]
    code = code.replace("redis://127.0.0.1:6379/0", redis_standalone.url).replace("report:9", uuid.uuid4().hex)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/stores.md", "exec"), {})
    assert out.getvalue().split() == ["True", "True", "False", "0"]


def test_a_redis_store_reused_on_a_new_loop_fails_with_store_error(redis_standalone: RedisStandalone) -> None:
    # What hit_sync used to do (asyncio.run per call): the store's connection belongs to the
    # first loop. Every failure of a store is a StoreError, never a raw RuntimeError.
    store = RedisStore(redis_standalone.url, timeout=5, coalesce=False)
    (limit,) = make_limits("10/min")
    key = f"rw:{{loop|{uuid.uuid4().hex}}}:k"
    with _first_loop(store) as first:
        assert first.run_until_complete(store.hit([key], [limit], [1.0])).remaining == 9
        with pytest.raises(StoreError):
            asyncio.run(store.hit([key], [limit], [1.0]))


@contextlib.contextmanager
def _first_loop(store: Store) -> Iterator[asyncio.AbstractEventLoop]:
    """The loop a store is first used on, which closes the store when the block ends (a store
    cannot be closed from another loop: its sockets would be left to the garbage collector)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def test_a_memcached_store_reused_on_a_new_loop_fails_with_store_error(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, timeout=5)
    (limit,) = make_limits("10/min")
    key = f"rw:{{loop|{uuid.uuid4().hex}}}:k"
    with _first_loop(store) as first:
        assert first.run_until_complete(store.hit([key], [limit], [1.0])).remaining == 9
        with pytest.raises(StoreError):
            asyncio.run(store.hit([key], [limit], [1.0]))
