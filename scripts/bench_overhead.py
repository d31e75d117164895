"""Extra cost per request of ratewarden vs traffik on the memory store, in-process.

Direct ASGI calls (no HTTP client) against one FastAPI app shape, batches of 50 concurrent
requests (``--concurrency``), medians over ``--runs`` rounds that interleave the variants so drift
and noise hit all of them alike. Prints µs per request, the extra over the bare app, and the ratio
of ours to traffik's extra. Needs the ``bench`` extra.

    .venv/bin/python scripts/bench_overhead.py --requests 4000 --runs 7
    cd /tmp && /work/main/build/venv-wheel/bin/python /work/main/scripts/bench_overhead.py --edge --requests 2000 --runs 11

(``make bench`` installs the compiled wheel in ``build/venv-wheel``; a ``setup.py build --build-lib DIR``
tree on ``PYTHONPATH`` works too.)

``--edge`` measures the issue-12 targets instead of the comparison with traffik: the dependency with
``install(app)`` (edge enforcement; also with ``lift=False``) against the middleware, the
middleware's 429 against a pure ASGI layer answering a fixed 429 of the same size, and every
header style against a layer adding the same number of fixed headers. It prints the minimum and
the median of the interleaved rounds.
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


def ours_dependency(limit: int, edge: bool = False, lift: bool = True) -> FastAPI:
    from ratewarden import Limiter, MemoryStore
    from ratewarden.fastapi import RateLimit, install

    limiter = Limiter(MemoryStore())
    app = FastAPI()

    @app.get("/test", dependencies=[Depends(RateLimit(f"{limit}/min", limiter=limiter))])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    if edge:
        install(app, lift=lift)
    return app


def ours_middleware_style(limit: int, headers: str = "always", header_style: str = "both") -> FastAPI:
    from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule

    app = bare()
    app.add_middleware(
        RateLimitMiddleware, limiter=Limiter(MemoryStore()), rules=[Rule("/test", f"{limit}/min")],
        headers=headers, header_style=header_style,
    )
    return app


def _real_rejection() -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body and headers ratewarden's middleware sends for a 429 on this bench's rule."""
    from ratewarden.decision import Decision
    from ratewarden.enforcement.answers import rejection

    return rejection(Decision(False, DENY, 0, 42.5, 42.5, 60.0, "/test"), "both", True)


class _FloorSame429:
    """The floor of the middleware 429 as the issue defines it: a pure ASGI layer answering a fixed
    429 whose body and headers have the same size as ratewarden's (precomputed once)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.body, self.headers = _real_rejection()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 429, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def _floor_n_headers(count: int) -> type:
    fixed = _FIXED_HEADERS[:count] if count != 3 else _FIXED_HEADERS[2:]

    class FloorHeaders:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def send_with_headers(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", ()), *fixed]
                await send(message)

            await self.app(scope, receive, send_with_headers)

    return FloorHeaders


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

EDGE_VARIANTS: dict[str, Callable[[], FastAPI]] = {
    "bare": bare,
    "noop dependency": noop_dependency,
    "floor 429 same size": lambda: floor_middleware(_FloorSame429),
    "ours middleware 429": lambda: ours_middleware(DENY),
    "ours dependency 429": lambda: ours_dependency(DENY),
    "ours dependency+edge 429": lambda: ours_dependency(DENY, edge=True),
    "ours middleware 200": lambda: ours_middleware(ALLOW),
    "ours dependency 200": lambda: ours_dependency(ALLOW),
    "ours dependency+edge 200": lambda: ours_dependency(ALLOW, edge=True),
    "ours dep+edge lift=False 200": lambda: ours_dependency(ALLOW, edge=True, lift=False),
    "ours dep+edge lift=False 429": lambda: ours_dependency(DENY, edge=True, lift=False),
    "floor 5 headers": lambda: floor_middleware(_floor_n_headers(5)),
    "floor 3 headers": lambda: floor_middleware(_floor_n_headers(3)),
    "floor 2 headers": lambda: floor_middleware(_floor_n_headers(2)),
    "ours mw 200 both": lambda: ours_middleware_style(ALLOW, header_style="both"),
    "ours mw 200 legacy": lambda: ours_middleware_style(ALLOW, header_style="legacy"),
    "ours mw 200 ietf": lambda: ours_middleware_style(ALLOW, header_style="ietf"),
    "ours mw 200 off": lambda: ours_middleware_style(ALLOW, headers="off"),
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
    if concurrency == 1:  # one request at a time, no gather: the least noise per request
        for _ in range(requests):
            await one()
    else:
        for _ in range(0, requests, concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
    return (time.perf_counter() - start) / requests * 1e6, statuses


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=50, help="requests per batch; 1: sequential calls")
    parser.add_argument("--transport", choices=("asgi", "httpx"), default="asgi",
                        help="direct ASGI calls (default) or httpx.ASGITransport")
    parser.add_argument("--edge", action="store_true", help="the issue-12 targets (edge, floors, header styles)")
    parser.add_argument("--only", default="", help="comma-separated variants (with --edge): fewer, so less drift")
    args = parser.parse_args()
    run = drive if args.transport == "asgi" else drive_httpx
    chosen = EDGE_VARIANTS if args.edge else VARIANTS
    if args.only:
        wanted = {"bare", *args.only.split(",")}
        chosen = {name: build for name, build in chosen.items() if name in wanted}
    apps = {name: build() for name, build in chosen.items()}
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
    if args.edge:
        import ratewarden

        print(f"ratewarden {'compiled' if ratewarden.COMPILED else 'pure Python'}; {args.runs} rounds "
              f"of {args.requests} requests, concurrency {args.concurrency}")
        report_edge(samples, last)
        return
    base = median["bare"]
    print(f"{'variant':26s} {'µs/req':>8s} {'extra µs':>9s}  statuses (last run)")
    for name in apps:
        print(f"{name:26s} {median[name]:8.1f} {median[name] - base:9.1f}  {last[name]}")
    print()
    report(samples)


def report(samples: dict[str, list[float]]) -> None:
    """Each target of the core issue next to ours, and next to the best any implementation could
    reach: the floor FastAPI itself sets (a limiter that does no work at all). Each ratio twice: of
    the fastest rounds, and the median of the per-round ratios (the variants of a round are
    interleaved, so drift hits both sides of a ratio alike)."""
    rounds = range(len(samples["bare"]))

    def extra(name: str) -> tuple[float, list[float]]:
        return min(samples[name]) - min(samples["bare"]), [samples[name][i] - samples["bare"][i] for i in rounds]

    def total(name: str) -> tuple[float, list[float]]:
        return min(samples[name]), samples[name]

    def ratio(a: tuple[float, list[float]], b: tuple[float, list[float]]) -> str:
        return f"{a[0] / b[0]:7.2f} {statistics.median(x / y for x, y in zip(a[1], b[1], strict=True)):7.2f}"

    rows = [
        ("middleware 200: extra / traffik's extra", 0.10,
         ratio(extra("ours middleware 200"), extra("traffik middleware 200")),
         ratio(extra("floor middleware 200"), extra("traffik middleware 200"))),
        ("middleware 429: total / traffik's total", 1 / 8,
         ratio(total("ours middleware 429"), total("traffik middleware 429")),
         ratio(total("floor middleware 429"), total("traffik middleware 429"))),
        ("dependency 200: extra / traffik's extra", 1 / 3,
         ratio(extra("ours dependency 200"), extra("traffik dependency 200")),
         ratio(extra("noop dependency"), extra("traffik dependency 200"))),
    ]
    print(f"{'ratio':42s} {'target':>7s} {'ours: of mins, median':>22s} {'floor: of mins, median':>23s}")
    for label, target, ours, floor in rows:
        print(f"{label:42s} {target:7.3f} {ours:>22s} {floor:>23s}")
    print("floor = a layer doing no limiting (see _FloorHeaders, _Floor429, noop_dependency); of mins: ratio of "
          "the fastest rounds (extras: fastest variant minus fastest bare); median: of the per-round ratios")
    median = {name: statistics.median(values) for name, values in samples.items()}
    noop = median["noop dependency"]
    above = (median["ours dependency 200"] - noop) / (median["traffik dependency 200"] - noop)
    print(f"dependency extra above FastAPI's own dependency cost (medians): ours/traffik = {above:.2f}")


def report_edge(samples: dict[str, list[float]], last: dict[str, dict[int, int]]) -> None:
    """The issue-12 targets: each ratio from the fastest rounds, and the median of per-round
    ratios (variants are interleaved within a round, so drift hits both sides of a ratio)."""
    print(f"{'variant':26s} {'min µs':>8s} {'median':>8s} {'extra(med)':>10s}  statuses (last run)")
    base = statistics.median(samples["bare"])
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:26s} {min(values):8.1f} {med:8.1f} {med - base:10.1f}  {last[name]}")
    rounds = range(len(samples["bare"]))

    def total(name: str) -> tuple[float, list[float]] | None:
        return (min(samples[name]), samples[name]) if name in samples else None

    def extra(name: str) -> tuple[float, list[float]] | None:
        if name not in samples:
            return None
        return min(samples[name]) - min(samples["bare"]), [samples[name][i] - samples["bare"][i] for i in rounds]

    def ratio(a: tuple[float, list[float]] | None, b: tuple[float, list[float]] | None) -> tuple[float, float] | None:
        """(ratio of the minimums, median of the per-round ratios); ``None`` for variants not run."""
        if a is None or b is None:
            return None
        return a[0] / b[0], statistics.median(x / y for x, y in zip(a[1], b[1], strict=True))

    rows: list[tuple[str, float | None, tuple[float, float] | None]] = [
        ("dependency+edge 429 total / middleware 429 total", 1.3,
         ratio(total("ours dependency+edge 429"), total("ours middleware 429"))),
        ("dependency (no edge) 429 total / middleware 429", None,
         ratio(total("ours dependency 429"), total("ours middleware 429"))),
        ("dependency+edge 200 extra / middleware 200 extra", 1.3,
         ratio(extra("ours dependency+edge 200"), extra("ours middleware 200"))),
        ("dependency+edge lift=False 200 extra / mw extra", None,
         ratio(extra("ours dep+edge lift=False 200"), extra("ours middleware 200"))),
        ("dependency+edge lift=False 429 total / mw 429", None,
         ratio(total("ours dep+edge lift=False 429"), total("ours middleware 429"))),
        ("  floor: noop dependency extra / middleware extra", None,
         ratio(extra("noop dependency"), extra("ours middleware 200"))),
        ("middleware 429 total / fixed-429 floor (same size)", 1.5,
         ratio(total("ours middleware 429"), total("floor 429 same size"))),
        ("mw 200 both (5 headers) extra / floor 5 headers", None,
         ratio(extra("ours mw 200 both"), extra("floor 5 headers"))),
        ("mw 200 legacy (3) extra / floor 3 headers", None,
         ratio(extra("ours mw 200 legacy"), extra("floor 3 headers"))),
        ("mw 200 ietf (2) extra / floor 2 headers", None,
         ratio(extra("ours mw 200 ietf"), extra("floor 2 headers"))),
        ("mw 200 off extra / mw 200 both extra", None,
         ratio(extra("ours mw 200 off"), extra("ours mw 200 both"))),
    ]
    print()
    print(f"{'ratio':52s} {'target':>7s} {'of mins':>7s} {'median':>7s}")
    for label, target, measured in rows:
        if measured is None:
            continue
        low, mid = measured
        shown = f"{target:7.2f}" if target is not None else f"{'-':>7s}"
        print(f"{label:52s} {shown} {low:7.2f} {mid:7.2f}")
    print("of mins: ratio of the fastest rounds (extras: fastest variant minus fastest bare); "
          "median: of the per-round ratios")


if __name__ == "__main__":
    asyncio.run(main())
