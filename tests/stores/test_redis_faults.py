"""RedisStore under faults: a paused server, a busy loop, odd keys, many limits, a dead host name."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ratewarden import Limiter
from ratewarden.decision import Decision
from ratewarden.limits import Limit, make_limits
from ratewarden.rates import Rate
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import SCRIPT, RedisStore
from tests.servers import RedisCluster, RedisStandalone, Server
from tests.timing import Stopwatch


@pytest.fixture
def private_redis() -> Iterator[RedisStandalone]:
    """A server of this test's own: it gets paused."""
    server = RedisStandalone().start()
    yield server
    assert server.server.proc is not None
    os.kill(server.server.proc.pid, signal.SIGCONT)
    server.close()


@pytest.mark.parametrize("coalesce", [True, False])
async def test_checks_refused_while_paused_are_never_charged(private_redis: RedisStandalone, coalesce: bool) -> None:
    store = RedisStore(private_redis.url, timeout=0.05, coalesce=coalesce)
    limiter = Limiter(store, on_error="closed")
    key = uuid.uuid4().hex
    try:
        # Connected first (TIME, the script): on a loaded machine that can outlast the 50 ms.
        await _peek_when_back(store, f"rw:{{warm|{key}}}:x", make_limits("1000/hour")[0])
        assert (await limiter.hit(key, "1000/hour", algorithm="fixed_window")).remaining == 999
        refused = 0
        with private_redis.server.paused():
            for _ in range(5):  # several pipelines, sent on the open connection or queued
                results = await asyncio.gather(
                    *(limiter.hit(key, "1000/hour", algorithm="fixed_window") for _ in range(20)),
                    return_exceptions=True,
                )
                assert all(isinstance(r, StoreError) for r in results), results
                refused += len(results)
            await asyncio.sleep(0.1)
        assert refused == 100
        await asyncio.sleep(0.3)  # the server runs whatever it had queued
        decision = await limiter.peek(key, "1000/hour", algorithm="fixed_window")
        assert decision.remaining == 999  # only the check answered before the pause
        assert (await limiter.hit(key, "1000/hour", algorithm="fixed_window")).remaining == 998
    finally:
        await limiter.close()


async def _peek_when_back(store: RedisStore, key: str, limit: Limit) -> Decision:
    """The key's decision once its node answers again (after running what it had queued)."""
    started = time.monotonic()
    while True:
        try:
            return (await store.peek([key], [limit]))[0]
        except StoreError:
            assert time.monotonic() - started < 10, "the cluster did not come back"
            await asyncio.sleep(0.05)


def _key_away_from(store: RedisStore, avoid: set[int], tag: str) -> str:
    """A key whose slot a primary not on the ``avoid`` ports serves (the client is initialized)."""
    for n in itertools.count():
        key = f"rw:{{{tag}|{n}}}:x"
        if store.client.get_node_from_key(key).port not in avoid:
            return key
    raise AssertionError  # pragma: no cover - itertools.count() never ends


def _process_serving(cluster: RedisCluster, store: RedisStore, key: str) -> Server:
    port = store.client.get_node_from_key(key).port
    return next(s for s in cluster.servers if s.port == port)


async def test_a_new_cluster_stores_first_checks_carry_their_deadline(redis_cluster: RedisCluster) -> None:
    """The first pipeline of a Cluster store was encoded before the server clock was measured and
    went without a deadline: refused because its node was paused, it was charged on resume."""
    store = RedisStore(redis_cluster.url, timeout=0.1)
    (limit,) = make_limits("10/hour", "gcra")
    try:
        await store.client.initialize()  # discovery only: no script sent, the clock not measured
        key = _key_away_from(store, {store.client.get_default_node().port}, uuid.uuid4().hex)  # TIME still answers
        await store.client.script_load(SCRIPT)  # on every primary, as once any process used the cluster
        await store.reset([key])  # a first call that is no check opens the connection to the key's node
        with _process_serving(redis_cluster, store, key).paused():
            results = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(3)), return_exceptions=True)
            assert all(isinstance(r, StoreError) for r in results), results
        assert (await _peek_when_back(store, key, limit)).remaining == 10  # before: 7
    finally:
        await store.close()


async def test_a_slow_first_contact_does_not_make_cluster_deadlines_late(
    redis_cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server clock's offset was measured around the client's first call, cluster discovery
    included: half of that (tens of ms under load) went into every deadline, past the margin, so
    checks refused while their node was paused were charged when it resumed right after."""
    monkeypatch.setattr("ratewarden.stores.redis.pipeline._MAX_EXTENSIONS", 0)  # callers give up at the timeout
    store = RedisStore(redis_cluster.url, timeout=0.2)
    (limit,) = make_limits("10/hour", "gcra")
    startup = next(s for s in redis_cluster.servers if s.port == redis_cluster.ports[0])
    try:
        startup.pause()  # discovery asks this node first: it answers 0.15 s late
        threading.Timer(0.15, startup.resume).start()
        key = f"rw:{{{uuid.uuid4().hex}}}:x"
        assert (await _peek_when_back(store, key, limit)).remaining == 10  # connected to its node, script loaded
        with _process_serving(redis_cluster, store, key).paused():
            results = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(3)), return_exceptions=True)
            assert all(isinstance(r, StoreError) for r in results), results
        assert (await _peek_when_back(store, key, limit)).remaining == 10  # before: 7
    finally:
        startup.resume()
        await store.close()


async def test_a_busy_loop_stretches_a_check_to_at_most_two_timeouts(private_redis: RedisStandalone) -> None:
    store = RedisStore(private_redis.url, timeout=0.1)
    (limit,) = make_limits("10/min")
    key = f"rw:{{busy|{uuid.uuid4().hex}}}:{limit.suffix}"
    await store.hit([key], [limit], [1.0])
    stop = False

    async def hog() -> None:  # every loop pass blocks for longer than the timeout
        while not stop:
            time.sleep(0.15)
            await asyncio.sleep(0)

    try:
        with private_redis.server.paused():
            hogging = asyncio.create_task(hog())
            with Stopwatch() as clock, pytest.raises(StoreError, match="no reply within 100 ms"):
                await store.hit([key], [limit], [1.0])
            stop = True
            await hogging
        # 2 timeouts (0.2 s) plus the loop's own lag, at most 4 blocked passes (0.6 s): 0.75 s
        # measured; re-arming the timer 3 times, as before, took 1.35 s. The bound leaves room for a
        # loaded machine (1.0 failed once in a combined run).
        assert clock.within(1.2), clock
    finally:
        await store.close()


async def test_a_call_through_the_client_waits_the_timeout_it_was_given(private_redis: RedisStandalone) -> None:
    """redis-py's read timeout (the client's: a reset's, every Cluster check's) was 1 s whatever
    the store's ``timeout``: with ``timeout=10``, a server paused 2.5 s failed the call after 2 s
    (1 s, then redis-py's one retry)."""
    store = RedisStore(private_redis.url, timeout=10)
    (limit,) = make_limits("10/hour")
    key = f"rw:{{wait|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        assert (await store.hit([key], [limit], [1.0])).remaining == 9
        await store.reset([key])  # the client's connection is open
        assert (await store.hit([key], [limit], [1.0])).remaining == 9
        private_redis.server.pause()
        threading.Timer(2.5, private_redis.server.resume).start()
        await store.reset([key])
        assert (await store.peek([key], [limit]))[0].remaining == 10
    finally:
        private_redis.server.resume()
        await store.close()


async def test_lone_surrogate_keys_work_like_on_the_other_stores(redis_standalone: RedisStandalone) -> None:
    for coalesce in (True, False):
        limiter = Limiter(RedisStore(redis_standalone.url, timeout=5, coalesce=coalesce))
        key = f"bad-\udc80-{uuid.uuid4().hex}"
        try:
            assert (await limiter.hit(key, "2/min")).remaining == 1
            assert (await limiter.hit(key, "2/min; 10/hour", algorithm="gcra")).remaining == 1
            assert (await limiter.peek(key, "2/min")).remaining == 1
            await limiter.reset(key, "2/min")
            assert (await limiter.peek(key, "2/min")).remaining == 2
        finally:
            await limiter.close()


async def test_lone_surrogate_keys_on_a_cluster(redis_cluster: RedisCluster) -> None:
    store = RedisStore(redis_cluster.url, timeout=5)
    limits = make_limits("2/min", "gcra")
    keys = [f"rw:{{\ud800-{uuid.uuid4().hex}}}:a", f"rw:{{\udfff-{uuid.uuid4().hex}}}:b"]
    try:
        decision = await store.hit(keys, limits * 2, [1.0, 1.0])  # spans slots
        assert decision.allowed and decision.remaining == 1
        await store.reset(keys)
    finally:
        await store.close()


async def test_limit_argument_caches_keep_filling_and_stay_bounded(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    limits = [Limit(Rate(1000 + n, 3600), "gcra") for n in range(5000)]
    try:
        for start in range(0, len(limits), 500):
            chunk = limits[start : start + 500]
            await asyncio.gather(*(store.hit([f"rw:{{lru|{n}}}:x"], [limit], [1.0]) for n, limit in enumerate(chunk)))
        assert limits[-1] in store._pipeline.encoding.limit_packed and limits[-1] in store._args.limit_args  # a late limit is cached
        assert limits[0] not in store._pipeline.encoding.limit_packed  # the oldest went
        assert len(store._pipeline.encoding.limit_packed) <= 4096 and len(store._args.limit_args) <= 4096
    finally:
        await store.clear()
        await store.close()


def test_closing_a_store_whose_host_never_resolved_does_not_delay_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def slow_resolver(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host == "slow-dns.invalid":
            time.sleep(2.0)  # a resolver that never answers in time
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)

    async def main() -> None:
        store = RedisStore("redis://slow-dns.invalid:6379/0", timeout=0.05, connect_timeout=0.2)
        (limit,) = make_limits("1/s")
        with pytest.raises(StoreError):
            await store.hit(["rw:{x}:a"], [limit], [1.0])
        await store.close()

    with Stopwatch() as clock:
        asyncio.run(main())
    assert clock.within(1.0), clock


def _disconnect_all(store: RedisStore) -> list[object]:
    """Every connection the store's async client holds (its pool's, or each cluster node's), and the
    store's own pipeline connections."""
    conns: list[object] = list(getattr(store._connections, "made", []))
    client = store._client
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        conns += [*pool._in_use_connections, *pool._available_connections]
    for node in client.get_nodes() if hasattr(client, "get_nodes") else ():
        conns += list(node._connections)
    return conns


@pytest.mark.parametrize(("kind", "coalesce"), [("standalone", False), ("cluster", True), ("cluster", False)])
async def test_a_connection_closed_under_a_call_is_a_store_error(
    redis_standalone: RedisStandalone, redis_cluster: RedisCluster, kind: str, coalesce: bool
) -> None:
    """Connections closed by another task while checks use them (as a failover's reconnects do):
    redis-py then writes to a writer that is gone (``'NoneType' object has no attribute
    'writelines'``). Every check fails with the store's ``StoreError``, a closed connection as
    ``unreachable``, so the failure policy applies; none raises the ``AttributeError``."""
    url = redis_standalone.url if kind == "standalone" else redis_cluster.url
    store = RedisStore(url, timeout=0.5, coalesce=coalesce)
    (limit,) = make_limits("1000000/hour")
    prefix = uuid.uuid4().hex[:8]
    failures: list[BaseException] = []

    async def check(i: int) -> None:
        try:
            await store.hit([f"rw:{{{prefix}{i % 50}}}:x"], [limit], [1.0])
        except Exception as exc:
            failures.append(exc)

    writers: dict[int, Any] = {}  # every connection's stream writer seen, to be sure it is shut at the end

    async def close_connections() -> None:
        for _ in range(100):
            await asyncio.sleep(0)
            for conn in _disconnect_all(store):
                writer = getattr(conn, "_writer", None)
                if writer is not None:
                    writers[id(writer)] = writer
                if conn.is_connected:  # type: ignore[attr-defined]
                    await conn.disconnect(nowait=True)  # type: ignore[attr-defined]

    try:
        await store.hit([f"rw:{{{prefix}}}:x"], [limit], [1.0])
        # A race: how often a check meets a closed connection depends on the scheduling (a busy
        # machine's, or a compiled build's, can miss it many rounds in a row), so rounds go on until
        # one did, at most 60.
        for _ in range(60):
            await asyncio.gather(close_connections(), *(check(i) for i in range(1000)))
            if failures:
                break
    finally:
        await store.close()
        # A connection closed with nowait=True shuts its socket only once its buffer is written, which
        # a node busy with this test's checks may not read before the loop ends: abort what is left.
        await asyncio.sleep(0.2)
        for writer in writers.values():
            writer.transport.abort()
        await asyncio.sleep(0)
    # On one node, a closed connection always meets a check within the rounds; the cluster client
    # may reconnect a node's connection before any check uses it (so with the newest CPython and
    # redis-py no round met one): there the point is that nothing but a StoreError escapes.
    assert failures or kind == "cluster", "no check met a closed connection"
    assert all(isinstance(f, StoreError) for f in failures), {type(f).__name__ for f in failures}
    closed = [f for f in failures if "writelines" in str(f) or "closed" in str(f).lower()]
    assert all(f.reason == "unreachable" for f in closed), {(f.reason, str(f)[:120]) for f in closed}  # type: ignore[attr-defined]
