"""Cost per request of ``PolicyMiddleware`` on direct ASGI calls (no HTTP client, memory store).

Three variants: the bare app, a request the middleware allows, and one it refuses with a 429.
``--compare SRC`` loads the ``ratewarden`` package of another source tree (e.g. an export of the
previous commit: ``git archive HEAD~1 src | tar -x -C /tmp/base``) under another name in the same
process, and alternates the two round by round, so drift and noise hit both alike; it prints min
and median µs per request for each tree and the ratios of this tree's figures to the other's.
A mypyc-compiled build (``--src`` its lib directory) cannot be loaded under another name: compare
two builds by running the script on each, alternately.

    python scripts/bench_policy.py --rounds 15 --requests 5000 --compare /tmp/base/src
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

VARIANTS = ("bare", "allowed", "limited")
TEMPLATE = {
    "type": "http", "method": "GET", "headers": [(b"host", b"local")], "query_string": b"",
    "client": ("10.0.0.1", 1234), "server": ("local", 80), "scheme": "http", "root_path": "",
}


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Any) -> None:
    return None


def _middleware(package: ModuleType) -> Any:
    policy = importlib.import_module(package.__name__ + ".policy")
    rules = [package.Rule("/allowed", "1000000000/min", name="allowed"), package.Rule("/limited", "1/hour", name="limited")]
    return policy.PolicyMiddleware(_app, package.Limiter(package.MemoryStore()), rules)


async def _run(target: Any, path: str, requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        await target({**TEMPLATE, "path": path}, _receive, _send)
    return (time.perf_counter() - start) / requests * 1e6


def _load_copy(src: str, name: str) -> ModuleType:
    """The ``ratewarden`` package of ``src`` imported as ``name`` (its imports are relative)."""
    root = Path(tempfile.mkdtemp(prefix="bench-policy-"))
    shutil.copytree(Path(src) / "ratewarden", root / name)
    sys.path.insert(0, str(root))
    return importlib.import_module(name)


async def _bench(trees: dict[str, ModuleType], rounds: int, requests: int) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {t: {v: [] for v in VARIANTS} for t in trees}
    apps = {t: _middleware(p) for t, p in trees.items()}
    for middleware in apps.values():  # warm-up; leaves "/limited" over its limit
        await _run(middleware, "/limited", requests)
        await _run(middleware, "/allowed", requests)
    order = list(trees)
    for _ in range(rounds):
        for tree in order:
            results[tree]["bare"].append(await _run(_app, "/allowed", requests))
            results[tree]["allowed"].append(await _run(apps[tree], "/allowed", requests))
            results[tree]["limited"].append(await _run(apps[tree], "/limited", requests))
        order.reverse()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000, help="requests per variant and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"),
                        help="the tree measured as 'this' (default: this checkout's src; a build's lib dir works too)")
    parser.add_argument("--compare", metavar="SRC", help="another source tree to measure alongside this one")
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    trees = {"this": importlib.import_module("ratewarden")}
    if args.compare:
        trees["compare"] = _load_copy(args.compare, "ratewarden_compare")
    results = asyncio.run(_bench(trees, args.rounds, args.requests))
    for tree in trees:
        cells = [f"{v} min {min(results[tree][v]):.2f} median {statistics.median(results[tree][v]):.2f}" for v in VARIANTS]
        print(f"{tree:8} µs/request: " + "; ".join(cells))
    if args.compare:
        for v in VARIANTS:
            this, other = results["this"][v], results["compare"][v]
            print(f"{v}: this/compare min {min(this) / min(other):.3f}, median {statistics.median(this) / statistics.median(other):.3f}")


if __name__ == "__main__":
    main()
