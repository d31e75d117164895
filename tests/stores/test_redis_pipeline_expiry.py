"""Defects the failure matrix found beyond issue 11's list, each with its regression test."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.bans import Bans
from ratewarden.limits import make_limits
from ratewarden.policy import PolicyMiddleware
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.core.asgi import request
from tests.servers import RedisStandalone


def broken_key(scope: MutableMapping[str, Any]) -> str:
    raise RuntimeError("key service down")


async def endpoint(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_a_ban_key_function_that_raises_follows_the_failure_policy(
    on_error: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to escape PolicyMiddleware as an HTTP 500 under either policy."""
    monkeypatch.setattr("ratewarden.enforcement._last_error_log", -1e9)
    limiter = Limiter(MemoryStore(), on_error=on_error)  # type: ignore[arg-type]
    bans = Bans(after=1, within=60, duration=60, key=broken_key)
    app = PolicyMiddleware(endpoint, limiter, [Rule("/x", "1/hour")], bans=bans)
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        replies = [await request(app, "/x") for _ in range(3)]
    if on_error == "open":
        # No ban check and no strike: the rule itself still limits.
        assert [r.status for r in replies] == [200, 429, 429]
    else:
        assert [r.status for r in replies] == [503] * 3
    assert any("ban key function" in r.getMessage() for r in caplog.records)
    assert (await request(app, "/unrelated")).status == 200


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
