"""HTTP ``/check`` through the compiled front door against uvicorn, each beside its own fixed-answer
floor (the same server answering every request with a fixed 200 and an allowed check's rate-limit
headers, ``bench.gateway_floor.headers_floor_app``), in interleaved rounds.

For each variant in turn: wrk (``-t1 -c50``) for ``--seconds`` after a 1 s warm-up, req/s, and the
CPU the service's process spent per request (utime+stime from ``/proc/<pid>/stat``, all threads).

    .venv/bin/python scripts/bench_front_http.py --rounds 3 --seconds 5

Variants: ``python`` (``ratewarden serve``, uvicorn), ``compiled`` (``--http-front compiled``),
``python-floor`` (``bench.gateway_floor --http --headers``), ``compiled-floor`` (this script's
``--floor-compiled``: the fixed answer through ``serve.front_http``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from ratewarden.bench.gateway_peers import cpu_seconds
from ratewarden.bench.gateway_procs import wait_port
from ratewarden.bench.services import free_port

POLICY = """
version = 1

[identity]
sources = ["header:X-API-Key"]
unknown_group = "basic"
anonymous_group = "basic"

[groups.basic]
limits = "1000000000/hour"

[[rules]]
name = "api"
path = "/api/**"
tiered = true
"""


def _floor_compiled(port: int) -> None:
    """Serve the fixed answer through the compiled front door until SIGTERM."""
    from ratewarden.bench.gateway_floor import headers_floor_app
    from ratewarden.serve.front_http import start_http_front

    async def serve() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        server = start_http_front(headers_floor_app, sock)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
        await server.serve()

    asyncio.run(serve())


def _start(variant: str, port: int, policy: Path) -> subprocess.Popen[bytes]:
    python = sys.executable
    argv = {
        "python": [python, "-m", "ratewarden.cli", "serve", str(policy), "--http", f"127.0.0.1:{port}",
                   "--no-metrics", "--watch", "0", "--log-level", "warning", "--http-front", "python"],
        "compiled": [python, "-m", "ratewarden.cli", "serve", str(policy), "--http", f"127.0.0.1:{port}",
                     "--no-metrics", "--watch", "0", "--log-level", "warning", "--http-front", "compiled"],
        "python-floor": [python, "-m", "ratewarden.bench.gateway_floor", "--http", str(port), "--headers"],
        "compiled-floor": [python, __file__, "--floor-compiled", str(port)],
    }[variant]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    wait_port(port, 60.0)
    return proc


def _wrk(port: int, seconds: int) -> float:
    url = f"http://127.0.0.1:{port}/check"
    out = subprocess.run(["wrk", "-t1", "-c50", f"-d{seconds}s", "-H", "X-Original-URI: /api/items", url],
                         capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise SystemExit(f"wrk saw {bad.group(1)} refusals:\n{out}")
    return float(found.group(1)) if found else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--variants", default="python,python-floor,compiled,compiled-floor")
    parser.add_argument("--floor-compiled", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_compiled:
        _floor_compiled(args.floor_compiled)
        return 0
    variants = args.variants.split(",")
    policy = Path(tempfile.mkdtemp()) / "policy.toml"
    policy.write_text(POLICY)
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            port = free_port()
            proc = _start(variant, port, policy)
            try:
                _wrk(port, 1)
                before = cpu_seconds([proc.pid])
                requests = _wrk(port, args.seconds)
                cpu = cpu_seconds([proc.pid]) - before
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            rps, us = requests / args.seconds, cpu / max(requests, 1) * 1e6
            results[variant].append((rps, us))
            print(f"round {round_ + 1} {variant:15} {rps:8.0f} req/s {us:6.1f} µs CPU/request", flush=True)
    print("\nratios within each round (ours / its own floor): req/s, CPU per request")
    for ours, floor in (("python", "python-floor"), ("compiled", "compiled-floor"), ("compiled", "python")):
        if ours in results and floor in results:
            pairs = list(zip(results[ours], results[floor], strict=True))
            rps = [o[0] / f[0] for o, f in pairs]
            cpu = [o[1] / f[1] for o, f in pairs]
            print(f"{ours} / {floor}: req/s {min(rps):.2f}-{max(rps):.2f}x, CPU {min(cpu):.2f}-{max(cpu):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
