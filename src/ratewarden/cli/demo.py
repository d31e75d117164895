"""``ratewarden demo``: serve a rate-limited FastAPI app (like the README's example) on loopback,
send each endpoint a burst of concurrent requests over real HTTP, print how many were allowed and
limited (and the rate limit headers of one more request), then exit. It is not interactive.

Needs the ``fastapi`` and ``bench`` extras (FastAPI and uvicorn).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

__all__ = ["build_app", "main", "register"]


def build_app(rate: str = "10/min") -> object:
    """The README's example app: a middleware rule on ``/api/**`` and a dependency on ``/items``."""
    from fastapi import Depends, FastAPI

    from .. import Limiter, MemoryStore, RateLimitMiddleware, Rule
    from ..fastapi import RateLimit
    from ..keys import client_ip

    limiter = Limiter(MemoryStore())
    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        limiter=limiter,
        rules=[Rule("/api/**", rate, key=client_ip, algorithm="sliding_window")],
    )

    @app.get("/items", dependencies=[Depends(RateLimit("5/s", limiter=limiter))])
    async def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/api/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    return app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ratewarden demo",
        description="Serve a rate-limited FastAPI app (like the README's example) on loopback, send each endpoint a burst of "
        "concurrent requests, print how many were allowed and limited, and exit. "
        "Needs FastAPI and uvicorn: pip install 'ratewarden[fastapi,bench]'.",
    )
    parser.add_argument("--requests", type=int, default=30, help="requests per endpoint (default 30)")
    parser.add_argument("--concurrency", type=int, default=10, help="concurrent clients (default 10)")
    args = parser.parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("ratewarden demo needs uvicorn and FastAPI: pip install 'ratewarden[fastapi,bench]'")
        return 2

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(), host="127.0.0.1", port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            print("the demo server did not start")
            return 1
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    print(f"ratewarden demo: FastAPI + uvicorn on {base}, memory store\n")
    try:
        for path, limit in (("/api/hello", "10/min, middleware, sliding_window"), ("/items", "5/s, dependency, fixed_window")):
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(_get, [base + path] * args.requests))
            allowed = sum(1 for status, _ in results if status == 200)
            limited = sum(1 for status, _ in results if status == 429)
            print(f"GET {path}  ({limit}): {args.requests} requests, {args.concurrency} concurrent")
            print(f"  allowed {allowed}, limited {limited}, other {len(results) - allowed - limited}")
            status, headers = _get(base + path)
            print(f"  one more request -> {status}")
            for name in ("RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "Retry-After"):
                if name.lower() in headers:
                    print(f"    {name}: {headers[name.lower()]}")
            print()
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``ratewarden`` command line."""
    sub = subparsers.add_parser("demo", help="serve a demo app, send it bursts of requests and print what was limited", add_help=False)
    sub.set_defaults(handler=lambda ns, rest: main(rest))
