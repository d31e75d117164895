"""Per-check time of ``RedisStore.hit`` on the allowed path, two source trees compared (A/B).

Each run is a fresh process importing ratewarden from one tree, timing 5 passes of
``--checks`` checks (50 in flight, one gcra limit, loopback redis-server started here) and
printing its best pass in µs per check. Runs alternate between the trees (order flipped every
round); the report gives each tree's min and median over ``--rounds``.

    .venv/bin/python scripts/bench_redis_ab.py --a /path/to/old/src --b src [--rounds 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def _one_run(url: str, checks: int) -> float:
    from ratewarden.limits import make_limits
    from ratewarden.stores.redis import RedisStore

    store = RedisStore(url, timeout=1)
    (limit,) = make_limits("1000000000/hour", "gcra")
    keys = [f"rw:{{ab|{i}}}:{limit.suffix}" for i in range(50)]

    async def worker(key: str) -> None:
        for _ in range(checks // 50):
            await store.hit([key], [limit], [1.0])

    await asyncio.gather(*(worker(k) for k in keys))  # warm-up: connections, script, caches
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in keys))
        best = min(best, (time.perf_counter() - started) / checks * 1e6)
    await store.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="source tree A (the directory holding ratewarden/)")
    parser.add_argument("--b", required=True, help="source tree B")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--checks", type=int, default=20000)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: one run against this URL
    args = parser.parse_args()
    if args.run:
        print(asyncio.run(_one_run(args.run, args.checks)))
        return
    sys.path.insert(0, str(ROOT))
    from tests.servers import RedisStandalone

    server = RedisStandalone().start()
    trees = {"A": str(Path(args.a).resolve()), "B": str(Path(args.b).resolve())}
    results: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for n in range(args.rounds):
            for name in ("A", "B") if n % 2 == 0 else ("B", "A"):
                env = {**os.environ, "PYTHONPATH": trees[name]}
                out = subprocess.run(
                    [sys.executable, __file__, "--a", args.a, "--b", args.b, "--checks", str(args.checks),
                     "--run", server.url],
                    env=env, capture_output=True, text=True, check=True,
                )
                results[name].append(float(out.stdout.strip()))
    finally:
        server.close()
    for name, values in results.items():
        print(f"{name} {trees[name]}: min {min(values):.2f} µs, median {statistics.median(values):.2f} µs per check")
    print(f"B/A: min {min(results['B']) / min(results['A']):.3f}, "
          f"median {statistics.median(results['B']) / statistics.median(results['A']):.3f}")


if __name__ == "__main__":
    main()
