"""Extra cost per request of ratewarden vs traffik on the memory store, in-process.

Direct ASGI calls (no HTTP client) against one FastAPI app shape, batches of 50 concurrent
requests (``--concurrency``), medians over ``--runs`` rounds that interleave the variants so drift
and noise hit all of them alike. Prints µs per request, the extra over the bare app, and the ratio
of ours to traffik's extra. Needs the ``bench`` extra.

    .venv/bin/python scripts/bench_overhead.py --requests 4000 --runs 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, Request, Response

ALLOW = 10**9  # a limit never reached: every request allowed
DENY = 1  # every request after the first limited


def bare() -> FastAPI:
    app = FastAPI()

    @app.get("/test")
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    return app


def noop_dependency() -> FastAPI:
    """The floor of FastAPI's dependency machinery: a dependency that does nothing."""

    async def dep(request: Request, response: Response) -> None:
        return None

    app = FastAPI()

    @app.get("/test", dependencies=[Depends(dep)])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    return app


_FIXED_HEADERS = [
    (b"ratelimit-policy", b'"x";q=1000;w=60'), (b"ratelimit", b'"x";r=999;t=60'),
    (b"x-ratelimit-limit", b"1000"), (b"x-ratelimit-remaining", b"999"), (b"x-ratelimit-reset", b"60"),
]
_PROBLEM = b'{"type":"about:blank","title":"Too Many Requests","status":429}'


class _FloorHeaders:
    """The floor of any limiting middleware that lets a request through: a pure ASGI layer adding
    five precomputed rate-limit headers and doing no limiting at all."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *_FIXED_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _Floor429:
    """The floor of any middleware 429: a pure ASGI layer that answers a fixed 429 at once."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/problem+json"), (b"content-length", b"%d" % len(_PROBLEM))]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": _PROBLEM})


def floor_middleware(layer: type) -> FastAPI:
    app = bare()
    app.add_middleware(layer)
    return app


def ours_middleware(limit: int) -> FastAPI:
    from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule

    app = bare()
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(MemoryStore()), rules=[Rule("/test", f"{limit}/min")])
    return app


def ours_dependency(limit: int) -> FastAPI:
    from ratewarden import Limiter, MemoryStore
    from ratewarden.fastapi import RateLimit

    limiter = Limiter(MemoryStore())
    app = FastAPI()

    @app.get("/test", dependencies=[Depends(RateLimit(f"{limit}/min", limiter=limiter))])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    return app


def _traffik(limit: int) -> tuple[Any, Any]:
    from traffik import HTTPThrottle, InMemoryBackend, ThrottleRegistry

    backend = InMemoryBackend(persistent=False, number_of_shards=32)
    throttle = HTTPThrottle(
        uid=f"bench-{time.time_ns()}", rate=f"{limit}/60s", backend=backend, registry=ThrottleRegistry()
    )
    return backend, throttle


def traffik_middleware(limit: int) -> FastAPI:
    from traffik.middleware import MiddlewareThrottle, ThrottleMiddleware

    backend, throttle = _traffik(limit)
    app = bare()
    app.add_middleware(
        ThrottleMiddleware, middleware_throttles=[MiddlewareThrottle(throttle, path="/test", methods={"GET"})],
        backend=backend,
    )
    app.state.backend = backend
    return app


def traffik_dependency(limit: int) -> FastAPI:
    backend, throttle = _traffik(limit)
    app = FastAPI()

    @app.get("/test", dependencies=[Depends(throttle)])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    app.state.backend = backend
    return app


VARIANTS: dict[str, Callable[[], FastAPI]] = {
    "bare": bare,
    "noop dependency": noop_dependency,
    "floor middleware 200": lambda: floor_middleware(_FloorHeaders),
    "floor middleware 429": lambda: floor_middleware(_Floor429),
    "ours middleware 200": lambda: ours_middleware(ALLOW),
    "traffik middleware 200": lambda: traffik_middleware(ALLOW),
    "ours middleware 429": lambda: ours_middleware(DENY),
    "traffik middleware 429": lambda: traffik_middleware(DENY),
    "ours dependency 200": lambda: ours_dependency(ALLOW),
    "traffik dependency 200": lambda: traffik_dependency(ALLOW),
}

SCOPE = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
    "path": "/test", "raw_path": b"/test", "query_string": b"", "root_path": "",
    "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 5000), "server": ("bench", 80),
}


async def drive_httpx(app: FastAPI, requests: int, concurrency: int) -> tuple[float, dict[int, int]]:
    """Like ``drive``, through ``httpx.ASGITransport`` (the peers' old in-process method)."""
    import httpx

    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:

        async def one() -> None:
            status = (await client.get("/test")).status_code
            statuses[status] = statuses.get(status, 0) + 1

        start = time.perf_counter()
        for _ in range(0, requests, concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
    return (time.perf_counter() - start) / requests * 1e6, statuses


async def drive(app: FastAPI, requests: int, concurrency: int) -> tuple[float, dict[int, int]]:
    """Mean µs per request, and the status counts."""
    statuses: dict[int, int] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] = statuses.get(message["status"], 0) + 1

    async def one() -> None:
        await app(dict(SCOPE), receive, send)  # type: ignore[arg-type]

    start = time.perf_counter()
    for _ in range(0, requests, concurrency):
        await asyncio.gather(*(one() for _ in range(concurrency)))
    return (time.perf_counter() - start) / requests * 1e6, statuses


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--transport", choices=("asgi", "httpx"), default="asgi",
                        help="direct ASGI calls (default) or httpx.ASGITransport")
    args = parser.parse_args()
    run = drive if args.transport == "asgi" else drive_httpx
    apps = {name: build() for name, build in VARIANTS.items()}
    for app in apps.values():
        backend = getattr(app.state, "backend", None)
        if backend is not None:
            await backend.initialize()
        await run(app, 500, args.concurrency)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in apps}
    last: dict[str, dict[int, int]] = {}
    for _ in range(args.runs):
        for name, app in apps.items():
            micros, statuses = await run(app, args.requests, args.concurrency)
            samples[name].append(micros)
            last[name] = statuses
    median = {name: statistics.median(values) for name, values in samples.items()}
    base = median["bare"]
    print(f"{'variant':26s} {'µs/req':>8s} {'extra µs':>9s}  statuses (last run)")
    for name in apps:
        print(f"{name:26s} {median[name]:8.1f} {median[name] - base:9.1f}  {last[name]}")
    print()
    report(median)


def report(median: dict[str, float]) -> None:
    """Each target of the core issue next to ours, and next to the best any implementation could
    reach: the floor FastAPI itself sets (a limiter that does no work at all)."""
    base = median["bare"]

    def extra(name: str) -> float:
        return median[name] - base

    rows = [
        ("middleware 200: extra / traffik's extra", 0.10,
         extra("ours middleware 200") / extra("traffik middleware 200"),
         extra("floor middleware 200") / extra("traffik middleware 200")),
        ("middleware 429: total / traffik's total", 1 / 8,
         median["ours middleware 429"] / median["traffik middleware 429"],
         median["floor middleware 429"] / median["traffik middleware 429"]),
        ("dependency 200: extra / traffik's extra", 1 / 3,
         extra("ours dependency 200") / extra("traffik dependency 200"),
         extra("noop dependency") / extra("traffik dependency 200")),
    ]
    print(f"{'ratio':42s} {'target':>7s} {'ours':>6s} {'floor':>6s}")
    for label, target, ours, floor in rows:
        print(f"{label:42s} {target:7.3f} {ours:6.2f} {floor:6.2f}")
    print("floor = a layer doing no limiting (see _FloorHeaders, _Floor429, noop_dependency)")
    above = (extra("ours dependency 200") - extra("noop dependency")) / (
        extra("traffik dependency 200") - extra("noop dependency"))
    print(f"dependency extra above FastAPI's own dependency cost: ours/traffik = {above:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
