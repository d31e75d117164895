"""Live driver: the app under uvicorn in its own process on loopback, loaded by wrk at fixed concurrency.

Server and load generator are pinned to different cores when the machine has two or more, so the
generator does not steal the server's CPU; the server's CPU time and RSS are sampled (not wrk's).
With several uvicorn workers nothing is pinned (the workers need the cores), and CPU and RSS are
summed over the supervisor and its worker processes.

The libraries of one scenario run in interleaved rounds (:func:`rounds`): all their servers are up,
and each round loads every one of them once, as the in-process driver interleaves its iterations.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ...errors import RatewardenError
from ..adapters.base import StoreSpec
from ..results import Run
from ..scenarios import Scenario

__all__ = ["MANY_KEYS", "LiveError", "LiveServer", "ServerStartError", "ServerStats", "count_admitted", "cpu_plan",
           "default_workers", "raise_fd_limit", "require_wrk", "rounds", "run_iteration", "wrk_script"]


#: Distinct identities of a many-keys live scenario (wrk picks one at random per request).
MANY_KEYS = 10_000


class LiveError(RatewardenError, RuntimeError):
    """The live run cannot proceed (missing wrk, server failed to start...); the message says what to fix."""


class ServerStartError(LiveError):
    """The library's server did not start (its output says why): that configuration cannot run."""


@dataclass(frozen=True)
class ServerStats:
    """The server's own counts so far, summed over its worker processes (``/__bench__/stats``):
    handler runs of the limited routes, and checks decided without the store by reason (None when
    the limiter does not count them)."""

    admitted: int | None
    without_store: dict[str, int] | None


def rounds(count: int, total: int) -> list[tuple[int, int]]:
    """``(round, index)`` for ``total`` rounds over ``count`` configurations: every one once per round,
    each round starting one further on (as the in-process driver does), so no library always runs
    first, or right after the same one, and a burst of load from elsewhere spreads over the rows."""
    return [(i, (i + k) % count) for i in range(total) for k in range(count)] if count else []


def default_workers() -> int:
    """uvicorn workers for a multi-worker run: one per available core, at least 2."""
    return max(2, len(os.sched_getaffinity(0)))


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise LiveError("wrk (the load generator) is not installed: run `apt-get install wrk` "
                        "(or scripts/install-system-deps.sh), or use --driver inprocess")
    return path


def raise_fd_limit(needed: int) -> int:
    """Raise the soft open-files limit (``ulimit -n``) towards the hard one; returns the new soft limit.

    wrk holds one socket per connection and uvicorn one per accepted connection, so 1000 connections
    need well over the common default soft limit of 1024. Only the soft limit is changed, for this
    process and the servers it starts; a hard limit below ``needed`` is an error to fix outside.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    target = max(needed, 65536) if hard == resource.RLIM_INFINITY else min(max(needed, 65536), hard)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LiveError(f"the open-files hard limit ({hard}) is below the {needed} this run needs; "
                        f"raise it (`ulimit -Hn {needed}` as root, or in limits.conf) or lower --concurrency")
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def cpu_plan() -> tuple[set[int] | None, set[int] | None]:
    """(server cores, client cores): the first available core for the server, the rest for wrk."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return {cores[0]}, set(cores[1:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """One library's benchmark app in a uvicorn subprocess; a context manager that always stops it."""

    def __init__(self, library: str, scenario: Scenario, store: StoreSpec, cores: set[int] | None,
                 workers: int = 1) -> None:
        self.library, self.scenario, self.store, self.cores = library, scenario, store, cores
        self.workers = workers
        self.port = 0
        self.pids: set[bytes] = set()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())

    def __enter__(self) -> LiveServer:
        try:
            self.start()
        except BaseException:
            self.stop()  # a server that failed to start may still be running (uvicorn's supervisor)
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        """The server's command line on ``self.port``, and its environment (None: this one's)."""
        return [sys.executable, "-m", "ratewarden.bench.server", "--library", self.library,
                "--scenario", self.scenario.key, "--store", self.store.kind, "--store-url", self.store.url,
                "--port", str(self.port), "--workers", str(self.workers)], None

    def start(self) -> None:
        self.port = free_port()
        cmd, env = self.command()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True,
                                     env=env)
        if self.cores:
            os.sched_setaffinity(self.proc.pid, self.cores)
        limit = 20 + 10 * (self.workers - 1)
        deadline = time.monotonic() + limit
        delay = 0.05
        seen: set[bytes] = set()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"the {self.library} server exited at start: {self.stderr_tail()}")
            try:
                # Ready once every worker has answered (new connection each time: any worker may accept it).
                seen.add(self.get("/__bench__/pid"))
                if len(seen) >= self.workers:
                    self.pids = seen
                    return
                time.sleep(0.02)
            except OSError:
                # uvicorn's supervisor outlives a worker that failed to build the app: stop waiting.
                if not seen and self.workers > 1 and "Traceback" in self.output():
                    raise ServerStartError(f"the {self.library} workers failed at start: {self.error_line()}") from None
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
        what = "did not answer" if not seen else f"had {len(seen)} of {self.workers} workers answering"
        raise ServerStartError(f"the {self.library} server {what} within {limit} s: {self.stderr_tail()}")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            body: bytes = resp.read()
            return body

    def stats(self, timeout: float = 10.0) -> ServerStats | None:
        """Every worker's ``/__bench__/stats``, summed (None when some worker did not answer in
        ``timeout`` s). Each request is a new connection, so with several workers it is sent until
        every worker has answered once, as at start."""
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(found) < max(1, len(self.pids)) and time.monotonic() < deadline:
            try:
                data = json.loads(self.get("/__bench__/stats"))
            except (OSError, ValueError):
                time.sleep(0.2)
                continue
            found.setdefault(int(data["pid"]), data)
        if len(found) < max(1, len(self.pids)):
            return None
        counts = [d["admitted"] for d in found.values()]
        admitted = None if any(c is None for c in counts) else sum(int(c) for c in counts)
        without: dict[str, int] | None = None
        for d in found.values():
            if d.get("without_store") is not None:
                without = without or {}
                for reason, n in d["without_store"].items():
                    without[reason] = without.get(reason, 0) + int(n)
        return ServerStats(admitted, without)

    def settled_stats(self, settle: float = 0.3, timeout: float = 10.0) -> ServerStats | None:
        """:meth:`stats` once the handler count has stopped moving for ``settle`` s (a flooded
        server still answers the requests it accepted after the load generator has stopped)."""
        deadline = time.monotonic() + timeout
        last = self.stats(timeout)
        while last is not None and time.monotonic() < deadline:
            time.sleep(settle)
            now = self.stats(timeout)
            if now is None or now.admitted == last.admitted:
                return now
            last = now
        return last

    def reset(self, attempts: int = 3) -> None:
        """Clear the limiter between iterations; retried because a server still draining the backlog
        of a 500-1000 connection run can fail its store call once."""
        for attempt in range(attempts):
            try:
                self.get("/__bench__/reset")
                return
            except OSError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)

    def output(self) -> str:
        """Everything the server has written to stderr so far."""
        self._log.seek(0)
        return str(self._log.read().decode(errors="replace").strip())

    def stderr_tail(self) -> str:
        return self.output()[-1500:] or "(no output)"

    def error_line(self) -> str:
        """The last exception line the server printed (the whole tail when there is none)."""
        tail = self.stderr_tail()
        lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", ln)]
        return errors[-1] if errors else tail

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(8)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # its own session: workers included
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._log.close()


_LUA = """
-- generated by ratewarden bench
local many = {many}
local client = "{client}"
c2xx, c429, cother = 0, 0, 0
threads = {{}}
setup = function(thread) table.insert(threads, thread) end
init = function(args)
  if client ~= "" then wrk.headers["X-Client-ID"] = client end
end
if many > 0 then
  local n = 0
  request = function()
    n = n + 1
    return wrk.format(nil, nil, {{["X-Client-ID"] = "user-" .. math.random(many)}})
  end
end
response = function(status, headers, body)
  if status >= 200 and status < 300 then c2xx = c2xx + 1
  elseif status == 429 then c429 = c429 + 1
  else cother = cother + 1 end
end
done = function(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("c2xx"); b = b + t:get("c429"); c = c + t:get("cother")
  end
  local e = summary.errors
  io.write(string.format(
    'RWJSON {{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,' ..
    '"mean":%f,"p50":%d,"p95":%d,"p99":%d,"p999":%d,"max":%d,"c2xx":%d,"c429":%d,"cother":%d}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(95), latency:percentile(99),
    latency:percentile(99.9), latency.max, a, b, c))
end
"""


def wrk_script(sc: Scenario, hot_key: str = "hot-key-user") -> str:
    """The wrk Lua script for ``sc``: identity header (one hot key or 10k random keys) and status counting."""
    many = MANY_KEYS if sc.identity == "many" else 0
    client = hot_key if sc.identity == "header" else ""
    return _LUA.format(many=many, client=client)


def _run_wrk(url: str, sc: Scenario, duration: float, concurrency: int, cores: set[int] | None,
             hot_key: str) -> dict[str, float]:
    wrk = require_wrk()
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(wrk_script(sc, hot_key))
        script = f.name
    threads = max(1, min(len(cores) if cores else 1, concurrency))
    cmd = [wrk, f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
           "-s", script, url + sc.path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    finally:
        Path(script).unlink(missing_ok=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RWJSON "):
            data: dict[str, float] = json.loads(line[7:])
            return data
    raise LiveError(f"wrk failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-500:]}")


def _tree(pid: int) -> list[Any]:
    """The server process and its workers (uvicorn's supervisor spawns them)."""
    import psutil  # type: ignore[import-untyped, unused-ignore]

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _cpu_seconds(procs: list[Any]) -> dict[int, float]:
    import psutil  # type: ignore[import-untyped, unused-ignore]

    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = t.user + t.system
    return out


def count_admitted(run: Run, before: ServerStats | None, after: ServerStats | None) -> None:
    """Set ``run.admitted`` and ``run.without_store`` from the server's counts around the run
    (left as they are when the server could not say)."""
    if before is None or after is None:
        return
    if before.admitted is not None and after.admitted is not None:
        run.admitted = after.admitted - before.admitted
    if after.without_store is not None:
        b = before.without_store or {}
        run.without_store = {k: v - b.get(k, 0) for k, v in after.without_store.items() if v - b.get(k, 0)}


def run_iteration(server: LiveServer, sc: Scenario, duration: float, concurrency: int,
                  client_cores: set[int] | None, hot_key: str = "hot-key-user") -> Run:
    """One wrk run against a started server, sampling the server's CPU and RSS meanwhile (summed over
    its worker processes). ``hot_key`` is the identity a one-hot-key scenario sends."""
    import psutil  # type: ignore[import-untyped, unused-ignore]

    assert server.proc is not None
    procs = _tree(server.proc.pid)
    rss: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    continue
            rss.append(total)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    cpu0 = _cpu_seconds(procs)
    t0 = time.perf_counter()
    sampler.start()
    try:
        data = _run_wrk(server.url, sc, duration, concurrency, client_cores, hot_key)
    finally:
        stop.set()
        sampler.join()
    wall = time.perf_counter() - t0
    cpu1 = _cpu_seconds(procs)
    cpu_pct = 100.0 * sum(cpu1[pid] - cpu0[pid] for pid in cpu1 if pid in cpu0) / wall
    status = {"2xx": int(data["c2xx"]), "429": int(data["c429"])}
    if data["cother"]:
        status["other"] = int(data["cother"])
    errors = int(data["connect"] + data["read"] + data["write"] + data["timeout"])
    us = 1000.0
    return Run(
        requests=int(data["requests"]),
        duration_s=data["duration_us"] / 1e6,
        status=status,
        latency_ms={"mean": data["mean"] / us, "p50": data["p50"] / us, "p95": data["p95"] / us,
                    "p99": data["p99"] / us, "p999": data["p999"] / us, "max": data["max"] / us},
        errors=errors,
        cpu_pct=cpu_pct,
        rss_mb=max(rss) / 2**20 if rss else None,
    )
