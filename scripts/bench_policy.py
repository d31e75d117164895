"""Cost per request of ``PolicyMiddleware`` on direct ASGI calls (no HTTP client, memory store).

Three variants: the bare app, a request the middleware allows, and one it refuses with a 429.
``--compare SRC`` runs the same measurement against another source tree (e.g. an export of the
previous commit) in alternating subprocesses, round by round, so drift and noise hit both alike;
it prints min and median µs per request for each tree and the ratio of their medians.

    python scripts/bench_policy.py --rounds 7 --requests 20000 --compare /tmp/base/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("bare", "allowed", "limited")


def _measure(requests: int) -> dict[str, float]:
    """µs per request of each variant, in this process (the tree on ``sys.path`` decides)."""
    from ratewarden import Limiter, MemoryStore, Rule
    from ratewarden.policy import PolicyMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    rules = [Rule("/allowed", "1000000000/min", name="allowed"), Rule("/limited", "1/hour", name="limited")]
    middleware = PolicyMiddleware(app, Limiter(MemoryStore()), rules)
    template = {
        "type": "http", "method": "GET", "headers": [(b"host", b"local")], "query_string": b"",
        "client": ("10.0.0.1", 1234), "server": ("local", 80), "scheme": "http", "root_path": "",
    }

    async def run(target: Any, path: str) -> float:
        start = time.perf_counter()
        for _ in range(requests):
            await target({**template, "path": path}, receive, send)
        return (time.perf_counter() - start) / requests * 1e6

    async def main() -> dict[str, float]:
        await run(middleware, "/limited")  # warm-up; leaves "/limited" over its limit
        await run(middleware, "/allowed")
        return {
            "bare": await run(app, "/allowed"),
            "allowed": await run(middleware, "/allowed"),
            "limited": await run(middleware, "/limited"),
        }

    return asyncio.run(main())


def _subprocess(src: str, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--requests", str(requests)],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", metavar="SRC", help="another source tree to measure alongside this one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_measure(args.requests)))
        return
    trees = {"this": str(Path(__file__).resolve().parents[1] / "src")}
    if args.compare:
        trees["compare"] = args.compare
    results: dict[str, dict[str, list[float]]] = {t: {v: [] for v in VARIANTS} for t in trees}
    for _ in range(args.rounds):
        for tree, src in trees.items():
            for variant, us in _subprocess(src, args.requests).items():
                results[tree][variant].append(us)
    for tree in trees:
        cells = [f"{v} min {min(results[tree][v]):.2f} median {statistics.median(results[tree][v]):.2f}" for v in VARIANTS]
        print(f"{tree:8} µs/request: " + "; ".join(cells))
    if args.compare:
        for v in VARIANTS:
            ratio = statistics.median(results["this"][v]) / statistics.median(results["compare"][v])
            print(f"{v}: this/compare median ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
