"""A Sentinel failover does not grant a key a new limit (issue 28, finding 8).

The primary is SIGKILLed once a key has used part of its limit, with every write replicated
(``WAIT``: the failover loses nothing, ``L = 0``). Requests keep coming over real HTTP while
Sentinel promotes the replica and after it: the insurance limiter starts from what the store last
said was left, and what it admits is charged to the new primary, so the key is admitted at most
``limit + P`` in all (docs/stores.md, "What an outage costs"), ``P`` at most the requests in
flight at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import pytest

from ratewarden import Limiter, RateLimitMiddleware, Rule
from ratewarden.stores.redis import RedisStore
from tests.servers import RedisSentinel, have, http_burst, redis_cmd, uvicorn_in_thread

pytestmark = [
    pytest.mark.sentinel,
    pytest.mark.skipif(not have("redis-server"), reason="needs redis-server"),
]

LIMIT = 300
BEFORE = 100  # admitted by the store before the kill
IN_FLIGHT = 20  # requests at once: bounds P


def limited_app(limiter: Limiter) -> RateLimitMiddleware:
    """``/x`` limited to ``LIMIT``/hour per client; the store is closed at lifespan shutdown, on
    the loop that opened its connections."""

    async def endpoint(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await limiter.store.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    return RateLimitMiddleware(endpoint, limiter, [Rule("/x", f"{LIMIT}/hour")])


def test_a_sentinel_failover_admits_the_limit_plus_at_most_what_was_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)  # one worker: the whole remaining is its share
    setup = RedisSentinel().start()
    limiter = Limiter(RedisStore(setup.url, timeout=0.5), prefix=f"fo{uuid.uuid4().hex[:8]}")
    try:
        with uvicorn_in_thread(limited_app(limiter), lifespan="on") as port:
            before = http_burst(port, "/x", BEFORE, concurrency=IN_FLIGHT)
            assert before.count(200) == BEFORE
            first = setup.master_port()
            assert redis_cmd(first, "WAIT", "1", "5000") == "1"  # replicated: the failover loses nothing
            setup.primary.stop()  # SIGKILL
            during: list[int] = []
            deadline = time.monotonic() + 30
            while setup.master_port() == first:
                assert time.monotonic() < deadline, "Sentinel promoted no replica within 30 s"
                during += http_burst(port, "/x", IN_FLIGHT, concurrency=IN_FLIGHT)
            after = http_burst(port, "/x", 2 * LIMIT, concurrency=IN_FLIGHT)
        outage = limiter.without_store()
    finally:
        setup.close()
    assert set(before + during + after) <= {200, 429}
    assert outage["local_limiter"] > 0, "no check was decided during the failover"
    admitted = BEFORE + during.count(200) + after.count(200)
    # Counting from zero, the insurance limiter would admit up to LIMIT during the failover, and
    # the new primary another LIMIT - BEFORE after it. The bound is LIMIT + L (0: replicated) + P,
    # the checks the new primary answers before the charge-back lands: those in flight when it
    # takes over, and the promotion is seen only between bursts, so the hand-over can straddle two.
    assert LIMIT <= admitted <= LIMIT + 2 * IN_FLIGHT, (
        f"admitted {admitted} against {LIMIT}: {BEFORE} before the kill, {during.count(200)} of "
        f"{len(during)} during the failover, {after.count(200)} of {len(after)} after it"
    )
