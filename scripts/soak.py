"""Soak run: uvicorn + RedisStore under wrk at 1,000 connections while redis-server is killed and
restarted every few seconds. Checks, at the end:

* the server's RSS and open file descriptors stay flat (start / middle / end, and the slope over
  the second half of the run);
* no HTTP 500 (as wrk saw them, and as the app counted them);
* per 1 s window, the hot key's allowed requests never exceed the limit while Redis was up (the
  rule is a ``fixed_window`` ``--limit``/s per ``X-Key``; the app files each allowed request under
  its window, read from the decision, so a late count never lands in the wrong window).

Exits non-zero when a check fails. Needs redis-server and wrk on the PATH (Linux: RSS and fds
are read from /proc).

    .venv/bin/python scripts/soak.py [--duration 120] [--connections 1000] [--limit 100]
        [--kill-every 5] [--down-for 1] [--on-error open|closed]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
HOT = "hot"

# wrk: half the requests on the hot key, the rest over 50 other keys; status codes tallied
# across threads and printed by done().
WRK_SCRIPT = r"""
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {}; n = 0 end
request = function()
  n = n + 1
  local key = "hot"
  if n % 2 == 1 then key = "k" .. (n % 50) end
  return wrk.format("GET", "/limited", {["X-Key"] = key})
end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local totals = {}
  for _, t in ipairs(threads) do
    for code, count in pairs(t:get("statuses")) do totals[code] = (totals[code] or 0) + count end
  end
  for code, count in pairs(totals) do io.write(string.format("status %d %d\n", code, count)) end
  local e = summary.errors
  io.write(string.format("errors connect=%d read=%d write=%d timeout=%d\n", e.connect, e.read, e.write, e.timeout))
  io.write(string.format("requests %d p99_ms %.1f\n", summary.requests, latency:percentile(99) / 1000))
end
"""


# -- the app (run in the uvicorn child process) ----------------------------------------------------


def build_app(redis_url: str, limit: int, on_error: str) -> Any:
    from ratewarden import Limiter, RateLimitMiddleware, Rule, context_of
    from ratewarden.keys import header
    from ratewarden.stores.redis import RedisStore

    allowed: Counter[int] = Counter()  # hot key: allowed requests per window (its end, epoch s)
    unchecked: Counter[int] = Counter()  # hot key: served without a decision (fail-open)
    statuses: Counter[int] = Counter()

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/stats":
            body = json.dumps({
                "pid": os.getpid(), "allowed": allowed, "unchecked": unchecked, "statuses": statuses,
                "inflight": getattr(getattr(limiter.store, "_pipeline", None), "inflight", None),
            }).encode()
        else:
            if dict(scope["headers"]).get(b"x-key") == HOT.encode():
                context = context_of(scope)
                decision = context.decision if context is not None else None
                if decision is not None:
                    allowed[round(time.time() + decision.reset_after)] += 1
                else:
                    unchecked[int(time.time()) + 1] += 1  # filed under the window's end too
            body = b"ok"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    limiter = Limiter(RedisStore(redis_url, timeout=0.05), on_error=on_error)  # type: ignore[arg-type]
    rule = Rule("/limited", f"{limit}/s", key=header("X-Key"), algorithm="fixed_window")
    limited = RateLimitMiddleware(endpoint, limiter, [rule])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await limited(scope, receive, send)
            return

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] += 1
            await send(message)

        try:
            await limited(scope, receive, counting_send)
        except Exception:
            statuses[500] += 1
            raise

    return app


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    app = build_app(args.redis_url, args.limit, args.on_error)
    uvicorn.run(app, host=HOST, port=args.port, log_level="warning", backlog=4096, lifespan="off")


# -- the driver ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def redis_ping(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


def http_get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=5) as reply:
        return bytes(reply.read())


def proc_sample(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of ``pid``."""
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (per second)."""
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / den if den else 0.0


def run(args: argparse.Namespace) -> int:
    for binary in ("redis-server", "wrk"):
        if shutil.which(binary) is None:
            print(f"soak: {binary} is not installed", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="rw-soak-"))
    redis_port, app_port = free_port(), free_port()
    redis_argv = [
        "redis-server", "--port", str(redis_port), "--bind", HOST, "--save", "", "--appendonly", "no",
        "--dir", str(workdir), "--protected-mode", "no", "--loglevel", "warning",
    ]
    redis = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[subprocess.Popen[bytes]] = [redis]
    outages: list[tuple[float, float]] = []  # (killed at, answering again at), wall clock
    try:
        wait_for(lambda: redis_ping(redis_port), 10, "redis-server")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        server_log = open(workdir / "server.log", "wb")  # noqa: SIM115 - closed with the workdir
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--port", str(app_port), "--redis-url",
             f"redis://{HOST}:{redis_port}/0", "--limit", str(args.limit), "--on-error", args.on_error],
            env=env, stdout=server_log, stderr=subprocess.STDOUT,
        )
        procs.append(server)
        wait_for(lambda: http_get(app_port, "/stats").startswith(b"{"), 20, "uvicorn")
        script = workdir / "tally.lua"
        script.write_text(WRK_SCRIPT)
        wrk = subprocess.Popen(
            ["wrk", "-t", str(args.threads), "-c", str(args.connections), "-d", f"{args.duration}s", "--timeout", "5s",
             "-s", str(script), f"http://{HOST}:{app_port}/limited"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        procs.append(wrk)  # type: ignore[arg-type]
        started = time.monotonic()
        samples: list[tuple[float, int, int]] = []
        next_kill = started + args.kill_every
        while wrk.poll() is None:
            now = time.monotonic()
            samples.append((now - started, *proc_sample(server.pid)))
            if now >= next_kill and now - started < args.duration - args.down_for - 1:
                killed = time.time()
                redis.kill()
                redis.wait(5)
                time.sleep(args.down_for)
                redis = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(redis)
                wait_for(lambda: redis_ping(redis_port), 10, "redis-server restart")
                outages.append((killed, time.time()))
                next_kill = time.monotonic() + args.kill_every
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
        wrk_out = wrk.stdout.read() if wrk.stdout else ""
        time.sleep(1.0)  # let the server close the load's connections
        stats = json.loads(http_get(app_port, "/stats"))
        after = proc_sample(server.pid)
        server_log.close()
        log_lines = (workdir / "server.log").read_text(errors="replace").splitlines()
        failed_checks = sum("rate limit check failed" in line for line in log_lines)
        tracebacks = sum(line.startswith("Traceback") for line in log_lines)
        print(f"server log: {len(log_lines)} lines, {failed_checks} 'rate limit check failed' (at most one a second), "
              f"{tracebacks} tracebacks")
        kinds = Counter(line.split(": ", 1)[-1].split(f"{HOST}:{redis_port}")[-1][:90] for line in log_lines)
        for kind, count in kinds.most_common(4):
            print(f"server log: {count} x {kind}")
        # asyncio names the destroyed task on the line after its warning: which coroutine was it?
        destroyed = Counter(
            nxt.split("coro=<", 1)[-1][:300]
            for line, nxt in itertools.pairwise(log_lines)
            if "Task was destroyed but it is pending" in line
        )
        for coro, count in destroyed.most_common():
            print(f"server log: {count} pending tasks destroyed, running {coro}")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    failures = [f"{tracebacks} tracebacks in the server log"] if tracebacks else []
    if destroyed:  # a task nobody held any more: its clean-up ran whenever the GC got to it
        failures.append(f"{sum(destroyed.values())} pending tasks destroyed")
    return report(args, wrk_out, stats, samples, after, outages, failures)


def report(
    args: argparse.Namespace, wrk_out: str, stats: dict[str, Any], samples: list[tuple[float, int, int]],
    after: tuple[int, int], outages: list[tuple[float, float]], failures: list[str],
) -> int:
    wrk_status = {int(line.split()[1]): int(line.split()[2]) for line in wrk_out.splitlines() if line.startswith("status ")}
    other = [line for line in wrk_out.splitlines() if line.startswith(("errors", "requests"))]
    print(f"wrk: {args.connections} connections, {args.duration} s; statuses {dict(sorted(wrk_status.items()))}")
    for line in other:
        print(f"wrk: {line}")
    app_status = {int(k): v for k, v in stats["statuses"].items()}
    print(f"app: statuses {dict(sorted(app_status.items()))}; store pipelines in flight at the end: {stats.get('inflight')}")
    if stats.get("inflight"):
        failures.append(f"{stats['inflight']} store pipelines still in flight after the load (a leaked slot wedges the store)")
    five_hundreds = wrk_status.get(500, 0) + app_status.get(500, 0)
    if five_hundreds or not wrk_status:
        failures.append(f"{five_hundreds} HTTP 500s" if wrk_status else "wrk reported no responses")

    # Memory and descriptors: flat once warm (the second half of the run).
    first, middle, last = samples[0], samples[len(samples) // 2], samples[-1]
    half = samples[len(samples) // 2 :]
    rss_slope = slope([(t, rss / 1024) for t, rss, _ in half]) * 60
    fd_slope = slope([(t, fds) for t, _, fds in half]) * 60
    print(
        f"RSS MiB start/middle/end: {first[1] / 1024:.1f} / {middle[1] / 1024:.1f} / {last[1] / 1024:.1f}; "
        f"slope over the second half {rss_slope:+.2f} MiB/min"
    )
    print(
        f"open fds start/middle/end: {first[2]} / {middle[2]} / {last[2]} (under load); slope over the second half "
        f"{fd_slope:+.1f}/min; after the load: {after[1]} fds, RSS {after[0] / 1024:.1f} MiB"
    )
    if last[1] > middle[1] * 1.2 + 10 * 1024:
        failures.append(f"RSS grew from {middle[1] / 1024:.1f} to {last[1] / 1024:.1f} MiB in the second half")
    if last[2] > middle[2] + 50:
        failures.append(f"open fds grew from {middle[2]} to {last[2]} in the second half")
    if after[1] > first[2] + 20:
        failures.append(f"{after[1]} fds open after the load (at start: {first[2]}): a leak")

    # Per-window allowed counts on the hot key, in windows where Redis was up throughout.
    allowed = {int(k): v for k, v in stats["allowed"].items()}
    unchecked_by_window = {int(k): v for k, v in stats["unchecked"].items()}
    unchecked = sum(unchecked_by_window.values())

    def up(window_end: int) -> bool:
        return all(not (killed < window_end and back > window_end - 1) for killed, back in outages)

    up_windows = {w: c for w, c in allowed.items() if up(w)}
    over = {w: c for w, c in up_windows.items() if c > args.limit}
    counts = sorted(up_windows.values())
    print(
        f"redis killed {len(outages)} times ({args.down_for:g} s down each); hot key allowed per 1 s window "
        f"(Redis up, {len(counts)} windows): min {counts[0] if counts else 0}, median "
        f"{statistics.median(counts) if counts else 0}, max {counts[-1] if counts else 0} (limit {args.limit}); "
        f"{len(allowed) - len(up_windows)} windows touched an outage"
    )
    unchecked_up = sum(v for w, v in unchecked_by_window.items() if up(w))
    print(
        f"hot key served unchecked (fail-open, store failed or timed out): {unchecked} in all, {unchecked_up} in "
        f"windows with Redis up; hot key allowed by Redis: {sum(allowed.values())}"
    )
    if over:
        failures.append(f"windows over the limit while Redis was up: {dict(sorted(over.items()))}")
    if not counts:
        failures.append("no window with Redis up was observed")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("soak: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=120, help="seconds of load (default 120)")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--limit", type=int, default=100, help="per second, per key")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds of Redis uptime between kills")
    parser.add_argument("--down-for", type=float, default=1.0, help="seconds Redis stays down each time")
    parser.add_argument("--on-error", choices=("open", "closed"), default="open")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
