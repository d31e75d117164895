"""A/B of ``ratewarden serve``'s gRPC door between builds, beside envoyproxy/ratelimit and the floor.

Each build is a virtualenv with ratewarden installed (``scripts/bench-venv.sh``, ``BENCH_TARGET="make
bench-gateway"``). Every round starts each variant once, in rotated order: each build on one private
Redis and on the memory store (the compiled front door, ``--envoy-headers none``: the reference's
answers), the reference on the same Redis, and the floor (the compiled front door answering every
call allowed without asking Python, ``gateway_floor --grpc-front``). Each gets ghz under the limit on
one connection (50 streams): a warm-up, then the measured calls, with the CPU of the service and of
redis-server per decision. Ratios to the reference are taken within a round. ``--envoy-headers
ratewarden`` runs the builds with ratewarden's default answers instead.

    python scripts/bench_grpc_ab.py --rounds 5 build/venv-a build/venv-b

Needs ghz and envoyproxy/ratelimit's ``service_cmd`` in ``~/go/bin`` (``ratewarden bench --gateway``
builds both) and redis-server; run it with a Python that has ratewarden's bench extra.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ratewarden.bench import gateway_procs as gp
from ratewarden.bench.gateway_peer_run import _files, _ghz, _reference_env
from ratewarden.bench.gateway_peers import Tools, cpu_seconds
from ratewarden.bench.services import redis_server


def _argv(variant: str, store: str, port: int, redis_port: int, root: Path, first: str, headers: str) -> list[str]:
    if variant == "floor":
        return [f"{first}/bin/python", "-m", "ratewarden.bench.gateway_floor", "--grpc-front", str(port)]
    where = "memory://" if store == "memory" else f"redis://{gp.HOST}:{redis_port}/0"
    return [f"{variant}/bin/python", "-m", "ratewarden.cli", "serve", str(root / "config" / "bench.yaml"),
            "--grpc", f"{gp.HOST}:{port}", "--http", f"{gp.HOST}:{gp.free_port()}", "--store", where,
            "--workers", "1", "--no-metrics", "--log-level", "error", "--watch", "0", "--envoy-headers", headers]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venvs", nargs="+", help="virtualenvs with ratewarden installed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000, help="measured calls per variant per round")
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--envoy-headers", default="none", help="ratewarden's answers: none (the reference's), ratewarden")
    args = parser.parse_args()
    args.venvs = [str(Path(v).absolute()) for v in args.venvs]
    go = Path.home() / "go" / "bin"
    tools = Tools(ghz=str(go / "ghz"), reference=str(go / "service_cmd"))
    root = Path(tempfile.mkdtemp(prefix="grpc-ab-"))
    _files(root)
    variants = [(v, s) for v in args.venvs for s in ("redis", "memory")] + [("reference", "redis"), ("floor", "none")]
    results: dict[str, list[tuple[int, float, float, float]]] = {}
    with contextlib.ExitStack() as stack:
        redis_port = gp.free_port()
        (root / "redis").mkdir()
        redis = gp.Proc("redis", [redis_server(), "--bind", gp.HOST, "--port", str(redis_port), "--save", "",
                                  "--appendonly", "no"], root / "redis", redis_port)
        stack.callback(redis.stop)
        redis.wait()
        for r in range(args.rounds):
            for k in range(len(variants)):
                variant, store = variants[(r + k) % len(variants)]
                port, env = gp.free_port(), None
                if variant == "reference":
                    argv, env = [tools.reference], _reference_env(port, redis_port, root / "runtime")
                else:
                    argv = _argv(variant, store, port, redis_port, root, args.venvs[0], args.envoy_headers)
                where = root / f"r{r}-{k}"
                where.mkdir()
                with contextlib.ExitStack() as procs:
                    proc = gp.Proc(where.name, argv, where, port, None, env)
                    procs.callback(proc.stop)
                    proc.wait(60)
                    time.sleep(0.3)
                    _ghz(tools, port, "under", args.warmup, 1, root / "rls.protoset")
                    cpu0, rcpu0 = cpu_seconds([proc.popen.pid]), cpu_seconds([redis.popen.pid])
                    report: dict[str, Any] = _ghz(tools, port, "under", args.requests, 1, root / "rls.protoset")
                    n = max(1, int(report["count"]))
                    cpu = 1e6 * (cpu_seconds([proc.popen.pid]) - cpu0) / n
                    rcpu = 1e6 * (cpu_seconds([redis.popen.pid]) - rcpu0) / n
                errors = {c: m for c, m in (report.get("statusCodeDistribution") or {}).items() if c != "OK"}
                key = f"{Path(variant).name}/{store}"
                results.setdefault(key, []).append((r, float(report["rps"]), cpu, rcpu))
                print(f"round {r + 1}: {key}: {report['rps']:,.0f} req/s, {cpu:.1f} µs CPU, Redis {rcpu:.1f} µs"
                      + (f", errors {errors}" if errors else ""), flush=True)
    reference = {r: rps for r, rps, _, _ in results["reference/redis"]}
    print(f"\n{'variant':32} req/s median (min)   ÷ reference median (range)   CPU µs   Redis µs")
    for key, rows in results.items():
        rps = [x[1] for x in rows]
        ratios = [x[1] / reference[x[0]] for x in rows if x[0] in reference]
        print(f"{key:32} {statistics.median(rps):8,.0f} ({min(rps):8,.0f})   "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})            "
              f"{statistics.median(x[2] for x in rows):6.1f}   {statistics.median(x[3] for x in rows):6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
