#!/usr/bin/env python3
"""Flood one uvicorn worker over real HTTP and print how many requests the rate limit admitted.

    .venv/bin/python scripts/flood.py --store redis --store memcached --path middleware --path edge -c 1000 -d 5

Each (store, path) pair gets a fresh app (``tests/flood/app.py``, one uvicorn worker) limited to
``--rate`` per client IP, flooded by ``wrk`` (or the asyncio client) on one route. ``--store`` is a kind
(memory, shm, redis, redis-cluster, memcached: the script starts a throwaway server on free loopback
ports) or a store URL (used as is; nothing is flushed, each flood has its own key prefix).
``--pause S`` SIGSTOPs the servers the script started for S seconds, one second into each flood.
See docs/flood.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.flood.app import PATHS
from tests.flood.load import Flood, app_server, clear_of_window_edge, flood, raise_fd_limit

from ratewarden import parse_rate
from ratewarden.bench.services import STORES, StoreService

COLUMNS = ("store", "path", "conns", "req/s", "admitted/limit", "statuses", "without store")


def _pause(procs: list[int], after: float, seconds: float) -> None:
    """SIGSTOP ``procs`` ``after`` seconds from now for ``seconds``, then SIGCONT."""
    time.sleep(after)
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in procs:
            os.kill(pid, signal.SIGCONT)


def _row(store: str, path: str, result: Flood, limit: int) -> tuple[str, ...]:
    extra = {k: v for k, v in sorted(result.statuses.items()) if k not in (200, 429)}
    statuses = f"429: {result.statuses.get(429, 0)}" + "".join(f", {k}: {v}" for k, v in extra.items())
    ws = result.without_store
    without = "n/a" if ws is None else (", ".join(f"{k} {v}" for k, v in ws.items()) or "none")
    if result.load.errors:
        statuses += " (client errors: " + ", ".join(f"{k} {v}" for k, v in result.load.errors.items()) + ")"
    return (store, path, str(result.load.connections), f"{result.load.rate:,.0f}", f"{result.admitted} / {limit}",
            statuses, without)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    for n, row in enumerate([COLUMNS, *rows]):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flood.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store", action="append", default=[],
                        help=f"a kind ({', '.join(STORES)}) or a store URL; repeat for several (default: memory)")
    parser.add_argument("--path", action="append", default=[], choices=PATHS,
                        help="the integration path; repeat for several (default: middleware)")
    parser.add_argument("-c", "--connections", type=int, default=1000, help="keep-alive connections (default 1000)")
    parser.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per flood (default 5)")
    parser.add_argument("--rate", default="100/hour", help="the limit per client IP, fixed window (default 100/hour)")
    parser.add_argument("--tool", choices=("auto", "wrk", "asyncio"), default="auto",
                        help="the load generator (auto: wrk when installed)")
    parser.add_argument("--pause", type=float, default=0.0, metavar="S",
                        help="SIGSTOP the started store servers for S seconds, 1 s into each flood")
    args = parser.parse_args(argv)
    rate = parse_rate(args.rate)
    if args.pause and args.duration < args.pause + 1:
        parser.error("--duration must cover the pause: at least --pause + 1 seconds")
    raise_fd_limit()
    rows: list[tuple[str, ...]] = []
    with ExitStack() as stack:
        for store in args.store or ["memory"]:
            procs: list[int] = []
            if store == "memory":
                url, label = "memory://", store
            elif "://" in store:
                url, label = store, store.split("://", 1)[0]
            else:
                service = stack.enter_context(StoreService(store))
                url, label, procs = service.url, store, [p.pid for p in service.procs]
            if args.pause and not procs:
                parser.error(f"--pause needs a store the script starts, not {store!r}")
            for path in args.path or ["middleware"]:
                clear_of_window_edge(rate.period, args.duration + 15)
                with app_server(url, path, args.rate, f"flood{uuid.uuid4().hex[:10]}") as app:
                    during = functools.partial(_pause, procs, 1.0, args.pause) if args.pause else None
                    result = flood(app, args.connections, args.duration, tool=args.tool, during=during)
                rows.append(_row(label, path, result, rate.limit))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print()
    _print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
