"""``ratewarden demo``: serve the README's first example (a rate-limited FastAPI app) on loopback,
send each endpoint a burst of concurrent requests over real HTTP, print how many were allowed and
limited (and the rate limit headers of one more request), then exit. It is not interactive.

Needs FastAPI and uvicorn: ``pip install 'ratewarden[fastapi]' uvicorn`` (what ``make demo`` installs, in a
virtualenv of its own).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

__all__ = ["ENDPOINTS", "build_app", "main", "register"]

ENDPOINTS: tuple[tuple[str, int, str], ...] = (
    ("/api/hello", 100, "100/min per client IP, middleware rule, sliding_window"),
    ("/items", 10, "10/s per client IP, route dependency, fixed_window"),
)
"""What the demo drives: each endpoint's path, limit and description (the README's example)."""


def build_app() -> object:
    """The README's first example, as written there."""
    from fastapi import Depends, FastAPI

    from .. import Limiter, MemoryStore, RateLimitMiddleware, Rule
    from ..fastapi import RateLimit, install
    from ..keys import client_ip

    limiter = Limiter(MemoryStore())
    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        limiter=limiter,
        rules=[Rule("/api/**", "100/min", key=client_ip, algorithm="sliding_window")],
    )

    @app.get("/api/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    @app.get("/items", dependencies=[Depends(RateLimit("10/s", limiter=limiter))])
    async def items() -> dict[str, bool]:
        return {"ok": True}

    install(app)
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
        description="Serve the README's first example (a rate-limited FastAPI app) on loopback, send each endpoint a burst of "
        "concurrent requests, print how many were allowed and limited, and exit. "
        "Needs FastAPI and uvicorn: pip install 'ratewarden[fastapi]' uvicorn.",
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per endpoint (default: its limit plus 10)"
    )
    parser.add_argument("--concurrency", type=int, default=10, help="concurrent clients (default 10)")
    args = parser.parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("ratewarden demo needs uvicorn and FastAPI: pip install 'ratewarden[fastapi]' uvicorn")
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
        for path, limit, described in ENDPOINTS:
            count = limit + 10 if args.requests is None else args.requests
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(_get, [base + path] * count))
            allowed = sum(1 for status, _ in results if status == 200)
            limited = sum(1 for status, _ in results if status == 429)
            print(f"GET {path}  ({described}): {count} requests, {args.concurrency} concurrent")
            print(f"  allowed {allowed}, limited {limited}, other {len(results) - allowed - limited}")
            status, headers = _get(base + path)
            print(f"  one more request -> {status}")
            for name in ("RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "Retry-After"):
                if name.lower() in headers:
                    print(f"    {name}: {headers[name.lower()]}")
            print()
        print(
            "RateLimit-Policy: q is the limit and w its window in seconds. RateLimit: r is what is left and t the\n"
            "seconds until more quota is made available (on a 429, Retry-After's). A sliding window's requests\n"
            "fade during the next window, so its t can pass the current window's end. More: docs/responses.md,\n"
            "'Headers and 429s'."
        )
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``ratewarden`` command line."""
    sub = subparsers.add_parser("demo", help="serve a demo app, send it bursts of requests and print what was limited", add_help=False)
    sub.set_defaults(handler=lambda ns, rest: main(rest))
