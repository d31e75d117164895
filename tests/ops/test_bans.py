"""Bans after repeated rejections (with growth), explicit block, penalty and reward."""

from __future__ import annotations

from collections import Counter

import pytest

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.keys import header, header_key
from ratewarden.metrics import Metrics
from ratewarden.policy import PolicyMiddleware
from ratewarden.policy.bans import Bans

from ..policy.apps import build_app, client


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_ban_after_n_rejections_then_growing() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    bans = Bans(after=3, within=60, duration=100, growth=2.0, status=403, key=header("X-Client"), clock=clock)
    metrics = Metrics()
    rules = [Rule("/api/**", "2/min", key=header("X-Client"), name="api")]
    app = PolicyMiddleware(build_app(), Limiter(store), rules, bans=bans, metrics=metrics)
    async with client(app) as http:
        got = [(await http.get("/api/x", headers={"X-Client": "bad"})).status_code for _ in range(8)]
        # 2 allowed, 3 rejections (the third triggers the ban), then banned.
        assert got == [200, 200, 429, 429, 429, 403, 403, 403]
        banned = await http.get("/api/x", headers={"X-Client": "bad"})
        assert banned.json()["status"] == 403 and banned.headers["retry-after"] == "100"
        # Other clients are unaffected.
        assert (await http.get("/api/x", headers={"X-Client": "good"})).status_code == 200
        assert 99 < bans.banned_for(header_key("X-Client", "bad")) <= 100
        clock.now += 101
        assert bans.banned_for(header_key("X-Client", "bad")) == 0
        # Second offence: the ban doubles.
        got = [(await http.get("/api/x", headers={"X-Client": "bad"})).status_code for _ in range(6)]
        assert got == [200, 200, 429, 429, 429, 403]
        assert 199 < bans.banned_for(header_key("X-Client", "bad")) <= 200
    assert 'ratewarden_requests_banned_total{status="403"} 5.0' in metrics.exposition().decode()
    metrics.close()


async def test_block_and_unblock_answer_429_when_configured() -> None:
    bans = Bans(after=5, status=429, key=header("X-Client"))
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), [Rule("/api/**", "100/min", key=header("X-Client"))], bans=bans)
    assert await app.block(header_key("X-Client", "mallory"), 30) == 30
    assert 29 < await app.block(header_key("X-Client", "mallory"), 10) <= 30  # a shorter ban never shortens one in force
    async with client(app) as http:
        r = await http.get("/api/x", headers={"X-Client": "mallory"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) == 30
        await app.unblock(header_key("X-Client", "mallory"))
        assert (await http.get("/api/x", headers={"X-Client": "mallory"})).status_code == 200
    with pytest.raises(ValueError, match="positive"):
        await app.block("x", 0)
    with pytest.raises(RuntimeError, match="not configured"):
        await PolicyMiddleware(build_app(), Limiter(MemoryStore()), []).block("x", 1)


async def test_penalty_and_reward_move_the_counter() -> None:
    rules = [Rule("/api/**", "5/min", key=header("X-Client"), name="api")]
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), rules)
    after = await app.penalty("api", header_key("X-Client", "p"), 4)
    assert after.remaining == 1
    assert (await app.penalty("api", header_key("X-Client", "p"), 10)).remaining == 0  # saturates
    assert (await app.reward("api", header_key("X-Client", "p"), 2)).remaining == 2
    async with client(app) as http:
        got = Counter([(await http.get("/api/x", headers={"X-Client": "p"})).status_code for _ in range(4)])
    assert got == {200: 2, 429: 2}
    with pytest.raises(KeyError):
        await app.penalty("nope", "k", 1)


async def test_a_ban_on_a_64kb_key_holds_without_being_cached() -> None:
    """The per-process ban cache keeps no key longer than 1 KB (client-chosen keys cannot grow it
    by 64 KB each); such a key's ban is read from the store instead, and still holds."""
    bans = Bans(after=5, status=429, key=header("X-Client", hashed=False))
    limiter = Limiter(MemoryStore())
    long_key = "x-client:" + "a" * 65536
    assert await bans.block(limiter, long_key, 30) == 30
    assert not bans._cache
    assert 29 < await bans.check(limiter, long_key) <= 30
    assert not bans._cache
    assert await bans.block(limiter, "x-client:short", 30) == 30
    assert "x-client:short" in bans._cache
