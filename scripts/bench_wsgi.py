"""WSGI rows (issue 23): bare Flask / Django, flask-limiter, django-ratelimit and ratewarden's WSGI
integrations, in one process by direct PEP 3333 calls, then (``--live``) under gunicorn and wrk.

In-process: a fresh environ per request, ``app(environ, start_response)``, the body consumed; the
variants interleaved in ``--rounds`` rounds of ``--requests`` requests; min and median µs per request,
the extra over the bare app of the same framework, and exactness (a burst of 150 requests from 8
threads against a fresh limit of 100: admitted must be 100). Memory rows, then Redis rows (a private
``redis-server`` on a free loopback port). Then the issue's targets, each as target / ours / floor.

    .venv/bin/python scripts/bench_wsgi.py                       # memory + Redis, 7 rounds x 2000
    .venv/bin/python scripts/bench_wsgi.py --rounds 5 --requests 1000 --no-redis
    .venv/bin/python scripts/bench_wsgi.py --live                # + gunicorn/wrk rows (< 2 minutes)
    .venv/bin/python scripts/bench_wsgi.py --live-only

Writes JSON to ``--json`` (default ``bench-wsgi.json``). The modules behind it are ``ratewarden.bench.wsgi`` and ``wsgi_apps``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
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
from ratewarden.bench.services import BenchError, StoreService, free_port  # noqa: E402


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


table = bw.row_table
target_table = bw.target_table


# ---------------------------------------------------------------------------------------------- live

@contextlib.contextmanager
def gunicorn(app: str, *, threads: int, worker_class: str, env: dict[str, str]) -> Iterator[int]:
    """``gunicorn APP`` (1 worker) on a free loopback port; yields the port once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--threads", str(threads), "--worker-class", worker_class, "--log-level", "warning",
            "--graceful-timeout", "2", "--backlog", "2048"]
    child_env = {**os.environ, **env, "RW_BENCH_RUN": uuid.uuid4().hex[:8]}  # fresh counters per server
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, child_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, cwd=ROOT, env=child_env, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise BenchError(f"gunicorn {app} exited with {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"gunicorn {app} did not listen on {port}") from None
                time.sleep(0.05)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wrk(port: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t2", "-c50", f"-d{seconds}s", f"http://127.0.0.1:{port}{bw.PATH}"],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    total = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s*([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    n = int(total.group(1)) if total else 0
    bad = int(non2xx.group(1)) if non2xx else 0
    return {"requests": n, "rps": float(rps.group(1)) if rps else 0.0, "non2xx": bad, "admitted": n - bad,
            "socket_errors": errors.group(1).strip() if errors else ""}


def live(seconds: int, exact_seconds: int, limit: int, store: str, redis_url: str) -> list[dict[str, Any]]:
    """The Flask apps under gunicorn (1 sync worker; 1 gthread worker with 8 threads) and ``wrk -t2
    -c50``: req/s with every request allowed, then admitted / limit for a limit of ``limit`` per hour."""
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed (scripts/install-system-deps.sh)")
    out: list[dict[str, Any]] = []
    env = {"RW_BENCH_LIMIT": str(limit), "RW_BENCH_REDIS": redis_url}
    for worker_class, threads in (("sync", 1), ("gthread", 8)):
        for variant in ("bare", "flask-limiter", "ratewarden.flask", "ratewarden.wsgi"):
            row: dict[str, Any] = {"server": f"gunicorn {worker_class}" + (f" x{threads}" if threads > 1 else ""),
                                   "variant": variant, "store": "-" if variant == "bare" else store}
            try:
                app = f'ratewarden.bench.wsgi_apps:gunicorn_app("{variant}", "allow", "{store}")'
                with gunicorn(app, threads=threads, worker_class=worker_class, env=env) as port:
                    subprocess.run(["wrk", "-t1", "-c4", "-d1s", f"http://127.0.0.1:{port}{bw.PATH}"],
                                   capture_output=True, timeout=30)  # warm-up
                    allowed = _wrk(port, seconds)
                row.update(rps=allowed["rps"], requests=allowed["requests"], non2xx=allowed["non2xx"],
                           socket_errors=allowed["socket_errors"])
                if variant != "bare":
                    app = f'ratewarden.bench.wsgi_apps:gunicorn_app("{variant}", "exact", "{store}")'
                    with gunicorn(app, threads=threads, worker_class=worker_class, env=env) as port:
                        ex = _wrk(port, exact_seconds)
                    row.update(admitted=ex["admitted"], limit=limit, exact_requests=ex["requests"],
                               limited_rps=ex["rps"])
            except Exception as exc:
                row["missing"] = f"{type(exc).__name__}: {exc}"
            print(f"  {row}", flush=True)
            out.append(row)
    return out


def live_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| server | variant | store | req/s (all allowed) | req/s (mostly 429) | admitted/limit |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "missing" in r:
            lines.append(f"| {r['server']} | {r['variant']} | {r['store']} | MISSING: {r['missing']} | | |")
            continue
        exact = f"{r['admitted']}/{r['limit']} (of {r['exact_requests']})" if "admitted" in r else "-"
        lines.append(f"| {r['server']} | {r['variant']} | {r['store']} | {r['rps']:.0f} | "
                     f"{_fmt(r.get('limited_rps'), 0)} | {exact} |")
    return "\n".join(lines)


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
    ap.add_argument("--live", action="store_true", help="also gunicorn + wrk rows (Flask; < 2 minutes)")
    ap.add_argument("--live-only", action="store_true")
    ap.add_argument("--live-seconds", type=int, default=5)
    ap.add_argument("--live-exact-seconds", type=int, default=2)
    ap.add_argument("--live-limit", type=int, default=1000)
    ap.add_argument("--live-store", choices=("memory", "redis"), default="memory")
    ap.add_argument("--json", default="bench-wsgi.json")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of missing rows")
    args = ap.parse_args(argv)

    want_redis = (not args.no_redis and not args.live_only) or (args.live_only and args.live_store == "redis")
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
            print(f"\nlive: gunicorn + wrk -t2 -c50 -d{args.live_seconds}s, store {args.live_store}", flush=True)
            try:
                result["live"] = live(args.live_seconds, args.live_exact_seconds, args.live_limit, args.live_store,
                                      redis_url)
                print(live_table(result["live"]))
            except BenchError as exc:
                print(f"no live rows: {exc}", file=sys.stderr)
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
