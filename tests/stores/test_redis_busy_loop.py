"""A busy event loop is not a slow store: checks on a healthy Redis are answered, never timed out,
however far behind the loop runs, and a silent Redis still fails them on time.

Before, a pipeline's timer counted the loop's backlog against the store: 150 concurrent checks
on a busy machine admitted 106-150 against 100 in 10 of 40 rounds (fail-open), and a freshly
started store hit by a burst admitted 138-167 against 100 (its first pipelines connected,
measured the clock and came back ``NOSCRIPT`` under a busy loop).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisCluster, RedisStandalone, redis_cmd
from tests.timing import Stopwatch


class Hog:
    """Blocks the loop for ``slice_s`` at every pass it gets: a CPU-bound handler, or a backlog of
    a thousand requests, as the store's timers see it."""

    def __init__(self, slice_s: float) -> None:
        self.slice_s = slice_s
        self.stop = False
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self.stop:
            time.sleep(self.slice_s)
            await asyncio.sleep(0)

    async def __aenter__(self) -> Hog:
        self.task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop = True
        if self.task is not None:
            await self.task


async def _burst(store: RedisStore, key: str, n: int, rate: str = "100/hour") -> list[object]:
    (limit,) = make_limits(rate, "fixed_window")
    return await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(n)), return_exceptions=True)


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
@pytest.mark.parametrize("slice_s", [0.03, 0.15])
async def test_a_busy_loop_never_turns_a_healthy_check_into_a_timeout(
    redis_standalone: RedisStandalone, redis_cluster: RedisCluster, topology: str, slice_s: float
) -> None:
    """Every loop pass blocks for longer than the store's timeout (0.03 s against a 0.025 s
    timeout, 0.15 s against 0.1 s), wave after wave: exactly the limit is allowed, no check fails."""
    url = redis_standalone.url if topology == "standalone" else redis_cluster.url
    store = RedisStore(url, timeout=0.025 if slice_s < 0.1 else 0.1)
    key = f"rw:{{busy|{uuid.uuid4().hex}}}:x"
    try:
        await _burst(store, key, 1, "1/hour")  # connected and measured: the steady state
        key = f"rw:{{busy|{uuid.uuid4().hex}}}:x"
        async with Hog(slice_s):
            results = []
            for _ in range(3):  # several waves, each coalesced into pipelines behind the hog
                results += await _burst(store, key, 100)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]
        assert sum(1 for r in results if r.allowed) == 100  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_a_new_store_hit_by_a_burst_on_a_busy_loop_is_exact(redis_standalone: RedisStandalone) -> None:
    """A new store (not connected, clock not measured) on a server that lost its scripts, hit by
    300 checks at once while the loop is busy: all answered, exactly 100 allowed."""
    redis_cmd(redis_standalone.port, "SCRIPT", "FLUSH")
    store = RedisStore(redis_standalone.url)
    key = f"rw:{{fresh|{uuid.uuid4().hex}}}:x"
    try:
        async with Hog(0.03):
            results = await _burst(store, key, 300)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]
        assert sum(1 for r in results if r.allowed) == 100  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_a_flushed_script_is_loaded_once_not_sent_with_every_check(redis_standalone: RedisStandalone) -> None:
    """``SCRIPT FLUSH`` under a connected store: the next pipeline comes back ``NOSCRIPT``; the
    script is loaded once and the checks go again by hash (no ``EVAL`` of the whole script)."""
    store = RedisStore(redis_standalone.url, timeout=1)
    key = f"rw:{{flush|{uuid.uuid4().hex}}}:x"
    try:
        await _burst(store, key, 1)
        redis_cmd(redis_standalone.port, "SCRIPT", "FLUSH")
        redis_cmd(redis_standalone.port, "CONFIG", "RESETSTAT")
        results = await _burst(store, key, 50)
        assert sum(1 for r in results if not isinstance(r, BaseException) and r.allowed) == 50
        stats = redis_cmd(redis_standalone.port, "INFO", "commandstats")
        assert "cmdstat_eval:" not in stats, stats
        assert "cmdstat_script|load:" in stats or "cmdstat_script:" in stats, stats
    finally:
        await store.close()


async def test_a_silent_server_still_fails_a_check_on_a_busy_loop(redis_standalone: RedisStandalone) -> None:
    """Paused (SIGSTOP) while the loop is busy: nothing arrives, so the check fails after about
    one timeout plus the loop's lag, not after every extension a busy loop could claim."""
    server = RedisStandalone().start()
    store = RedisStore(server.url, timeout=0.1)
    key = f"rw:{{silent|{uuid.uuid4().hex}}}:x"
    try:
        await _burst(store, key, 1)
        (limit,) = make_limits("100/hour", "fixed_window")
        with server.server.paused():
            async with Hog(0.05):
                with Stopwatch() as clock, pytest.raises(StoreError, match="no reply within 100 ms"):
                    await store.hit([key], [limit], [1.0])
        assert clock.within(0.6), clock  # 0.1 s timeout + a few 0.05 s passes of the hog
    finally:
        await store.close()
        server.close()
