"""150 concurrent requests against a limit of 100 admit exactly 100, for every algorithm, through
the middleware and through the dependency, five times with a reset in between."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI

from ratewarden import Limiter, RateLimitMiddleware, Rule
from ratewarden.algorithms import ALGORITHMS
from ratewarden.fastapi import RateLimit
from tests.core.asgi import request
from tests.shm import KINDS, local_store
from tests.vectors.runner import FakeClock

ALL = sorted(ALGORITHMS)
ROUNDS = 5


def build(algorithm: str, kind: str = "memory") -> tuple[Limiter, FastAPI]:
    # A frozen clock: no refill or window change while the burst runs, so exactly 100 is right.
    limiter = Limiter(local_store(kind, clock=FakeClock(6000.0)))
    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware, limiter=limiter, rules=[Rule("/mw", "100/min", algorithm=algorithm)]
    )

    @app.get("/mw")
    async def mw() -> dict[str, bool]:
        await asyncio.sleep(0)  # interleave the requests inside the app too
        return {"ok": True}

    @app.get("/dep", dependencies=[Depends(RateLimit("100/min", limiter=limiter, algorithm=algorithm))])
    async def dep() -> dict[str, bool]:
        await asyncio.sleep(0)
        return {"ok": True}

    @app.get("/dep-sync", dependencies=[Depends(RateLimit("100/min", limiter=limiter, algorithm=algorithm))])
    def dep_sync() -> dict[str, bool]:
        return {"ok": True}

    return limiter, app


async def burst(app: Any, path: str) -> list[int]:
    replies = await asyncio.gather(*(request(app, path) for _ in range(150)))
    return [r.status for r in replies]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALL)
@pytest.mark.parametrize("path", ["/mw", "/dep"])
async def test_150_concurrent_requests_admit_exactly_100(algorithm: str, path: str, kind: str) -> None:
    limiter, app = build(algorithm, kind)
    for _ in range(ROUNDS):
        got = await burst(app, path)
        assert got.count(200) == 100
        assert got.count(429) == 50
        await limiter.clear()


@pytest.mark.parametrize("kind", KINDS)
async def test_sync_endpoint_dependency_under_concurrency(kind: str) -> None:
    limiter, app = build("fixed_window", kind)
    for _ in range(ROUNDS):
        got = await burst(app, "/dep-sync")
        assert (got.count(200), got.count(429)) == (100, 50)
        await limiter.clear()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["/mw", "/dep"])
async def test_concurrency_through_httpx(path: str, kind: str) -> None:
    limiter, app = build("sliding_window", kind)
    transport = httpx.ASGITransport(app=app, client=("198.51.100.10", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for _ in range(ROUNDS):
            replies = await asyncio.gather(*(client.get(path) for _ in range(150)))
            codes = [r.status_code for r in replies]
            assert (codes.count(200), codes.count(429)) == (100, 50)
            remaining = sorted(int(r.headers["x-ratelimit-remaining"]) for r in replies if r.status_code == 200)
            assert remaining == list(range(100))  # every admitted request saw a distinct count
            await limiter.clear()
