"""A coalesced Redis pipeline whose timer fires before its task starts is waiting on our own loop,
not on the store: it is answered, not failed, and the store keeps sending pipelines afterwards."""

from __future__ import annotations

import asyncio
import time
import uuid

from ratewarden.limits import make_limits
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisStandalone


async def test_a_redis_pipeline_whose_timer_fires_before_its_task_starts_is_answered(
    redis_standalone: RedisStandalone,
) -> None:
    """Its timer fired before its task took its first step (a CPU-bound handler held the loop):
    the time was our loop's, not the store's. It used to fail (and, before that, keep its slot
    (one of ``pool_size``) so that no pipeline was ever sent again: seen under wrk at 1,000
    connections, scripts/soak.py)."""
    store = RedisStore(redis_standalone.url, timeout=0.05, pool_size=1)
    (limit,) = make_limits("100/hour", "gcra")
    key = f"rw:{{slot|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        assert (await store.hit([key], [limit], [1.0])).allowed
        loop = asyncio.get_running_loop()
        check = asyncio.ensure_future(store.hit([key], [limit], [1.0]))
        # The loop is busy right after the check is queued: when it comes back, the pipeline's
        # task is created and its timer fires in the same pass.
        loop.call_soon(time.sleep, 0.08)
        decision = await check
        assert decision.allowed and decision.remaining == 98
        decision = await asyncio.wait_for(store.hit([key], [limit], [1.0]), 5)
        assert decision.allowed and decision.remaining == 97  # the slot was given back
    finally:
        await store.close()
