"""Redis-specific behaviour: commands per check, the rejection cache, Sentinel failover, URLs."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.urls import parse_store_url
from tests.servers import RedisSentinel, RedisStandalone, redis_cmd


def command_calls(port: int) -> dict[str, int]:
    stats = {}
    for line in redis_cmd(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            stats[name.removeprefix("cmdstat_")] = int(rest.split(",")[0].split("=")[1])
    return stats


async def test_one_script_call_per_check_and_none_for_cached_rejections(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    limits = make_limits("5/day; 100/day", "sliding_window")
    keys = [f"rw:{{cmd|{uuid.uuid4().hex}}}:{limit.suffix}" for limit in limits]
    try:
        await store.hit(keys, limits, [1.0, 1.0])  # loads the script if needed
        redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
        decisions = [await store.hit(keys, limits, [1.0, 1.0]) for _ in range(5)]
        assert [d.allowed for d in decisions] == [True] * 4 + [False]
        after_checks = command_calls(redis_standalone.port)
        assert after_checks.get("evalsha") == 5
        assert "eval" not in after_checks
        for _ in range(20):
            cached = await store.hit(keys, limits, [1.0, 1.0])
            assert not cached.allowed and 0 < cached.retry_after <= decisions[-1].retry_after
        assert command_calls(redis_standalone.port).get("evalsha") == 5
        assert store.cached_rejections == 20
        # Coalesced: 60 concurrent checks, still exactly one script call each.
        other = [f"rw:{{cmd2|{uuid.uuid4().hex}}}:{limit.suffix}" for limit in limits]
        redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
        results = await asyncio.gather(*(store.hit(other, limits, [1.0, 1.0]) for _ in range(60)))
        assert sum(d.allowed for d in results) == 5
        assert command_calls(redis_standalone.port).get("evalsha") == 60
    finally:
        await store.close()


async def test_cached_rejection_ends_at_retry_time_and_on_reset(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    (limit,) = make_limits("2/200ms", "gcra")
    key = f"rw:{{ttl|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        assert (await store.hit([key], [limit], [1.0])).allowed
        assert (await store.hit([key], [limit], [1.0])).allowed
        denied = await store.hit([key], [limit], [1.0])
        assert not denied.allowed
        await asyncio.sleep(denied.retry_after + 0.01)
        assert (await store.hit([key], [limit], [1.0])).allowed  # the cache let go in time
        assert not (await store.hit([key], [limit], [1.0])).allowed
        await store.reset([key])
        assert (await store.hit([key], [limit], [1.0])).allowed  # reset also clears the cache
    finally:
        await store.close()


async def test_noscript_is_reloaded(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    (limit,) = make_limits("3/min", "token_bucket")
    try:
        redis_cmd(redis_standalone.port, "SCRIPT", "FLUSH")
        key = f"rw:{{ns|{uuid.uuid4().hex}}}:{limit.suffix}"
        assert (await store.hit([key], [limit], [1.0])).remaining == 2
        redis_cmd(redis_standalone.port, "SCRIPT", "FLUSH")
        results = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(4)))
        assert sum(d.allowed for d in results) == 2
    finally:
        await store.close()


async def test_clear_deletes_only_prefixed_keys(redis_standalone: RedisStandalone) -> None:
    prefix = f"rwclear{uuid.uuid4().hex[:6]}"
    store = RedisStore(redis_standalone.url, timeout=5, prefix=prefix)
    (limit,) = make_limits("1/min", "fixed_window")
    key = f"{prefix}:{{c|x}}:{limit.suffix}"
    redis_cmd(redis_standalone.port, "SET", "unrelated-key", "1")
    try:
        await store.hit([key], [limit], [1.0])
        assert not (await store.hit([key], [limit], [1.0])).allowed
        await store.clear()
        assert (await store.hit([key], [limit], [1.0])).allowed
        assert redis_cmd(redis_standalone.port, "GET", "unrelated-key") == "1"
    finally:
        await store.close()


async def test_cluster_clear_and_reset(redis_cluster) -> None:  # type: ignore[no-untyped-def]
    prefix = f"rwc{uuid.uuid4().hex[:6]}"
    store = RedisStore(redis_cluster.url, timeout=5, prefix=prefix)
    (limit,) = make_limits("1/min", "leaky_bucket")
    keys = [f"{prefix}:{{k{i}|x}}:{limit.suffix}" for i in range(20)]
    try:
        for key in keys:
            await store.hit([key], [limit], [1.0])
        assert not any([(await store.hit([k], [limit], [1.0])).allowed for k in keys])
        await store.reset(keys[:10])
        assert all([(await store.hit([k], [limit], [1.0])).allowed for k in keys[:10]])
        await store.clear()
        assert all([(await store.hit([k], [limit], [1.0])).allowed for k in keys])
    finally:
        await store.close()


async def test_sentinel_follows_failover() -> None:
    setup = RedisSentinel().start()
    store = RedisStore(setup.url, timeout=1)
    (limit,) = make_limits("1000/day", "fixed_window")
    key = f"rw:{{fo|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        first = setup.master_port()
        assert (await store.hit([key], [limit], [1.0])).allowed
        redis_cmd(first, "WAIT", "1", "1000")
        setup.primary.stop()
        deadline = time.monotonic() + 20
        failures = 0
        while True:
            try:
                decision = await store.hit([key], [limit], [1.0])
                if setup.master_port() != first:
                    break
            except StoreError:
                failures += 1
            assert time.monotonic() < deadline, "no failover within 20 s"
            await asyncio.sleep(0.1)
        assert failures > 0  # the old primary really went away
        assert setup.master_port() == setup.replica.port
        assert decision.allowed and decision.remaining <= 998  # state survived (replicated)
    finally:
        await store.close()
        setup.close()


def test_urls() -> None:
    cfg = parse_store_url("rediss://user:p%40ss@example.com:6380/2?pool_size=4&timeout=0.02", ("standalone",))
    assert (cfg.kind, cfg.tls, cfg.hosts, cfg.db, cfg.username, cfg.password) == (
        "standalone", True, [("example.com", 6380)], 2, "user", "p@ss"
    )
    assert cfg.options == {"pool_size": 4, "timeout": 0.02}
    assert "p@ss" not in cfg.text and "p%40ss" not in cfg.text
    cfg = parse_store_url("redis+sentinel://a:1,b:2/mymaster/3", ("sentinel",))
    assert (cfg.hosts, cfg.service, cfg.db) == ([("a", 1), ("b", 2)], "mymaster", 3)
    cfg = parse_store_url("redis+cluster://[::1]:7000", ("cluster",))
    assert cfg.hosts == [("::1", 7000)]
    with pytest.raises(ValueError, match="unknown option 'pool'"):
        parse_store_url("redis://h?pool=3", ("standalone",))
    with pytest.raises(ValueError, match="Sentinel service"):
        parse_store_url("redis+sentinel://h:26379", ("sentinel",))
    with pytest.raises(ValueError, match="scheme must be one of"):
        parse_store_url("http://h", ("standalone", "cluster"))
    with pytest.raises(ValueError, match="timeout='x' must be a number"):
        RedisStore("redis://127.0.0.1:1?timeout=x")


async def test_one_bad_check_does_not_fail_its_pipeline(redis_standalone: RedisStandalone) -> None:
    """An error reply (a key of the wrong type) fails only its own check; the other checks of the
    same coalesced pipeline get their answers, and the connection stays usable."""
    store = RedisStore(redis_standalone.url, timeout=5)
    (limit,) = make_limits("10/min", "fixed_window")
    tag = uuid.uuid4().hex
    bad = f"rw:{{bad|{tag}}}:{limit.suffix}"
    redis_cmd(redis_standalone.port, "HSET", bad, "f", "v")
    good = [f"rw:{{good{i}|{tag}}}:{limit.suffix}" for i in range(20)]
    try:
        results = await asyncio.gather(
            *(store.hit([key], [limit], [1.0]) for key in [*good[:10], bad, *good[10:]]), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], StoreError) and "WRONGTYPE" in str(errors[0])
        assert all(not isinstance(r, BaseException) and r.allowed and r.remaining == 9 for r in results[:10])
        assert (await store.hit(good[:1], [limit], [1.0])).remaining == 8
    finally:
        await store.close()


async def test_close_releases_connections(redis_standalone: RedisStandalone) -> None:
    name = f"rwclose{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{redis_standalone.url}?client_name={name}", timeout=5)
    (limit,) = make_limits("10/min", "gcra")
    await asyncio.gather(*(store.hit([f"rw:{{close{i}|x}}:{limit.suffix}"], [limit], [1.0]) for i in range(30)))
    assert name in redis_cmd(redis_standalone.port, "CLIENT", "LIST")
    await store.close()
    await asyncio.sleep(0.05)
    assert name not in redis_cmd(redis_standalone.port, "CLIENT", "LIST")


async def test_demoted_primary_drops_the_connection() -> None:
    """A READONLY reply (the server became a replica, as an old primary does after a Sentinel
    failover) fails the check and drops the connection, so the next check reconnects."""
    server = RedisStandalone().start()
    name = f"rwro{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{server.url}?client_name={name}", timeout=5)
    (limit,) = make_limits("10/min", "token_bucket")
    key = f"rw:{{ro|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        assert (await store.hit([key], [limit], [1.0])).allowed
        redis_cmd(server.port, "REPLICAOF", "127.0.0.1", "1")
        with pytest.raises(StoreError, match="ReadOnlyError"):
            await store.hit([key], [limit], [1.0])
        assert f"name={name}" not in redis_cmd(server.port, "CLIENT", "LIST")
        redis_cmd(server.port, "REPLICAOF", "NO", "ONE")
        assert (await store.hit([key], [limit], [1.0])).remaining == 8
    finally:
        await store.close()
        server.close()


@pytest.mark.parametrize("extensions", [4, 0], ids=["default", "no-busy-extension"])
async def test_a_busy_event_loop_does_not_time_out_a_healthy_check(
    redis_standalone: RedisStandalone, extensions: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout bounds the store, not the loop: a 100 ms CPU-bound stretch on the loop while a
    check is in flight must not turn the check into a timeout (and, failing open, an allowance).
    Not even with no re-arm for a busy loop: the reply has arrived on the connection, so the
    store answered (before, with no re-arm the late timer won over the waiting reply)."""
    import ratewarden.stores.redis.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_MAX_EXTENSIONS", extensions)
    store = RedisStore(redis_standalone.url, timeout=0.02)
    (limit,) = make_limits("5/min")
    key = f"rw:{{busy|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        await store.hit([key], [limit], [1.0])  # connect and load the script first
        check = asyncio.ensure_future(store.hit([key], [limit], [1.0]))
        asyncio.get_running_loop().call_soon(time.sleep, 0.1)  # the loop is busy for 100 ms
        assert (await check).allowed
    finally:
        await store.close()
