"""A coalesced Redis pipeline whose timeout fires before its task starts gives its slot back: the
store keeps sending pipelines afterwards (and never sends the expired check)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisStandalone


async def test_a_redis_pipeline_expiring_before_its_task_starts_frees_its_slot(
    redis_standalone: RedisStandalone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline whose timeout fired before its task took its first step was cancelled without
    running, so its slot (one of ``pool_size``) was never given back: after ``pool_size`` of
    those (seen under wrk at 1,000 connections, scripts/soak.py) no pipeline was ever sent again
    and every check timed out with Redis up."""
    monkeypatch.setattr("ratewarden.stores.redis.pipeline._MAX_EXTENSIONS", 0)  # a late timer expires
    store = RedisStore(redis_standalone.url, timeout=0.05, pool_size=1)
    (limit,) = make_limits("100/hour", "gcra")
    key = f"rw:{{slot|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        assert (await store.hit([key], [limit], [1.0])).allowed
        loop = asyncio.get_running_loop()
        check = asyncio.ensure_future(store.hit([key], [limit], [1.0]))
        # The loop is busy (a CPU-bound handler) right after the check is queued: when it comes
        # back, the pipeline's task is created and its timer fires in the same pass.
        loop.call_soon(time.sleep, 0.08)
        with pytest.raises(StoreError):
            await check
        await asyncio.sleep(0.01)
        decision = await asyncio.wait_for(store.hit([key], [limit], [1.0]), 5)
        assert decision.allowed and decision.remaining == 98  # the expired check was never sent
    finally:
        await store.close()
