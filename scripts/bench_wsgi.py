"""WSGI rows: bare Flask / Django, flask-limiter, django-ratelimit and ratewarden's WSGI
integrations, in one process by direct PEP 3333 calls, then (``--live``) under gunicorn and wrk.

In-process: a fresh environ per request, ``app(environ, start_response)``, the body consumed; the
variants interleaved in ``--rounds`` rounds of ``--requests`` requests; min and median µs per request,
the extra over the bare app of the same framework, and exactness (a burst of 150 requests from 8
threads against a fresh limit of 100: admitted must be 100). Memory rows, then Redis rows (a private
``redis-server`` on a free loopback port). Then the targets, each as target / ours / floor.

    .venv/bin/python scripts/bench_wsgi.py                       # memory + Redis, 7 rounds x 2000
    .venv/bin/python scripts/bench_wsgi.py --rounds 5 --requests 1000 --no-redis
    .venv/bin/python scripts/bench_wsgi.py --live                # + gunicorn/wrk rows (about 3 min per store)
    .venv/bin/python scripts/bench_wsgi.py --live-only --live-store memory,redis

Writes JSON to ``--json`` (default ``bench-wsgi.json``). The modules behind it are ``ratewarden.bench.wsgi``,
``wsgi_apps`` and ``wsgi_live`` (the live rows, as ``ratewarden bench --wsgi`` runs them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:  # the installed ratewarden (a compiled wheel's venv, or the editable install) ...
    import ratewarden
except ImportError:  # ... else this checkout's source tree
    sys.path.insert(0, str(ROOT / "src"))
    import ratewarden
# gunicorn's children import the same ratewarden as this process.
PACKAGE_ROOT = str(Path(ratewarden.__file__).resolve().parents[1])

from ratewarden.bench import wsgi as bw  # noqa: E402
from ratewarden.bench import wsgi_live  # noqa: E402
from ratewarden.bench.drivers.live import LiveError  # noqa: E402
from ratewarden.bench.services import BenchError, StoreService  # noqa: E402

table = bw.row_table
target_table = bw.target_table


# ---------------------------------------------------------------------------------------------- main

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="requests per variant per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-django", action="store_true")
    ap.add_argument("--no-flask", action="store_true")
    ap.add_argument("--no-exact", action="store_true", help="skip the exactness bursts")
    ap.add_argument("--redis-url", default="", help="an existing Redis (default: start a private redis-server)")
    ap.add_argument("--live", action="store_true",
                    help="also the gunicorn + wrk rows (ratewarden.bench.wsgi_live; about 3 minutes per store at 3 rounds)")
    ap.add_argument("--live-only", action="store_true")
    ap.add_argument("--live-seconds", type=float, default=3.0, help="seconds per wrk run")
    ap.add_argument("--live-rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    ap.add_argument("--live-workers", type=int, default=2, help="gunicorn sync workers per server")
    ap.add_argument("--live-store", default="memory",
                    help="memory and/or redis, comma-separated (memory: ratewarden on its SharedMemoryStore, "
                         "the peers per process)")
    ap.add_argument("--json", default="bench-wsgi.json")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of missing rows")
    args = ap.parse_args(argv)

    live_stores = [s.strip() for s in args.live_store.split(",") if s.strip()]
    want_redis = (not args.no_redis and not args.live_only) or ((args.live or args.live_only)
                                                                 and "redis" in live_stores)
    result: dict[str, Any] = {
        "python": platform.python_version(), "ratewarden_from": PACKAGE_ROOT, "platform": platform.platform(), "cpus": os.cpu_count(),
        "argv": sys.argv, "requests": args.requests, "rounds": args.rounds,
        "exact": {"limit": bw.EXACT_LIMIT, "calls": bw.EXACT_CALLS, "threads": bw.EXACT_THREADS},
        "versions": _versions(), "rows": [], "targets": [], "live": [],
    }
    with contextlib.ExitStack() as stack:
        redis_url = args.redis_url
        if want_redis and not redis_url:
            try:
                redis_url = stack.enter_context(StoreService("redis")).url
            except BenchError as exc:
                print(f"no Redis rows: {exc}", file=sys.stderr)
        rows: list[bw.Row] = []
        if not args.live_only:
            phases = [] if args.no_memory else ["memory"]
            if redis_url and not args.no_redis:
                phases.append("redis")
            for store in phases:
                print(f"{store} rows: {args.rounds} rounds x {args.requests} requests", flush=True)
                vs = bw.variants(store, redis_url, django=not args.no_django, flask=not args.no_flask)
                part = bw.measure(vs, requests=args.requests, rounds=args.rounds, exact=not args.no_exact,
                                  verbose=args.verbose)
                rows += part
                print(table(part), flush=True)
            ts = bw.targets(rows)
            result["rows"] = [r.as_dict() for r in rows]
            result["targets"] = ts
            print("\nIn-process, µs per request (min and median of the rounds; extra = over the bare app of "
                  "the same framework, same statistic):\n")
            print(table(rows))
            print("\nTargets (from the medians / from the minima of the rounds; 429 rows: whole µs per refused request):\n")
            print(target_table(ts))
        if args.live or args.live_only:
            method = wsgi_live.describe(args.live_workers, args.live_seconds, args.live_rounds, 1, 50)
            print(f"\nlive: {method}", flush=True)
            try:
                rows_live = wsgi_live.run_live(live_stores, redis_url=redis_url, workers=args.live_workers,
                                               duration=args.live_seconds, rounds=args.live_rounds)
            except (BenchError, LiveError) as exc:
                print(f"no live rows: {exc}", file=sys.stderr)
            else:
                result["live"] = wsgi_live.as_dicts(rows_live)
                result["live_method"] = method
                for line in wsgi_live.over_limit_lines(rows_live):
                    print(line)
                print(wsgi_live.live_table(rows_live))
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {args.json}")
    return 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("ratewarden", "flask", "flask-limiter", "limits", "django", "django-ratelimit", "redis",
                 "gunicorn"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    return out


if __name__ == "__main__":
    raise SystemExit(main())
