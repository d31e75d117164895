"""The gateway bench's clients: the reference set-up's load generator (asyncio, raw HTTP/1.1 keep-alive), wrk for
the HTTP capacity runs, and a gRPC ``ShouldRateLimit`` load loop (run as
``python -m ratewarden.bench.gateway_load grpc --port P --seconds S --concurrency C``, pinned to its
own core by the caller, printing one JSON line).

The load generator: ``workers`` connections (15, as in the reference set-up), each taking the next request of a
fixed plan (API keys round-robin over the groups, PUT with a 1 KiB body and GET alternating, a fresh
object path each), paced to ``rate`` requests/s over all workers (0: as fast as they go) and cut
off after ``max_seconds``. Latency is taken per request from its first byte written to its answer's
last byte read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LoadResult", "Plan", "Sample", "grpc_load", "load", "run_load", "run_wrk"]

_BODY = b"x" * 1024


@dataclass(frozen=True)
class Plan:
    """What one load run sends: ``requests`` requests over ``keys`` (key, group), round-robin."""

    keys: Sequence[tuple[str, str]]
    requests: int
    workers: int = 15
    rate: float = 0.0
    max_seconds: float = 10.0

    def request(self, i: int, host: str) -> tuple[int, bytes]:
        """(key index, raw request bytes) of request ``i``: each key in turn, PUT and GET alternating
        from one pass over the keys to the next."""
        k = i % len(self.keys)
        key = self.keys[k][0]
        if (i // len(self.keys)) % 2 == 0:
            head = (f"PUT /bucket/object-{i} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {key}\r\n"
                    f"Content-Type: application/octet-stream\r\nContent-Length: {len(_BODY)}\r\n\r\n")
            return k, head.encode() + _BODY
        return k, f"GET /bucket/object-{i} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {key}\r\n\r\n".encode()


@dataclass
class Sample:
    key: int
    status: int  # 0: no answer (connection error)
    latency_s: float


@dataclass
class LoadResult:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    unsent: int = 0  # cut off by max_seconds


class _Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def send(self, data: bytes) -> int:
        """Sends ``data`` and reads the whole answer; its status (0 on a connection error)."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(data)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            m = re.search(rb"\r\ncontent-length:\s*(\d+)", lower)
            if m:
                await self.reader.readexactly(int(m.group(1)))
            elif b"\r\ntransfer-encoding: chunked" in lower:
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await self.reader.readexactly(size + 2)
                    if size == 0:
                        break
            elif status not in (204, 304):
                await self.reader.read()  # delimited by the close
                self.close()
            if b"\r\nconnection: close" in lower:
                self.close()
            return status
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.close()
            return 0


async def run_load(port: int, plan: Plan) -> LoadResult:
    """Sends ``plan`` to ``127.0.0.1:port``; every answer's key, status and latency."""
    host = f"127.0.0.1:{port}"
    requests = [plan.request(i, host) for i in range(plan.requests)]
    result = LoadResult()
    conns = [_Conn(port) for _ in range(plan.workers)]
    for conn in conns:  # connected before the clock starts, as the reference set-up's workers are
        await conn.open()
    nxt = 0
    start = time.perf_counter()
    stop_at = start + plan.max_seconds

    async def worker(conn: _Conn) -> None:
        nonlocal nxt
        while nxt < len(requests):
            i = nxt
            nxt += 1
            if plan.rate > 0:
                delay = start + i / plan.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            if time.perf_counter() > stop_at:
                result.unsent += 1
                continue
            key, data = requests[i]
            t0 = time.perf_counter()
            status = await conn.send(data)
            result.samples.append(Sample(key, status, time.perf_counter() - t0))

    await asyncio.gather(*(worker(c) for c in conns))
    result.seconds = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return result


def load(port: int, plan: Plan) -> LoadResult:
    """``run_load`` on a fresh event loop (uvloop when installed)."""
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run_load(port, plan))
    finally:
        loop.close()


# ---------------------------------------------------------------------------------------------- capacity

def run_wrk(wrk: str, url: str, headers: Sequence[str], seconds: float, connections: int,
            cores: set[int] | None) -> tuple[float, int, int]:
    """wrk against ``url`` (keep-alive): (requests/s, requests, non-2xx answers)."""
    argv = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "5s"]
    for h in headers:
        argv += ["-H", h]
    proc = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    rps = re.search(r"Requests/sec:\s*([\d.]+)", proc.stdout)
    total = re.search(r"(\d+) requests in", proc.stdout)
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", proc.stdout)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", proc.stdout)
    if rps is None or total is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-400:]}")
    failed = int(bad.group(1)) if bad else 0
    if errors:
        failed += sum(int(x) for x in errors.groups())
    return float(rps.group(1)), int(total.group(1)), failed


def grpc_load(port: int, seconds: float, concurrency: int, cores: set[int] | None,
              key: str = "capacity-key") -> tuple[float, int, int]:
    """The gRPC load loop in its own process (pinned to ``cores``): (calls/s, calls, non-OK answers)."""
    argv = [sys.executable, "-m", "ratewarden.bench.gateway_load", "grpc", "--port", str(port), "--seconds",
            str(seconds), "--concurrency", str(concurrency), "--key", key]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            return float(data["calls"]) / float(data["seconds"]), int(data["calls"]), int(data["bad"])
    raise RuntimeError(f"gRPC load failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-400:]}")


async def _grpc_loop(port: int, seconds: float, concurrency: int, key: str) -> dict[str, float]:
    import grpc  # type: ignore[import-untyped, unused-ignore]
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped, unused-ignore]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="api_key", value=key)
    request = rls_pb2.RateLimitRequest(domain="bench", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])],
                                       hits_addend=1)
    ok = rls_pb2.RateLimitResponse.Code.OK
    calls = bad = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(50):  # warm: connection and first calls
            await stub.ShouldRateLimit(request)
        start = time.perf_counter()
        stop_at = start + seconds

        async def one() -> None:
            nonlocal calls, bad
            while time.perf_counter() < stop_at:
                try:
                    answer = await stub.ShouldRateLimit(request)
                    bad += answer.overall_code != ok
                except grpc.aio.AioRpcError:
                    bad += 1
                calls += 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"calls": calls, "seconds": elapsed, "bad": bad}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden.bench.gateway_load")
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grpc")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--seconds", type=float, default=2.0)
    g.add_argument("--concurrency", type=int, default=16)
    g.add_argument("--key", default="capacity-key")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_grpc_loop(args.port, args.seconds, args.concurrency, args.key))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
