"""A store's client failure becomes one ``StoreError`` naming the store and the operation, with the
client's exception as ``__cause__``: the mapping lives in ``stores.base``, each store only declares
``client_errors``."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from ratewarden import StoreError
from ratewarden.limits import Limit
from ratewarden.rates import parse_rate
from ratewarden.stores.base import client_error, no_reply
from ratewarden.stores.breaker import Breaker
from ratewarden.stores.shared_memory import SharedMemoryStore
from tests.shm import unique_name

LIMIT = Limit(parse_rate("5/minute"))


def test_the_mapping_names_store_operation_and_root_cause() -> None:
    try:
        try:
            raise ValueError("certificate verify failed")
        except ValueError as inner:
            raise ConnectionError("connection reset") from inner
    except ConnectionError as exc:
        failure = exc
    error = client_error("SomeStore('x')", "hit", failure)
    assert str(error) == "SomeStore('x'): hit: ConnectionError: connection reset (ValueError: certificate verify failed)"
    assert error.__cause__ is failure
    assert client_error("SomeStore('x')", "hit", error) is error  # already mapped: as is
    assert str(no_reply("SomeStore('x')", "peek", 0.025)) == "SomeStore('x'): peek: no reply within 25 ms"


def test_a_cause_cycle_does_not_hang_the_mapping() -> None:
    first, second = OSError("a"), OSError("b")
    first.__context__, second.__context__ = second, first
    assert str(client_error("S", "hit", first)) == "S: hit: OSError: a (OSError: b)"


@pytest.fixture
def failing_lockf_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A shared-memory store on fcntl locks whose every lock the kernel refuses (ENOLCK)."""
    store_obj = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path, lock="lockf")

    def refuse(*args: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(store_obj._segment().locks, "lockf", refuse)  # the region locks of its table
    return store_obj


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("hit", lambda s: s.hit(["k"], [LIMIT], [1.0])),
        ("peek", lambda s: s.peek(["k"], [LIMIT])),
        ("adjust", lambda s: s.adjust(["k"], [LIMIT], [-1.0])),
        ("reset", lambda s: s.reset(["k"])),
        ("clear", lambda s: s.clear()),
    ],
)
async def test_a_refused_shared_memory_lock_is_a_store_error(failing_lockf_store: Any, operation: str, call: Any) -> None:
    with pytest.raises(StoreError, match=rf"^SharedMemoryStore\('.*'.*\): {operation}: OSError: .*No locks available") as info:
        await call(failing_lockf_store)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOLCK


async def test_the_breaker_counts_a_refused_shared_memory_lock(failing_lockf_store: Any) -> None:
    breaker = Breaker(failing_lockf_store, failures=2, cooldown=60)
    for _ in range(2):
        with pytest.raises(StoreError, match="No locks available"):
            await breaker.hit(["k"], [LIMIT], [1.0])
    with pytest.raises(StoreError, match="circuit open"):
        await breaker.hit(["k"], [LIMIT], [1.0])


@pytest.mark.parametrize("coalesce", [False, True])
async def test_an_unreachable_redis_is_a_store_error_naming_it(coalesce: bool) -> None:
    from redis.exceptions import RedisError

    from ratewarden.stores.redis import RedisStore

    store = RedisStore("redis://:secret@127.0.0.1:1/0", timeout=0.5, coalesce=coalesce)  # nothing listens on 1
    operation = "pipelined call" if coalesce else "hit"
    try:
        with pytest.raises(StoreError) as info:
            await store.hit(["rw:k"], [LIMIT], [1.0])
        assert str(info.value).startswith(f"RedisStore('redis://:***@127.0.0.1:1/0'): {operation}: "), info.value
        assert "secret" not in str(info.value)
        assert isinstance(info.value.__cause__, RedisError | OSError)
        with pytest.raises(StoreError, match=r"^RedisStore\('redis://:\*\*\*@127.0.0.1:1/0'\): reset: "):
            await store.reset(["rw:k"])
    finally:
        await store.close()


async def test_an_unreachable_memcached_is_a_store_error_naming_it() -> None:
    from ratewarden.stores.memcached import MemcachedStore

    store = MemcachedStore("memcached://127.0.0.1:1", timeout=0.5)  # nothing listens on port 1
    try:
        for operation, call in [
            ("hit", store.hit(["k"], [LIMIT], [1.0])),
            ("peek", store.peek(["k"], [LIMIT])),
            ("reset", store.reset(["k"])),
        ]:
            with pytest.raises(StoreError, match=rf"^MemcachedStore\('memcached://127.0.0.1:1'\): {operation}: ") as info:
                await call
            assert isinstance(info.value.__cause__, OSError), repr(info.value.__cause__)
    finally:
        await store.close()
