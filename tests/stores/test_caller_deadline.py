"""A store call whose caller's deadline (``CALLER_DEADLINE``: a gRPC call's ``grpc-timeout``) passed
while it waited behind a pipeline in flight is never sent: the front door answered
DEADLINE_EXCEEDED already, so it must charge nothing, even when the store wakes up in the same loop
pass as the door's own expiry timer would have run (issue 36: the compiled door's
``test_a_callers_deadline_cancels_its_decision_on_a_paused_redis`` was charged on a loaded machine)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.caller_deadline import CALLER_DEADLINE
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisStandalone


@pytest.fixture
def paused_redis() -> RedisStandalone:
    return RedisStandalone().start()


async def _hit_with_deadline(store: RedisStore, key: str, limit: Limit, deadline: float) -> object:
    CALLER_DEADLINE.set(deadline)  # this Task's own copy of the context
    return await store.hit([key], [limit], [1.0])


async def test_a_store_call_past_its_callers_deadline_is_never_sent(paused_redis: RedisStandalone) -> None:
    store = RedisStore(f"{paused_redis.url}?timeout=10&pool_size=1")
    limit = Limit(Rate(5, 3600), "fixed_window")
    first_key, cut_key = (f"rw:{{{uuid.uuid4().hex}}}:k" for _ in range(2))
    try:
        assert (await store.hit([first_key], [limit], [1.0])).allowed  # connected, clock measured
        paused_redis.server.pause()
        first = asyncio.ensure_future(store.hit([first_key], [limit], [1.0]))
        await asyncio.sleep(0.2)  # in flight to the paused server, holding the pool's one connection
        loop = asyncio.get_running_loop()
        cut = asyncio.ensure_future(_hit_with_deadline(store, cut_key, limit, loop.time() + 0.1))
        await asyncio.sleep(0.4)  # its deadline passes while it is queued; nothing cancels it
        paused_redis.server.resume()
        assert (await first).allowed
        with pytest.raises(asyncio.CancelledError):
            await cut
        left = (await store.peek([cut_key], [limit]))[0]
        assert left.remaining == 5, f"charged {5 - left.remaining} past its caller's deadline"
        within = asyncio.ensure_future(_hit_with_deadline(store, cut_key, limit, loop.time() + 30))
        assert (await within).remaining == 4  # a deadline still ahead is sent as usual
    finally:
        paused_redis.server.resume()
        await store.close()
        paused_redis.close()
