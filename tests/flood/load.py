"""Flood one uvicorn worker over real HTTP: the app in a subprocess, the load from ``wrk`` (or, where
wrk is missing, an asyncio raw-socket client in its own process), the admitted count read from the
app (``GET /__count``: its handlers' own count, the authoritative figure).

``python -m tests.flood.load URL -c 1000 -d 3`` runs the asyncio client alone and prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratewarden.bench.services import free_port

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
FD_LIMIT = 65536

# Per-status counts in each wrk thread, summed and printed by done() (``thread:get`` copies tables).
_WRK_LUA = """
statuses = {}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for s, n in pairs(t:get("statuses")) do total[s] = (total[s] or 0) + n end
  end
  for s, n in pairs(total) do io.write(string.format("status %d %d\\n", s, n)) end
end
"""


def raise_fd_limit(wanted: int = FD_LIMIT) -> int:
    """Raise this process's soft open-file limit towards ``wanted`` (children inherit it); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)


def clear_of_window_edge(period: float, needed: float) -> float:
    """Sleep, if need be, so the next ``needed`` seconds stay inside one fixed window of ``period``
    seconds (a flood across a window edge may rightly admit twice the limit); the seconds slept."""
    into = time.time() % period
    if period - into >= needed:
        return 0.0
    wait = period - into + 0.05
    time.sleep(wait)
    return wait


@dataclass
class LoadResult:
    """What the client saw: responses by status, errors by kind, its own duration."""

    tool: str
    connections: int
    seconds: float
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def responses(self) -> int:
        return sum(self.statuses.values())

    @property
    def rate(self) -> float:
        """Responses per second."""
        return self.responses / self.seconds if self.seconds else 0.0


def run_wrk(url: str, connections: int, duration: float, threads: int = 2, timeout: float = 10.0) -> LoadResult:
    """``wrk -t threads -c connections -d duration url``, statuses counted by a Lua script."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed: run scripts/install-system-deps.sh")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_LUA)
    try:
        argv = [wrk, "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s",
                "--timeout", f"{timeout:g}s", "-s", script.name, url]
        started = time.monotonic()
        out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + timeout + 30,
                             preexec_fn=raise_fd_limit)
        seconds = time.monotonic() - started
    finally:
        os.unlink(script.name)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    statuses = {int(s): int(n) for s, n in re.findall(r"^status (\d+) (\d+)$", out.stdout, re.M)}
    errors: dict[str, int] = {}
    found = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out.stdout)
    if found:
        errors = {k: int(v) for k, v in zip(("connect", "read", "write", "timeout"), found.groups(), strict=True) if int(v)}
    took = re.search(r"requests in ([\d.]+)(ms|s|m)", out.stdout)
    if took:
        seconds = float(took.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[took.group(2)]
    return LoadResult("wrk", connections, seconds, statuses, errors)


async def _asyncio_load(host: str, port: int, target: str, connections: int, duration: float) -> LoadResult:
    """``connections`` keep-alive HTTP/1.1 connections sending ``GET target`` back to back."""
    request = f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    stop = time.monotonic() + duration

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            errors["connect"] += 1
            return
        try:
            while time.monotonic() < stop:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if length is None:
                    errors["no content-length"] += 1
                    return
                await reader.readexactly(int(length.group(1)))
                statuses[status] += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            errors["read"] += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(connections)))
    return LoadResult("asyncio", connections, time.monotonic() - started, dict(statuses), dict(errors))


def run_asyncio(url: str, connections: int, duration: float) -> LoadResult:
    """The asyncio client in a child process (not on this process's event loop or GIL)."""
    argv = [sys.executable, "-m", "tests.flood.load", url, "-c", str(connections), "-d", f"{duration:g}"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=duration + 60,
                         preexec_fn=raise_fd_limit)
    if out.returncode != 0:
        raise RuntimeError(f"the asyncio load failed: {out.stderr}")
    data = json.loads(out.stdout)
    return LoadResult("asyncio", connections, data["seconds"], {int(k): v for k, v in data["statuses"].items()},
                      data["errors"])


def run_load(url: str, connections: int, duration: float, tool: str = "auto") -> LoadResult:
    """Flood ``url``: ``wrk`` when installed (``tool="auto"``), else the asyncio client."""
    if tool == "wrk" or (tool == "auto" and shutil.which("wrk")):
        return run_wrk(url, connections, duration)
    return run_asyncio(url, connections, duration)


def get_json(port: int, target: str, timeout: float = 10.0) -> Any:
    """``GET target`` on the app, decoded."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {target}: {response.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        conn.close()


class AppServer:
    """``uvicorn tests.flood.app:create_app --factory``, one worker, on a free loopback port."""

    def __init__(self, store: str, path: str, rate: str = "100/hour", prefix: str = "flood") -> None:
        self.env = {**os.environ, "FLOOD_STORE": store, "FLOOD_PATH": path, "FLOOD_RATE": rate,
                    "FLOOD_PREFIX": prefix}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())

    def url(self, target: str = "/a") -> str:
        return f"http://{HOST}:{self.port}{target}"

    def start(self, timeout: float = 30.0) -> AppServer:
        argv = [sys.executable, "-m", "uvicorn", "tests.flood.app:create_app", "--factory", "--host", HOST,
                "--port", str(self.port), "--workers", "1", "--log-level", "warning", "--no-access-log",
                "--backlog", "4096"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=raise_fd_limit)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited ({self.proc.returncode}):\n{self.log()}")
            try:
                self.counts()
                return self
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the app did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def counts(self) -> dict[str, Any]:
        """The app's ``/__count``: admitted per route, statuses, ``without_store`` when exposed."""
        found: dict[str, Any] = get_json(self.port, "/__count")
        return found

    def log(self) -> str:
        """What the app printed (its last 4,000 characters)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self._log.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Flood:
    """One flood of one route: what the client saw and what the app counted."""

    load: LoadResult
    before: dict[str, Any]
    after: dict[str, Any]
    target: str = "/a"

    @property
    def admitted(self) -> int:
        """Handler runs during the flood (server-side, exact)."""
        return int(self.after["admitted"][self.target]) - int(self.before["admitted"][self.target])

    @property
    def statuses(self) -> dict[int, int]:
        """Statuses the app answered during the flood (server-side)."""
        before, after = self.before["statuses"], self.after["statuses"]
        return {int(k): v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}

    @property
    def without_store(self) -> dict[str, int] | None:
        """Checks decided without the store during the flood, by reason (``None``: not exposed)."""
        after = self.after.get("without_store")
        if after is None:
            return None
        before = self.before.get("without_store") or {}
        return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def flood(app: AppServer, connections: int, duration: float, target: str = "/a", tool: str = "auto",
          during: Callable[[], None] | None = None) -> Flood:
    """Flood ``target`` of a started app; ``during`` runs in a thread alongside (e.g. a store outage)
    and is waited for before the counts are read."""
    before = app.counts()
    worker = threading.Thread(target=during, daemon=True) if during is not None else None
    if worker is not None:
        worker.start()
    try:
        load = run_load(app.url(target), connections, duration, tool)
    finally:
        if worker is not None:
            worker.join()
    time.sleep(0.2)  # responses still in flight when the client stopped
    return Flood(load, before, app.counts(), target)


@contextlib.contextmanager
def app_server(store: str, path: str, rate: str = "100/hour", prefix: str = "flood") -> Iterator[AppServer]:
    """A started ``AppServer``, closed at the end."""
    with AppServer(store, path, rate, prefix) as app:
        yield app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.flood.load", description="the asyncio flood client alone")
    parser.add_argument("url")
    parser.add_argument("-c", "--connections", type=int, default=1000)
    parser.add_argument("-d", "--duration", type=float, default=3.0)
    args = parser.parse_args(argv)
    raise_fd_limit()
    found = re.fullmatch(r"http://([^/:]+):(\d+)(/.*)?", args.url)
    if found is None:
        parser.error(f"expected http://host:port/path, got {args.url!r}")
    host, port, target = found.group(1), int(found.group(2)), found.group(3) or "/"
    result = asyncio.run(_asyncio_load(host, port, target, args.connections, args.duration))
    print(json.dumps({"seconds": result.seconds, "statuses": result.statuses, "errors": result.errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
