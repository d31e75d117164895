"""The gateway bench's peer rounds (``run_peers``): each service started once per round (order
rotated), its exactness check, then ghz on each of its cells with the CPU of the service and of
redis-server read around it (see ``gateway_peers`` for what is compared and why)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import gateway_procs as gp
from .gateway_peer_rows import EXACT_CALLS, SHORT, PeerRound, PeerRow
from .gateway_peers import (
    CALL,
    CONFIG,
    INSTANCES,
    Instance,
    PeerOptions,
    Tools,
    cpu_seconds,
    find_tools,
    protoset,
)
from .services import BenchError, redis_server

__all__ = ["run_peers"]


def _clear_of_minute(seconds: float) -> None:
    """Waits until the clock minute has ``seconds`` left: the reference counts per clock minute, and
    an exactness check across a boundary would see two windows."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def _reference_env(port: int, redis_port: int, runtime: Path) -> dict[str, str]:
    """envoyproxy/ratelimit's environment: stats off (``USE_STATSD=false`` alone logs every sample),
    Redis over TCP, its runtime folder, every listener on loopback."""
    return {"USE_STATSD": "false", "DISABLE_STATS": "true", "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": f"{gp.HOST}:{redis_port}", "RUNTIME_ROOT": str(runtime), "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_WATCH_ROOT": "false", "GRPC_HOST": gp.HOST, "GRPC_PORT": str(port), "HOST": gp.HOST,
            "PORT": str(gp.free_port()), "DEBUG_HOST": gp.HOST, "DEBUG_PORT": str(gp.free_port()), "LOG_LEVEL": "warn"}


def _start(inst: Instance, tools: Tools, root: Path, redis_port: int, procs: contextlib.ExitStack) -> tuple[list[gp.Proc], int]:
    """The instance's processes, listening on one gRPC port."""
    port, config = gp.free_port(), root / "config" / "bench.yaml"
    store = "memory://" if inst.store == "memory" else f"redis://{gp.HOST}:{redis_port}/0"
    d = root / f"{inst.service}-{inst.store}-w{inst.workers}"
    d.mkdir(exist_ok=True)
    env: dict[str, str] | None = None
    if inst.service == "reference":
        argv, env = [tools.reference], _reference_env(port, redis_port, root / "runtime")
    elif inst.service == "floor":
        argv = [*gp.floor_command(0)[:3], "--grpc-front", str(port)]
    else:
        front = ["--front", "python"] if inst.service == "python" else tools.front[4:]
        if inst.service == "front-same":
            front += ["--envoy-headers", "none"]  # the reference's default answers: no headers
        head = gp.serve_command([], 0)[:4] + front
        argv = [*head, str(config), "--grpc", f"{gp.HOST}:{port}", "--http", f"{gp.HOST}:{gp.free_port()}", "--store", store, "--workers", str(inst.workers), "--no-metrics", "--log-level", "error", "--watch", "0"]
    proc = gp.Proc(f"{d.name}-0", argv, d, port, None, env)
    procs.callback(proc.stop)
    proc.wait(60.0)
    time.sleep(2.0 if inst.workers > 1 else 0.3)  # the other workers listening too
    if proc.popen.poll() is not None:
        raise BenchError(f"{proc.name} exited ({proc.popen.returncode}): {proc.log_tail()}")
    return [proc], port


def _ghz(tools: Tools, port: int, scenario: str, n: int, connections: int, protoset_path: Path) -> dict[str, Any]:
    data = json.dumps({"domain": "bench", "descriptors": [{"entries": [{"key": "generic_key", "value": scenario}]}]})
    argv = [tools.ghz, "--insecure", "--protoset", str(protoset_path), "--call", CALL, "-d", data,
            "-c", str(50 * connections), "--connections", str(connections), "-n", str(n), "--format", "json",
            f"{gp.HOST}:{port}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120 + n / 50)
    if done.returncode != 0 or not done.stdout.startswith("{"):
        raise BenchError(f"ghz failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-300:]}")
    return dict(json.loads(done.stdout))


async def _admitted(port: int, value: str) -> int:
    """What the service admits of ``EXACT_CALLS`` concurrent calls on a fresh ``exact`` value."""
    import grpc  # type: ignore[import-untyped, unused-ignore]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

    async with grpc.aio.insecure_channel(f"{gp.HOST}:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(domain="bench")
        entry = request.descriptors.add().entries.add()
        entry.key, entry.value = "exact", value
        answers = await asyncio.gather(*(stub.ShouldRateLimit(request, timeout=60) for _ in range(EXACT_CALLS)))
    return sum(1 for a in answers if a.overall_code == rls_pb2.RateLimitResponse.OK)


def _measure(tools: Tools, procs: list[gp.Proc], redis: gp.Proc | None, port: int, row: PeerRow, round_no: int,
             opts: PeerOptions, protoset_path: Path) -> PeerRound:
    """One cell: a warm-up, then ghz with the CPU of the service and of redis-server around it."""
    if opts.warmup:
        _ghz(tools, port, row.scenario, opts.warmup, row.connections, protoset_path)
    pids = [p.popen.pid for p in procs]
    cpu0, rcpu0 = cpu_seconds(pids), cpu_seconds([redis.popen.pid]) if redis else 0.0
    report = _ghz(tools, port, row.scenario, opts.requests, row.connections, protoset_path)
    cpu, rcpu = cpu_seconds(pids) - cpu0, (cpu_seconds([redis.popen.pid]) - rcpu0) if redis else None
    count = max(1, int(report.get("count", 0)))
    dist = report.get("latencyDistribution") or []
    lat = {float(d["percentage"]): float(d["latency"]) / 1e6 for d in dist if isinstance(d, dict)}
    codes = report.get("statusCodeDistribution") or {}
    errors = {str(k): int(v) for k, v in codes.items() if k != "OK"}
    return PeerRound(round_no, count, float(report.get("rps", 0.0)), lat.get(50.0, 0.0), lat.get(99.0, 0.0),
                     1e6 * cpu / count, None if rcpu is None or row.store != "redis" else 1e6 * rcpu / count, errors)


def _skip_reason(inst: Instance, tools: Tools) -> str:
    service = {"python": "", "front-same": "front", "floor": "front"}.get(inst.service, inst.service)
    return tools.skip.get("all") or tools.skip.get(service, "") \
        or (tools.skip.get("redis", "") if inst.store == "redis" else "")


def _files(root: Path) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "bench.yaml").write_text(CONFIG, encoding="utf-8")
    (root / "runtime" / "ratelimit" / "config").mkdir(parents=True, exist_ok=True)
    (root / "runtime" / "ratelimit" / "config" / "bench.yaml").write_text(CONFIG, encoding="utf-8")
    protoset(root / "rls.protoset")


def _round(r: int, opts: PeerOptions, tools: Tools, root: Path, redis: gp.Proc | None,
           rows: dict[Instance, list[PeerRow]], log: Callable[[str], None] = print) -> None:
    """Round ``r``: every instance not skipped, started in turn (order rotated), checked and measured,
    each step logged."""
    live = [i for i in INSTANCES if not any(row.missing for row in rows[i])]
    for k in range(len(live)):
        inst = live[(r + k) % len(live)]
        name = SHORT.get(inst.service, inst.service) + (f", {inst.workers} workers" if inst.workers > 1 else "")
        store = "no store" if inst.store == "none" else f"on {inst.store}"
        where = f"peer round {r + 1}/{opts.rounds}, service {k + 1}/{len(live)}: {name} {store}"
        with contextlib.ExitStack() as procs:
            try:
                checked = inst.service != "floor"  # it limits nothing
                log(f"{where}: starting" + (f", then {EXACT_CALLS} calls on a fresh limit" if checked else ""))
                started, port = _start(inst, tools, root, redis.port if redis else 0, procs)
                if checked:
                    _clear_of_minute(5.0)
                    got = asyncio.run(_admitted(port, f"r{r}-{uuid.uuid4().hex[:8]}"))
                for row in rows[inst]:
                    if checked:
                        row.admitted.append(got)
                    log(f"{where}: ghz, {opts.requests:,} calls, {row.scenario} the limit, {row.connections} conn")
                    row.rounds.append(_measure(tools, started, redis if inst.store == "redis" else None, port,
                                               row, r, opts, root / "rls.protoset"))
            except (BenchError, OSError, subprocess.SubprocessError) as exc:
                log(f"{where}: stopped ({type(exc).__name__})")
                for row in rows[inst]:
                    row.missing = row.missing or f"{type(exc).__name__}: {exc}"[:400]


def run_peers(opts: PeerOptions, root: Path, log: Callable[[str], None] = print) -> tuple[list[PeerRow], list[str]]:
    """The peer rows (one per instance x cell, in ``INSTANCES`` order) and notes on what ran; a
    service that cannot be had leaves its rows with ``missing`` saying why."""
    root.mkdir(parents=True, exist_ok=True)
    tools = find_tools(opts, root, log)
    rows = {i: [PeerRow(i.service, i.store, s, i.workers, c) for s, c in i.cells] for i in INSTANCES}
    for inst, mine in rows.items():
        why = _skip_reason(inst, tools)
        for row in mine:
            row.missing = why
    notes = tools.notes + sorted(set(tools.skip.values()))
    if "all" not in tools.skip:
        _files(root)
        with contextlib.ExitStack() as stack:
            redis: gp.Proc | None = None
            if "redis" not in tools.skip:
                port = gp.free_port()
                (root / "redis").mkdir(exist_ok=True)
                redis = gp.Proc("redis", [redis_server(), "--bind", gp.HOST, "--port", str(port), "--save", "",
                                          "--appendonly", "no"], root / "redis", port)
                stack.callback(redis.stop)
                redis.wait()
            for r in range(opts.rounds):
                _round(r, opts, tools, root, redis, rows, log)
                log(f"peer round {r + 1}/{opts.rounds} done")
    return [row for mine in rows.values() for row in mine], notes
