"""``MemcachedStore.hit_blocking`` (issue 23): the synchronous check on pymemcache, exact under many
threads, sharing keys with the async path, all or nothing across keys, and failing within about
two timeouts when memcached is killed or paused."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from ratewarden.decision import Decision
from ratewarden.limits import Limit, make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.memcached import MemcachedStore, memcached_key
from tests.servers import Memcached
from tests.timing import Stopwatch

ALGORITHMS = ["fixed_window", "sliding_window", "gcra", "token_bucket"]


def _key(limit: Limit, tag: str = "") -> str:
    return f"rw:{{blocking|{uuid.uuid4().hex}{tag}}}:{limit.suffix}"


def _flood(check: Callable[[], Decision], threads: int) -> list[Decision]:
    """``check`` from ``threads`` threads released together."""
    gate = threading.Barrier(threads)

    def one(_: int) -> Decision:
        gate.wait()
        return check()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(threads)))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_150_threads_on_one_key_get_exactly_the_limit(memcached_server: Memcached, algorithm: str) -> None:
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    (limit,) = make_limits("100/hour", algorithm)
    key = _key(limit)
    try:
        decisions = _flood(lambda: store.hit_blocking([key], [limit], [1.0]), 150)
        assert sum(d.allowed for d in decisions) == 100
        assert store._sync_out == 0 and store._sync_held == set()
        assert len(store._sync_free) <= 8  # pool_size
        # the async path reads the state the threads left
        (peeked,) = await store.peek([key], [limit])
        assert peeked.remaining == 0
    finally:
        await store.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_sync_and_async_checks_share_the_key(memcached_server: Memcached, algorithm: str) -> None:
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    (limit,) = make_limits("10/hour", algorithm)
    key = _key(limit)
    try:
        allowed = []
        for i in range(14):
            if i % 2:
                decision = await store.hit([key], [limit], [1.0])
            else:
                decision = store.hit_blocking([key], [limit], [1.0])
            allowed.append(decision.allowed)
            if decision.allowed:
                assert decision.remaining == 9 - i
        assert allowed == [True] * 10 + [False] * 4
        # a second store on the same memcached (another process) sees the same state
        other = MemcachedStore(memcached_server.url, timeout=0.5, cache=False)
        try:
            assert not (await other.hit([key], [limit], [1.0])).allowed
            assert not other.hit_blocking([key], [limit], [1.0]).allowed
        finally:
            await other.close()
    finally:
        await store.close()


async def test_sync_and_async_checks_in_parallel_stay_exact(memcached_server: Memcached) -> None:
    """Threads on the sync path and coroutines on the async path race on one key: CAS keeps it exact."""
    import asyncio

    store = MemcachedStore(memcached_server.url, timeout=0.5)
    (limit,) = make_limits("60/hour", "gcra")
    key = _key(limit)
    try:
        threads = asyncio.ensure_future(asyncio.to_thread(_flood, lambda: store.hit_blocking([key], [limit], [1.0]), 40))
        coros = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(40)))
        total = sum(d.allowed for d in await threads) + sum(d.allowed for d in coros)
        assert total == 60
    finally:
        await store.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_several_keys_charge_all_or_nothing(memcached_server: Memcached, algorithm: str) -> None:
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    limits = make_limits("5/hour; 100/day", algorithm)
    keys = [_key(limit) for limit in limits]
    try:
        short = store.hit_blocking([keys[0]], [limits[0]], [5.0])  # the first limit is used up
        assert short.allowed and short.remaining == 0
        for _ in range(3):
            decision = store.hit_blocking(keys, limits, [1.0, 1.0])
            assert not decision.allowed and decision.policy == limits[0].name
        # nothing was charged on the second key, by either path
        (day,) = await store.peek([keys[1]], [limits[1]])
        assert day.remaining == 100
        assert store.hit_blocking([keys[1]], [limits[1]], [1.0]).remaining == 99
        # both allow: both are charged
        fresh = [_key(limit, "b") for limit in limits]
        both = store.hit_blocking(fresh, limits, [1.0, 1.0])
        assert both.allowed
        assert [d.remaining for d in await store.peek(fresh, limits)] == [4, 99]
    finally:
        await store.close()


async def test_a_later_write_that_loses_its_race_puts_back_the_earlier_one(memcached_server: Memcached) -> None:
    """The second key's ``cas`` fails (someone wrote it after our ``gets``): the first key's write
    is put back before the retry, so the check charges each key once."""
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    limits = make_limits("10/hour; 100/day")
    keys = [_key(limit) for limit in limits]
    try:
        store.hit_blocking(keys, limits, [1.0, 1.0])
        original = store._sync_write
        raced = []

        def write(client, key, data, token, exptime, written):  # type: ignore[no-untyped-def]
            if key == memcached_key(keys[1]) and not raced:
                raced.append(key)
                value, token_now = client.gets(key)  # rewritten as it is: a new CAS token, our cas fails
                assert client.cas(key, value, token_now, expire=3600, noreply=False)
            return original(client, key, data, token, exptime, written)

        store._sync_write = write  # type: ignore[method-assign]
        assert store.hit_blocking(keys, limits, [1.0, 1.0]).allowed
        assert raced and store.cas_conflicts == 1
        assert [d.remaining for d in await store.peek(keys, limits)] == [8, 98]
    finally:
        await store.close()


async def test_a_write_that_fails_puts_back_what_the_check_wrote(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    limits = make_limits("10/hour; 100/day")
    keys = [_key(limit) for limit in limits]
    try:
        store.hit_blocking(keys, limits, [1.0, 1.0])
        original = store._sync_write

        def write(client, key, data, token, exptime, written):  # type: ignore[no-untyped-def]
            if key == memcached_key(keys[1]):
                try:
                    raise ConnectionResetError("lost")
                except ConnectionResetError as exc:
                    from ratewarden.stores.memcached.sync_client import _Interrupted

                    raise _Interrupted(list(written[:-1]), token, False) from exc
            return original(client, key, data, token, exptime, written)

        store._sync_write = write  # type: ignore[method-assign]
        with pytest.raises(StoreError) as failed:
            store.hit_blocking(keys, limits, [1.0, 1.0])
        assert failed.value.reason == "unreachable"
        store._sync_write = original  # type: ignore[method-assign]
        store.close_blocking()  # the put-back is done
        assert [d.remaining for d in await store.peek(keys, limits)] == [9, 99]
        assert store._sync_held == set() and store._sync_settling == set()
    finally:
        await store.close()


@pytest.mark.memcached
async def test_a_put_back_that_fails_is_tried_again(memcached_server: Memcached) -> None:
    """The put-back thread's first attempt fails (no reply in time): it tries again, as the async
    path's put-backs do. It gave up at once, the first key stayed charged and the second not."""
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    limits = make_limits("10/hour; 100/day")
    keys = [_key(limit) for limit in limits]
    try:
        store.hit_blocking(keys, limits, [1.0, 1.0])
        original_write, original_undo = store._sync_write, store._sync_undo
        undos = 0

        def write(client, key, data, token, exptime, written):  # type: ignore[no-untyped-def]
            if key == memcached_key(keys[1]):
                try:
                    raise ConnectionResetError("lost")
                except ConnectionResetError as exc:
                    from ratewarden.stores.memcached.sync_client import _Interrupted

                    raise _Interrupted(list(written[:-1]), token, False) from exc
            return original_write(client, key, data, token, exptime, written)

        def undo(client, writes):  # type: ignore[no-untyped-def]
            nonlocal undos
            undos += 1
            if undos == 1:
                raise TimeoutError("timed out")
            original_undo(client, writes)

        store._sync_write = write  # type: ignore[method-assign]
        store._sync_undo = undo  # type: ignore[method-assign]
        with pytest.raises(StoreError):
            store.hit_blocking(keys, limits, [1.0, 1.0])
        store.close_blocking()  # the put-back is done
        store._sync_write, store._sync_undo = original_write, original_undo  # type: ignore[method-assign]
        assert [d.remaining for d in await store.peek(keys, limits)] == [9, 99]
        assert undos == 2
        assert store._sync_held == set() and store._sync_settling == set()
    finally:
        await store.close()


@pytest.mark.memcached
async def test_a_killed_server_fails_within_two_timeouts() -> None:
    server = Memcached().start()  # a memcached of this test's own, killed by it
    store = MemcachedStore(server.url, timeout=0.2)
    (limit,) = make_limits("10/min")
    key = _key(limit)
    try:
        assert store.hit_blocking([key], [limit], [1.0]).allowed  # a connection is open
        server.close()
        for _ in range(3):  # the open connection is lost, then the reconnect is refused
            with Stopwatch() as clock, pytest.raises(StoreError) as failed:
                store.hit_blocking([key], [limit], [1.0])
            assert clock.within(0.4), clock
            assert failed.value.reason == "unreachable"
        assert store._sync_held == set()
    finally:
        await store.close()
        server.close()


async def test_a_paused_server_fails_within_two_timeouts(private_memcached: Memcached) -> None:
    store = MemcachedStore(private_memcached.url, timeout=0.2)
    limits = make_limits("10/min; 100/hour")
    keys = [_key(limit) for limit in limits]
    try:
        assert store.hit_blocking(keys, limits, [1.0, 1.0]).allowed
        with private_memcached.server.paused():
            with Stopwatch() as clock, pytest.raises(StoreError, match="no reply within 200 ms") as failed:
                store.hit_blocking(keys, limits, [1.0, 1.0])
            assert failed.value.reason == "timeout"
            assert clock.within(0.4), clock
            # many threads on the key at once: every one fails, within about two timeouts
            with Stopwatch() as clock:
                outcomes = _flood(lambda: _outcome(lambda: store.hit_blocking(keys, limits, [1.0, 1.0])), 20)
            assert clock.within(0.4 + 0.1), clock
            assert all(isinstance(o, StoreError) and o.reason == "timeout" for o in outcomes), outcomes
        # back: the store answers again, and nothing was charged by the checks that failed
        assert [d.remaining for d in await store.peek(keys, limits)] == [9, 99]
        assert store.hit_blocking(keys, limits, [1.0, 1.0]).remaining == 8
    finally:
        await store.close()


async def test_a_write_without_answer_is_put_back_once_it_lands(private_memcached: Memcached) -> None:
    """The server pauses between the ``gets`` and the ``cas``: the check fails (timeout); the write
    lands once the server is back, and the put-back thread undoes it, holding the key meanwhile."""
    store = MemcachedStore(private_memcached.url, timeout=0.2)
    (limit,) = make_limits("10/hour")
    key = _key(limit)
    try:
        assert store.hit_blocking([key], [limit], [1.0]).allowed
        original = store._sync_write

        def write(client, mkey, data, token, exptime, written):  # type: ignore[no-untyped-def]
            private_memcached.server.pause()
            return original(client, mkey, data, token, exptime, written)

        store._sync_write = write  # type: ignore[method-assign]
        with pytest.raises(StoreError, match="no reply"):
            store.hit_blocking([key], [limit], [1.0])
        store._sync_write = original  # type: ignore[method-assign]
        assert store._sync_settling == {memcached_key(key)}
        with Stopwatch() as clock, pytest.raises(StoreError, match="no reply"):  # the key waits for its put-back: bounded
            store.hit_blocking([key], [limit], [1.0])
        assert clock.within(0.4 + 0.1), clock
        private_memcached.server.resume()
        store.close_blocking()  # waits for the put-back
        assert store._sync_settling == set() and store._sync_held == set()
        (peeked,) = await store.peek([key], [limit])
        assert peeked.remaining == 9  # only the first check is charged
    finally:
        private_memcached.server.resume()
        await store.close()


async def test_close_closes_the_sync_connections(memcached_server: Memcached) -> None:
    store = MemcachedStore(memcached_server.url, timeout=0.5)
    (limit,) = make_limits("10/min")
    key = _key(limit)
    _flood(lambda: store.hit_blocking([key], [limit], [1.0]), 4)
    clients = list(store._sync_free)
    assert clients and any(c.sock is not None for c in clients)
    await store.close()
    assert store._sync_free == [] and all(c.sock is None for c in clients)
    assert store.hit_blocking([key], [limit], [1.0]).allowed  # usable, keeping no connection
    assert all(c.sock is None for c in store._sync_free)


def _outcome(call: Callable[[], Decision]) -> Decision | BaseException:
    try:
        return call()
    except BaseException as exc:
        return exc


async def test_a_forked_child_does_not_use_its_parents_connections(memcached_server: Memcached) -> None:
    import os
    import warnings

    store = MemcachedStore(memcached_server.url, timeout=0.5)
    (limit,) = make_limits("10/hour")
    key = _key(limit)
    try:
        assert store.hit_blocking([key], [limit], [1.0]).allowed
        parents = list(store._sync_free)
        with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            ok = store.hit_blocking([key], [limit], [1.0]).remaining == 8 and not any(c in parents for c in store._sync_free)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store._sync_free == parents
        assert store.hit_blocking([key], [limit], [1.0]).remaining == 7
    finally:
        await store.close()
