"""Live cost of each rate-limit header style under uvicorn + wrk (one worker, loopback).

Each variant is one FastAPI app served by its own uvicorn process (uvloop, httptools); wrk runs
``--duration`` seconds against it, variants interleaved over ``--rounds`` rounds (each round starting
one variant further on); the median req/s of each is printed with its ratio to the matching floor
(and the median of the ratios paired within each round, steadier when the machine drifts during the
run): a pure ASGI layer adding the same fixed headers, byte for byte (for allowed traffic), or bare
FastAPI (headers off, limited traffic).

Beside req/s, the server's own CPU time per request (utime + stime from /proc, over the measured
run) gives the capacity ratio ``floor CPU / variant CPU``: what one worker could serve on a CPU of
its own. On a shared machine whose throughput swings between rounds, it is the steadier figure.

    build/venv-wheel/bin/python scripts/bench_headers_live.py --duration 3 --rounds 3

(the compiled wheel ``make bench`` installs; a ``setup.py build --build-lib DIR`` tree on ``PYTHONPATH`` works too)

``--instructions N`` counts instead of timing: each server runs under valgrind's callgrind, is warmed
up, then serves ``N`` requests over one keep-alive connection with the counters zeroed just before and
dumped just after; the instructions per request it prints do not move with the machine's load, so
variants a few per cent apart can be told apart on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

ALLOW = 10**9
FIXED = [
    (b"ratelimit-policy", b'"/test";q=1000000000;w=60'), (b"ratelimit", b'"/test";r=999999999;t=60'),
    (b"x-ratelimit-limit", b"1000000000"), (b"x-ratelimit-remaining", b"999999999"), (b"x-ratelimit-reset", b"60"),
]
# The edge names a dependency's limit after its route ("GET-/test"): its floor adds those bytes.
FIXED_EDGE = [(name, value.replace(b'"/test"', b'"GET-/test"')) for name, value in FIXED]
VARIANTS = [
    "bare", "pass-through layer", "floor 5 headers", "floor 2 headers", "floor 3 headers", "floor edge headers",
    "middleware both", "middleware ietf", "middleware legacy", "middleware off", "middleware off nolock",
    "dependency+edge both", "middleware 429", "dependency+edge 429",
]
FLOORS = {
    "middleware both": "floor 5 headers", "middleware ietf": "floor 2 headers",
    "middleware legacy": "floor 3 headers", "middleware off": "bare", "middleware off nolock": "bare",
    "pass-through layer": "bare",
    "dependency+edge both": "floor edge headers", "middleware 429": "bare", "dependency+edge 429": "bare",
}


def build(variant: str) -> Any:
    from fastapi import Depends, FastAPI

    from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
    from ratewarden.fastapi import RateLimit, install

    app = FastAPI()
    limit = 1 if variant.endswith("429") else ALLOW
    deps = []
    if variant.startswith("dependency"):
        deps = [Depends(RateLimit(f"{limit}/min", limiter=Limiter(MemoryStore())))]

    @app.get("/test", dependencies=deps)
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    if variant.startswith("dependency"):
        install(app)
    elif variant.startswith("middleware"):
        style = variant.split()[1]
        options: dict[str, Any] = {"headers": "off"} if style == "off" else {}
        if style in ("ietf", "legacy", "both"):
            options["header_style"] = style
        store = MemoryStore()
        if variant.endswith("nolock"):  # what the store's lock costs: a no-op in its place (one thread only)
            store._acquire = store._release = tuple
        app.add_middleware(RateLimitMiddleware, limiter=Limiter(store), rules=[Rule("/test", f"{limit}/min")],
                           **options)
    elif variant == "pass-through layer":  # what any pure ASGI layer costs: one more hop, nothing done

        class PassThrough:
            def __init__(self, inner: Any) -> None:
                self.app = inner

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                await self.app(scope, receive, send)

        app.add_middleware(PassThrough)
    elif variant.startswith("floor"):
        size = variant.split()[1]
        fixed = FIXED_EDGE if size == "edge" else FIXED[:int(size)] if size != "3" else FIXED[2:]

        class FloorHeaders:
            def __init__(self, inner: Any) -> None:
                self.app = inner

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                async def send_with_headers(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        message["headers"] = [*message.get("headers", ()), *fixed]
                    await send(message)

                await self.app(scope, receive, send_with_headers)

        app.add_middleware(FloorHeaders)
    return app


def serve(variant: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build(variant), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, workers=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get_all(sock: socket.socket, count: int) -> None:
    """Send ``count`` GET /test requests one after another on ``sock``, reading each whole answer."""
    request = b"GET /test HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    buffer = b""
    for _ in range(count):
        sock.sendall(request)
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(buffer) < length:
            buffer += sock.recv(65536)
        buffer = buffer[length:]


def count_instructions(variant: str, requests: int) -> float:
    """Instructions the server runs per request of ``variant`` (callgrind, after a warm-up)."""
    import tempfile

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
        extra = os.environ.get("CALLGRIND_ARGS", "").split()  # e.g. --cache-sim=yes
        server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no", *extra,
                                   sys.executable, __file__, "--serve", variant, "--port", str(port)],
                                  stderr=subprocess.DEVNULL, env=env)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            with sock:
                _get_all(sock, 300)
                subprocess.run(["callgrind_control", "--zero", str(server.pid)], capture_output=True, check=True)
                _get_all(sock, requests)
                subprocess.run(["callgrind_control", "--dump=measured", str(server.pid)], capture_output=True,
                               check=True)
        finally:
            server.terminate()
            server.wait(60)
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                text = f.read()
            if "measured" in text.split("\nevents:", 1)[0]:
                if os.environ.get("CALLGRIND_KEEP"):  # for callgrind_annotate
                    with open(f"{os.environ['CALLGRIND_KEEP']}-{variant.replace(' ', '_')}", "w") as f:
                        f.write(text)
                found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                assert found, name
                return int(found.group(1)) / requests
    raise RuntimeError("callgrind wrote no dump for the measured requests")


def measure(variant: str, duration: float, connections: int) -> tuple[float, float]:
    """(req/s, server CPU µs per request) of one run against ``variant``."""
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", variant, "--port", str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/test"
        subprocess.run(["wrk", "-t1", f"-c{connections}", "-d1s", url], capture_output=True, check=True)  # warm-up
        cpu = cpu_seconds(server.pid)
        out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", url],
                             capture_output=True, text=True, check=True).stdout
        cpu = cpu_seconds(server.pid) - cpu
        found = re.search(r"Requests/sec:\s+([\d.]+)", out)
        served = re.search(r"(\d+) requests in", out)
        assert found and served, out
        return float(found.group(1)), cpu / int(served.group(1)) * 1e6
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="count the server's instructions per request over N requests (callgrind) instead")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    names = args.variants.split(",")
    if args.instructions:
        counts = {name: count_instructions(name, args.instructions) for name in names}
        print(f"{'variant':24s} {'instr/request':>14s} {'vs floor':>9s} {'extra':>8s}  floor")
        for name in names:
            floor = FLOORS.get(name)
            ratio = f"{counts[floor] / counts[name]:9.3f}" if floor in counts else f"{'':9s}"
            extra = f"{counts[name] - counts[floor]:8,.0f}" if floor in counts else f"{'':8s}"
            print(f"{name:24s} {counts[name]:14,.0f} {ratio} {extra}  {floor or ''}")
        return
    samples: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(args.rounds):
        # Each round starts one variant further on, so no variant always runs first or after the same one.
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            rate, per_request = measure(name, args.duration, args.connections)
            samples[name].append(rate)
            cpu[name].append(per_request)
    # Ratios paired within a round (variants seconds apart) move less with the machine's drift than
    # a ratio of medians taken over the whole run.
    paired = {name: statistics.median(v / f for v, f in zip(samples[name], samples[FLOORS[name]], strict=True))
              for name in names if FLOORS.get(name) in samples}
    paired_cpu = {name: statistics.median(f / v for v, f in zip(cpu[name], cpu[FLOORS[name]], strict=True))
                  for name in names if FLOORS.get(name) in cpu}
    median = {name: statistics.median(values) for name, values in samples.items()}
    cpu_median = {name: statistics.median(values) for name, values in cpu.items()}
    cpu_min = {name: min(values) for name, values in cpu.items()}
    print(f"{'variant':24s} {'req/s (median)':>15s} {'vs floor':>9s} {'paired':>7s} {'CPU µs/req':>11s}"
          f" {'capacity':>9s} {'paired':>7s} {'(of mins)':>9s}  floor / all rounds")
    blank = ""
    for name in names:
        floor = FLOORS.get(name, "")
        has_floor = floor in median
        ratio = f"{median[name] / median[floor]:9.3f}" if has_floor else f"{blank:9s}"
        pair = f"{paired[name]:7.3f}" if has_floor else f"{blank:7s}"
        capacity = f"{cpu_median[floor] / cpu_median[name]:9.3f}" if has_floor else f"{blank:9s}"
        pair_cpu = f"{paired_cpu[name]:7.3f}" if has_floor else f"{blank:7s}"
        of_mins = f"{cpu_min[floor] / cpu_min[name]:9.3f}" if has_floor else f"{blank:9s}"
        rounds = ", ".join(f"{v:,.0f}" for v in samples[name])
        print(f"{name:24s} {median[name]:15,.0f} {ratio} {pair} {cpu_median[name]:11.1f} {capacity} {pair_cpu}"
              f" {of_mins}  {floor} / {rounds}")

if __name__ == "__main__":
    main()
