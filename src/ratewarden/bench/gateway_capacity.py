"""The gateway bench's capacity rounds: decisions per second of one ``ratewarden serve`` worker
over HTTP keep-alive (wrk) and gRPC, against the fixed-answer floors on the same stack, with the
server's CPU time per answer."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from . import gateway_procs as gp
from .gateway_load import grpc_load, run_wrk
from .gateway_rows import CapacityRow
from .gateway_setup import CAPACITY_SERVERS, GatewayOptions
from .services import BenchError

__all__ = ["STACKS", "measure_capacity", "server_command"]


def _cores() -> tuple[set[int] | None, set[int] | None]:
    import os

    cores = sorted(os.sched_getaffinity(0))
    return ({cores[0]}, set(cores[1:])) if len(cores) >= 2 else (None, None)


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (from /proc; None where it cannot be read)."""
    import os

    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: What each capacity row runs on: every row on the same stack as the floor it is set against
#: (uvicorn for HTTP, grpc.aio in the same event loop for gRPC; the compiled front door has its own bench).
STACKS = {("floor", "http"): "uvicorn: a fixed 200 (ratewarden serve's stack)",
          ("floor", "grpc"): "grpc.aio: a fixed OK (ratewarden serve's stack, uvicorn's event loop)",
          ("floor-headers", "http"): "uvicorn: the fixed 200 with an allowed check's 5 rate-limit headers",
          ("ours", "http"): "uvicorn: ratewarden serve --workers 1 --http-front python, memory store",
          ("ours", "grpc"): "grpc.aio: ratewarden serve --workers 1 --front python, memory store"}


def server_command(what: str, policy: Path, envoy: Path, http: int, grpc: int) -> list[str]:
    """The argv of capacity server ``what``: ``ours`` on the Python fronts, as its floors."""
    if what == "ours":
        return gp.serve_command([policy, envoy], http, grpc, http_front="python", grpc_front="python")
    return gp.floor_command(http, grpc, headers=what == "floor-headers")


def measure_capacity(opts: GatewayOptions, root: Path, policy: Path, bins: Mapping[str, str],
              procs: contextlib.ExitStack, log: Callable[[str], None]) -> list[CapacityRow]:
    """HTTP keep-alive and gRPC decisions/s of one worker: ``ratewarden serve`` (the policy for
    ``/check``, an envoyproxy/ratelimit file for gRPC) against the fixed-answer floor on the same stack
    (``gateway_floor``), every row once per round (order rotated), server and client on different cores."""
    server_cores, client_cores = _cores()
    envoy = root / "envoy.yaml"
    envoy.write_text(gp.envoy_yaml(), encoding="utf-8")
    rows: list[CapacityRow] = []
    live: list[tuple[CapacityRow, int, int]] = []
    for what in CAPACITY_SERVERS:
        http, grpc = gp.free_port(), gp.free_port() if opts.grpc and what != "floor-headers" else 0
        argv = server_command(what, policy, envoy, http, grpc)
        mine = [CapacityRow("http", what, STACKS[what, "http"])] + \
            ([CapacityRow("grpc", what, STACKS[what, "grpc"])] if grpc else [])
        rows += mine
        d = root / f"capacity-{what}"
        d.mkdir(exist_ok=True)
        proc = gp.Proc(f"capacity-{what}", argv, d, http, server_cores)
        procs.callback(proc.stop)
        try:
            proc.wait()
            if grpc:
                gp.wait_port(grpc, 15.0, proc)
        except BenchError as exc:
            for row in mine:
                row.missing = str(exc)
            proc.stop()
            continue
        live += [(row, http if row.protocol == "http" else grpc, proc.popen.pid) for row in mine]
    headers = [f"X-API-Key: {gp.BULK_KEY}", "X-Original-Method: GET", "X-Original-URI: /bucket/object"]
    for r in range(-1, opts.capacity_rounds):  # round -1: warm-up, 1 s each
        for k in range(len(live)):
            row, port, pid = live[(k + max(r, 0)) % len(live)]
            seconds = 1.0 if r < 0 else opts.capacity_seconds
            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            try:
                if row.protocol == "http":
                    rps, n, bad = run_wrk(bins["wrk"], f"http://{gp.HOST}:{port}/check", headers, seconds,
                                          opts.capacity_connections, client_cores)
                else:
                    rps, n, bad = grpc_load(port, seconds, opts.capacity_connections, client_cores)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                row.missing = str(exc)
                continue
            cpu1, t1 = _cpu_seconds(pid), time.perf_counter()
            if r >= 0:
                row.rps_runs.append(rps)
                if cpu0 is not None and cpu1 is not None:
                    row.cpu_pct_runs.append(100.0 * (cpu1 - cpu0) / (t1 - t0))
                    if n:
                        row.cpu_us_runs.append(1e6 * (cpu1 - cpu0) / n)
                row.requests += n
                row.bad += bad
        log(f"capacity round {r + 1}/{opts.capacity_rounds}{' (warm-up)' if r < 0 else ''} done")
    return rows
