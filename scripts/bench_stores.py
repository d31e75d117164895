"""Extra cost per request of rate limiting on loopback Redis, in-process: ratewarden's RedisStore
(middleware) vs traffik's Redis backend vs slowapi's Redis storage, over the same bare FastAPI app.

Each library's app is called directly through ASGI (no HTTP, no server), 50 requests in flight at
once, one process; the limit is never reached (the allowed path), except in the "rejection" rows.
All apps run interleaved in the same process (in an order rotated from run to run), and every
figure is the median of ``--runs``.

Garbage collection: once every app is built, the long-lived heap (imported libraries, apps) is
frozen (``gc.freeze()``, as servers that preload their app do) and each measurement starts after
a ``gc.collect()``. Without this, a full collection (10-20 ms on this heap, triggered by whichever
library allocated most) lands in a random app's run and decides its p99: p99 here is close to the
slowest of the 40 rounds of 50 requests. ``--no-freeze`` measures without it.

    .venv/bin/python scripts/bench_stores.py [--runs 5] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi import Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse
from tests.servers import RedisStandalone, redis_cmd

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.stores.redis import RedisStore

CONCURRENCY = 50
HUGE = "1000000000/hour"
App = Callable[..., Awaitable[None]]


def bare_app() -> FastAPI:
    app = FastAPI()

    @app.get("/r")
    async def r() -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app


def ours(url: str | None, algorithm: str, rate: str = HUGE) -> tuple[FastAPI, Any]:
    store = RedisStore(url, timeout=1) if url else MemoryStore()
    app = bare_app()
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(store), rules=[Rule("/r", rate, algorithm=algorithm)])
    return app, store


def traffik(url: str, algorithm: str) -> tuple[FastAPI, Any]:
    from traffik import HTTPThrottle, ThrottleRegistry
    from traffik import strategies as ts
    from traffik.backends.redis.aioredis import RedisBackend

    strategy = {"fixed_window": ts.FixedWindow, "sliding_window": ts.SlidingWindowCounter,
                "token_bucket": ts.TokenBucket, "gcra": ts.GCRA}[algorithm]()
    backend = RedisBackend(url, namespace=f"bench{algorithm}", persistent=False)
    throttle = HTTPThrottle(uid=f"bench-{algorithm}", rate="1000000000/3600s", strategy=strategy,
                            backend=backend, registry=ThrottleRegistry())
    app = FastAPI()

    @app.get("/r", dependencies=[Depends(throttle)])
    async def r() -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app, backend


def slowapi(url: str, algorithm: str) -> tuple[FastAPI, Any] | None:
    strategy = {"fixed_window": "fixed-window", "sliding_window": "sliding-window-counter"}.get(algorithm)
    if strategy is None:
        return None
    from slowapi import Limiter as SlowLimiter
    from slowapi.util import get_remote_address

    limiter = SlowLimiter(key_func=get_remote_address, storage_uri=url, strategy=strategy)
    app = FastAPI()
    app.state.limiter = limiter

    @app.get("/r")
    @limiter.limit(HUGE)
    async def r(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app, None


SCOPE = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
    "path": "/r", "raw_path": b"/r", "query_string": b"", "root_path": "",
    "headers": [(b"host", b"bench")], "client": ("10.0.0.1", 5000), "server": ("bench", 80),
}


async def call(app: App) -> int:
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(SCOPE, headers=list(SCOPE["headers"])), receive, send)  # type: ignore[call-overload]
    return status


async def measure(app: App, requests: int) -> tuple[float, float, set[int]]:
    """(us per request, p99 latency us, statuses) with CONCURRENCY requests in flight."""
    latencies: list[float] = []
    statuses: set[int] = set()

    async def one(arrived: float) -> None:
        statuses.add(await call(app))
        latencies.append(time.perf_counter() - arrived)

    for _ in range(CONCURRENCY):  # warm-up
        await one(time.perf_counter())
    latencies.clear()
    started = time.perf_counter()
    for _ in range(requests // CONCURRENCY):
        # All 50 arrive together; latency counts from arrival, so a library that blocks the
        # event loop is charged for the requests waiting behind it.
        arrived = time.perf_counter()
        await asyncio.gather(*(one(arrived) for _ in range(CONCURRENCY)))
    per_request = (time.perf_counter() - started) / (requests // CONCURRENCY * CONCURRENCY)
    latencies.sort()
    return per_request * 1e6, latencies[int(len(latencies) * 0.99)] * 1e6, statuses


async def run(url: str, port: int, runs: int, requests: int, freeze: bool = True) -> None:
    algorithms = ["fixed_window", "sliding_window", "token_bucket", "gcra"]
    apps: dict[str, App] = {"bare": bare_app()}
    closers: list[Any] = []
    for alg in algorithms:
        apps[f"ratewarden {alg}"], store = ours(url, alg)
        closers.append(store)
        apps[f"traffik {alg}"], backend = traffik(url, alg)
        await backend.initialize()
        built = slowapi(url, alg)
        if built is not None:
            apps[f"slowapi {alg}"] = built[0]
    # Rejections: a cached Redis rejection vs a memory-store rejection.
    apps["ratewarden rejection, Redis (cached)"], store = ours(url, "fixed_window", "1/hour")
    closers.append(store)
    apps["ratewarden rejection, memory store"], _ = ours(None, "fixed_window", "1/hour")
    per: dict[str, list[float]] = {name: [] for name in apps}
    p99: dict[str, list[float]] = {name: [] for name in apps}
    statuses: dict[str, set[int]] = {name: set() for name in apps}
    if freeze:
        gc.collect()
        gc.freeze()
    order = list(apps.items())
    for run_index in range(runs):
        redis_cmd(port, "FLUSHALL")
        shift = run_index * len(order) // runs  # rotate the order, so no app always runs first
        for name, app in order[shift:] + order[:shift]:
            if freeze:
                gc.collect()
            us, tail, seen = await measure(app, requests)
            per[name].append(us)
            p99[name].append(tail)
            statuses[name] |= seen
    bare = statistics.median(per["bare"])
    print(f"bare FastAPI: {bare:.1f} us/request ({1e6 / bare:,.0f} req/s), p99 {statistics.median(p99['bare']):.0f} us")
    print(f"{'library / algorithm':40} {'us/req':>8} {'extra us':>9} {'req/s':>8} {'p99 us':>8}  statuses")
    for name in apps:
        if name == "bare":
            continue
        us = statistics.median(per[name])
        print(f"{name:40} {us:8.1f} {us - bare:9.1f} {1e6 / us:8,.0f} {statistics.median(p99[name]):8.0f}  "
              f"{sorted(statuses[name])}")
    for alg in algorithms:
        ours_extra = statistics.median(per[f"ratewarden {alg}"]) - bare
        traffik_extra = statistics.median(per[f"traffik {alg}"]) - bare
        print(f"{alg:16} ratewarden extra / traffik extra = {ours_extra / traffik_extra:.3f}")
    for store in closers:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--no-freeze", action="store_true", help="leave the garbage collector as it is")
    opts = parser.parse_args()
    server = RedisStandalone().start()
    try:
        asyncio.run(run(server.url, server.port, opts.runs, opts.requests, not opts.no_freeze))
    finally:
        server.close()


if __name__ == "__main__":
    main()
