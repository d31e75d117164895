"""HAProxy's SPOE agent: the Python agent (``--spoe-front python``) against the compiled front door
(``--spoe-front compiled``), in interleaved rounds, spoken to by a raw SPOP client as HAProxy speaks
(a few persistent connections, NOTIFY frames pipelined).

For each variant in turn: ``--connections`` connections, each keeping ``--depth`` NOTIFY frames of
one allowed check in flight, for ``--seconds`` after a 1 s warm-up: checks per second, the mean time
from a batch's send to its last ACK, and the CPU the service's process spent per check
(utime+stime from ``/proc/<pid>/stat``, all threads). The client runs in this process.

    .venv/bin/python scripts/bench_front_spoe.py --rounds 5 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_front_http import POLICY  # the same policy (run as a script: its folder is on sys.path)

from ratewarden.bench.gateway_peers import cpu_seconds
from ratewarden.bench.gateway_procs import wait_port
from ratewarden.bench.services import free_port
from ratewarden.serve.spop import NOTIFY, encode_varint


def _string(raw: bytes) -> bytes:
    return encode_varint(len(raw)) + raw


def _frame(kind: int, payload: bytes, stream: int = 0, frame_id: int = 0) -> bytes:
    body = struct.pack(">BI", kind, 1) + encode_varint(stream) + encode_varint(frame_id) + payload
    return struct.pack(">I", len(body)) + body


HELLO = _frame(1, _string(b"supported-versions") + b"\x08" + _string(b"2.0") + _string(b"max-frame-size")
               + b"\x03" + encode_varint(16380) + _string(b"capabilities") + b"\x08" + _string(b"pipelining"))
_HEADERS = _string(b"host") + _string(b"example.com") + _string(b"x-api-key") + _string(b"bench-key") + b"\x00\x00"
_ARGS = (_string(b"method") + b"\x08" + _string(b"GET") + _string(b"uri") + b"\x08" + _string(b"/api/items")
         + _string(b"headers") + b"\x09" + _string(_HEADERS) + _string(b"ip") + b"\x06" + bytes((203, 0, 113, 9)))
NOTIFY_PAYLOAD = _string(b"check") + b"\x04" + _ARGS


def _start(variant: str, port: int, policy: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(policy), "--http", f"127.0.0.1:{free_port()}",
            "--spoe", f"127.0.0.1:{port}", "--spoe-front", variant, "--no-metrics", "--watch", "0",
            "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    wait_port(port, 60.0)
    return proc


async def _read(reader: asyncio.StreamReader) -> bytes:
    length = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(length)


async def _connection(port: int, depth: int, until: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HELLO)
    assert (await _read(reader))[0] == 101
    frames = [_frame(NOTIFY, NOTIFY_PAYLOAD, 1, i) for i in range(depth)]
    batch = b"".join(frames)
    done = 0
    while time.monotonic() < until:
        started = time.perf_counter()
        writer.write(batch)
        for _ in range(depth):
            answer = await _read(reader)
            if answer[0] != 103:
                raise SystemExit(f"the agent answered frame type {answer[0]}")
        latencies.append(time.perf_counter() - started)
        done += depth
    writer.close()
    return done


async def _load(port: int, connections: int, depth: int, seconds: float) -> tuple[int, float]:
    latencies: list[float] = []
    until = time.monotonic() + seconds
    counts = await asyncio.gather(*(_connection(port, depth, until, latencies) for _ in range(connections)))
    return sum(counts), statistics.mean(latencies) * 1000 if latencies else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--depth", type=int, default=8, help="NOTIFY frames in flight per connection")
    parser.add_argument("--variants", default="python,compiled")
    args = parser.parse_args()
    variants = args.variants.split(",")
    policy = Path(tempfile.mkdtemp()) / "policy.toml"
    policy.write_text(POLICY)
    results: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants[round_ % len(variants):] + variants[:round_ % len(variants)]:
            port = free_port()
            proc = _start(variant, port, policy)
            try:
                asyncio.run(_load(port, args.connections, args.depth, 1.0))
                before = cpu_seconds([proc.pid])
                checks, batch_ms = asyncio.run(_load(port, args.connections, args.depth, args.seconds))
                cpu = cpu_seconds([proc.pid]) - before
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            rps, us = checks / args.seconds, cpu / max(checks, 1) * 1e6
            results[variant].append((rps, us, batch_ms))
            print(f"round {round_ + 1} {variant:9} {rps:8.0f} checks/s {us:6.1f} µs CPU/check "
                  f"{batch_ms:6.2f} ms per batch of {args.depth}", flush=True)
    if "python" in results and "compiled" in results:
        pairs = list(zip(results["compiled"], results["python"], strict=True))
        for index, name in ((0, "checks/s"), (1, "CPU per check"), (2, "time per batch")):
            ratios = [c[index] / p[index] for c, p in pairs]
            print(f"compiled / python, {name}: median {statistics.median(ratios):.2f}x, "
                  f"min {min(ratios):.2f}x, max {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
