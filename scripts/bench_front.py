"""Side-by-side gRPC ShouldRateLimit bench of the compiled front door prototype (rust/), the Python
grpc ``ratewarden serve`` and envoyproxy/ratelimit, with ghz: req/s, p50/p99, process CPU per
decision, Redis CPU per decision, and admitted against a 50/minute limit under 200 concurrent calls.

    python scripts/bench_front.py --lib rust/target/release --variants python,front,reference \\
        --stores memory,redis -n 20000 --rounds 2

Needs ghz and (for the reference) service_cmd in ~/go/bin (rust/README.md), redis-server on PATH.
Variants run interleaved, round by round, so a busy machine slows each alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOBIN = Path(os.environ.get("GOBIN", Path.home() / "go" / "bin"))
CALL = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CONFIG = """\
domain: bench
descriptors:
  - key: generic_key
    value: over
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: generic_key
    value: under
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: generic_key
    value: exact
    rate_limit: {unit: minute, requests_per_unit: 50}
"""
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User+system CPU of ``pid`` and its descendants, in seconds."""
    total = 0.0
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
        todo.extend(children.get(current, []))
    return total


def protoset(path: Path) -> None:
    from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

    fds = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(fd: Any) -> None:
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            add(dep)
        seen.add(fd.name)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        fds.file.append(proto)

    add(rls_pb2.DESCRIPTOR)
    path.write_bytes(fds.SerializeToString())


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"port {port} not listening after {timeout} s")


def start(
    variant: str, store: str, redis_port: int, work: Path, lib: str, workers: int = 1
) -> tuple[list[subprocess.Popen[bytes]], int]:
    port = free_port()
    python = sys.executable
    log = open(work / f"{variant}-{store}.log", "ab")  # noqa: SIM115 (the server keeps it)
    store_url = "memory://" if store == "memory" else f"redis://127.0.0.1:{redis_port}/0"
    if variant == "python":
        cmd = [python, "-c", "import sys; from ratewarden.cli import main; sys.argv[0] = 'ratewarden'; sys.exit(main())", "serve", "--grpc", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{free_port()}",
               "--store", store_url, "--workers", str(workers), "--no-metrics", "--log-level", "error", "--watch", "0", str(work / "config" / "bench.yaml")]
        env = dict(os.environ)
    elif variant == "front":
        cmd = [python, str(ROOT / "scripts" / "front_prototype.py"), "--grpc", f"127.0.0.1:{port}", "--store", store_url,
               "--lib", lib, str(work / "config" / "bench.yaml")] + (["--reuse-port"] if workers > 1 else [])
        env = dict(os.environ)
    else:
        cmd = [str(GOBIN / "service_cmd")]
        env = dict(os.environ, USE_STATSD="false", DISABLE_STATS="true", REDIS_SOCKET_TYPE="tcp",
                   REDIS_URL=f"127.0.0.1:{redis_port}", RUNTIME_ROOT=str(work / "runtime"), RUNTIME_SUBDIRECTORY="ratelimit",
                   RUNTIME_WATCH_ROOT="false", GRPC_HOST="127.0.0.1", GRPC_PORT=str(port), HOST="127.0.0.1",
                   PORT=str(free_port()), DEBUG_HOST="127.0.0.1", DEBUG_PORT=str(free_port()), LOG_LEVEL="warn")
    procs = [subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=work)]
    wait_port(port, procs[0])
    for _ in range(1, workers if variant == "front" else 1):  # ratewarden serve forks its own workers
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=work))
    time.sleep(2.0 if workers > 1 else 0.5)
    return procs, port


def ghz(port: int, value: str, n: int, protoset_path: Path, connections: int = 1) -> dict[str, Any]:
    data = json.dumps({"domain": "bench", "descriptors": [{"entries": [{"key": "generic_key", "value": value}]}]})
    out = subprocess.run(
        [str(GOBIN / "ghz"), "--insecure", "--protoset", str(protoset_path), "--call", CALL, "-d", data,
         "-c", str(50 * connections), "--connections", str(connections), "-n", str(n), "--format", "json", f"127.0.0.1:{port}"],
        check=True, capture_output=True,
    )
    return dict(json.loads(out.stdout))


async def admitted(port: int, calls: int = 200) -> int:
    import grpc  # type: ignore[import-untyped]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(domain="bench")
        entry = request.descriptors.add().entries.add()
        entry.key, entry.value = "generic_key", "exact"
        answers = await asyncio.gather(*(stub.ShouldRateLimit(request) for _ in range(calls)))
    return sum(1 for a in answers if a.overall_code == rls_pb2.RateLimitResponse.OK)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="python,front,reference")
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--scenarios", default="over,under")
    parser.add_argument("-n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="processes (front: SO_REUSEPORT; reference: always 1)")
    parser.add_argument("--connections", type=int, default=1, help="ghz connections, 50 streams each")
    parser.add_argument("--lib", default=str(ROOT / "rust" / "target" / "release"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-front-"))
    (work / "config").mkdir()
    (work / "config" / "bench.yaml").write_text(CONFIG)
    (work / "runtime" / "ratelimit" / "config").mkdir(parents=True)
    (work / "runtime" / "ratelimit" / "config" / "bench.yaml").write_text(CONFIG)
    protoset(work / "rls.protoset")
    lib = work / "lib"
    lib.mkdir()
    so = Path(args.lib) / "libratewarden_front.so"
    shutil.copy(so, lib / "ratewarden_front.abi3.so") if so.exists() else None
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    print(f"workers {args.workers}, ghz connections {args.connections} x 50 streams, -n {args.n}, {sys.executable}")
    print("| round | variant | store | scenario | req/s | p50 ms | p99 ms | CPU µs/decision | Redis CPU µs/decision | errors | admitted of 200 vs 50/min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for rnd in range(args.rounds):
            for store in args.stores.split(","):
                for variant in args.variants.split(","):
                    if variant == "reference" and store == "memory":
                        continue
                    subprocess.run(["redis-cli", "-p", str(redis_port), "flushall"], capture_output=True)
                    procs, port = start(variant, store, redis_port, work, str(lib), 1 if variant == "reference" else args.workers)
                    try:
                        got = asyncio.run(admitted(port))
                        for scenario in args.scenarios.split(","):
                            ghz(port, scenario, 500, work / "rls.protoset")  # warm-up
                            before, rbefore = sum(cpu_seconds(p.pid) for p in procs), cpu_seconds(redis.pid)
                            report = ghz(port, scenario, args.n, work / "rls.protoset", args.connections)
                            cpu = sum(cpu_seconds(p.pid) for p in procs) - before
                            rcpu = cpu_seconds(redis.pid) - rbefore
                            count = int(report["count"])
                            lat = {d["percentage"]: d["latency"] / 1e6 for d in report.get("latencyDistribution") or []}
                            errors = {k: v for k, v in (report.get("statusCodeDistribution") or {}).items() if k != "OK"}
                            print(f"| {rnd} | {variant} | {store} | {scenario} | {report['rps']:.0f} | {lat.get(50, 0):.2f} | "
                                  f"{lat.get(99, 0):.2f} | {cpu / count * 1e6:.0f} | {rcpu / count * 1e6:.0f} | "
                                  f"{errors or 0} | {got} |", flush=True)
                    finally:
                        for proc in procs:
                            proc.terminate()
                        for proc in procs:
                            try:
                                proc.wait(10)
                            except subprocess.TimeoutExpired:
                                proc.kill()
    finally:
        redis.terminate()
        redis.wait()
        print(f"logs in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
