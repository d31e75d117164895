"""Defects the failure matrix found beyond issue 11's list, each with its regression test."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.bans import Bans
from ratewarden.policy import PolicyMiddleware
from tests.core.asgi import request


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
