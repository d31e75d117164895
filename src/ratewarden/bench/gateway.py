"""Gateway bench (seed 003 reproduced with its peers): ``ratewarden bench --gateway``.

**Latency through the gateway.** Seed 003's load (premium, standard and basic API keys; PUT with a
1 KiB body and GET alternating; 15 concurrent keep-alive workers; a few hundred requests per variant,
paced to the seed's measured ~750 req/s and cut off after ``max_seconds``) against a fast backend
(nginx ``return 200``), through these variants, all up at once and run INTERLEAVED in rounds (every
variant once per round, the order rotated), each round with fresh API keys:

* ``haproxy``: HAProxy, no limiting;
* ``haproxy-native``: HAProxy's stick tables + a map file of API key -> group (the seed's mechanism);
* ``haproxy-ratewarden``: the shipped ``haproxy.cfg`` + ``ratewarden.lua`` (``ratewarden.serve.gateways``)
  asking ``ratewarden serve`` (``/check``) about every request;
* ``haproxy-floor``: the same shipped files asking a service that answers a fixed 200 without checking
  anything: what the Lua round trip costs by itself;
* ``haproxy-spoe``: the shipped ``haproxy-spoe.cfg`` + ``spoe.conf`` asking ``ratewarden serve --spoe``
  over HAProxy's SPOE (persistent, pipelined connections) about every request;
* ``haproxy-spoe-floor``: the same shipped files asking an SPOE agent that answers every request with a
  fixed 200 and an allowed check's variables (``gateway_floor --spoe``): what the SPOE round trip costs;
* ``nginx``: nginx, no limiting; ``nginx-limit_req``: nginx's own ``limit_req``; ``nginx-ratewarden``:
  the shipped ``nginx.conf`` (``auth_request`` to ``ratewarden serve``).

Per variant: the seed's per-group table (requests, average latency, limited, success rate) plus
admitted / limit per group with an exactness flag; latency average, p95 and p99 and throughput, min
and median over the rounds.

**Service capacity.** Decisions per second of one worker over HTTP keep-alive (``/check``, wrk) and
over gRPC (``ShouldRateLimit``), each against a floor on the same stack answering a fixed OK
(``gateway_floor``), and HTTP also against the same fixed 200 carrying an allowed check's rate-limit
headers (the part of an answer any check must write), interleaved in rounds, server and client pinned
to different cores.

**Targets** (``targets``): through HAProxy, ratewarden adds <= 1 ms p99 and its average is <= 1.25x no
limiting, each for the Lua path (floor ``haproxy-floor``) and the SPOE path (floor
``haproxy-spoe-floor``); capacity cost <= 1.3x the floor per protocol; the ratewarden rows exact per
tier. Each reported as target / ours / floor.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import gateway_procs as gp
from .gateway_load import LoadResult, Plan, grpc_load, load, run_wrk
from .results import percentile
from .services import BenchError

__all__ = [
    "CAPACITY_SERVERS", "VARIANTS", "CapacityRow", "GatewayOptions", "GatewayReport", "GroupRow", "RoundRow",
    "VariantRow", "VariantSpec", "markdown", "round_row", "run", "summary", "targets", "write",
]


@dataclass(frozen=True)
class VariantSpec:
    key: str
    title: str
    gateway: str  # haproxy | nginx
    limiter: str  # none | native | ratewarden | floor
    via: str = ""  # how HAProxy asks (ratewarden, floor): lua (httpclient -> HTTP) | spoe


VARIANTS: Mapping[str, VariantSpec] = {v.key: v for v in (
    VariantSpec("haproxy", "HAProxy, no limiting", "haproxy", "none"),
    VariantSpec("haproxy-native", "HAProxy stick tables + map file (HAProxy's own limiting)", "haproxy", "native"),
    VariantSpec("haproxy-ratewarden", "HAProxy + ratewarden (Lua httpclient -> /check)", "haproxy", "ratewarden",
                "lua"),
    VariantSpec("haproxy-floor", "HAProxy + the same Lua -> fixed-200 service (floor)", "haproxy", "floor", "lua"),
    VariantSpec("haproxy-spoe", "HAProxy + ratewarden (SPOE)", "haproxy", "ratewarden", "spoe"),
    VariantSpec("haproxy-spoe-floor", "HAProxy + the same SPOE -> fixed agent (floor)", "haproxy", "floor", "spoe"),
    VariantSpec("nginx", "nginx, no limiting", "nginx", "none"),
    VariantSpec("nginx-limit_req", "nginx limit_req (leaky bucket)", "nginx", "native"),
    VariantSpec("nginx-ratewarden", "nginx + ratewarden (auth_request -> /check)", "nginx", "ratewarden"),
)}
CAPACITY_SERVERS = ("floor", "floor-headers", "ours")
#: The floors each protocol's capacity is compared with: a fixed answer, and (HTTP) a fixed answer
#: carrying the rate-limit headers an allowed check carries, so that the ratio is the decision alone.
CAPACITY_FLOORS = {"http": ("floor", "floor-headers"), "grpc": ("floor",)}
GROUPS = tuple(gp.GROUP_LIMITS)


@dataclass
class GatewayOptions:
    rounds: int = 5
    warmup: int = 1
    requests: int = 300
    workers: int = 15
    rate: float = 750.0  # requests/s over all workers; 0 = as fast as they go
    max_seconds: float = 5.0
    keys_per_group: int = 2
    #: Requests per minute per API key, by group (the groups are ``GROUPS``).
    limits: Mapping[str, int] = field(default_factory=lambda: dict(gp.GROUP_LIMITS))
    variants: Sequence[str] = tuple(VARIANTS)
    capacity: bool = True
    capacity_seconds: float = 2.0
    capacity_rounds: int = 3
    capacity_connections: int = 16
    grpc: bool = True


@dataclass
class GroupRow:
    """One group in one round (or summed over the rounds): the seed's columns and admitted / limit."""

    group: str
    requests: int = 0
    admitted: int = 0
    limited: int = 0
    other: int = 0
    lat_avg_ms: float = 0.0
    limit: int | None = None  # per-key limit x keys (x rounds in a sum); None without a limiter
    expected: int | None = None  # what an exact limiter admits: min(requests, limit) per key
    allowance: int | None = None  # nginx limit_req: the limit plus what its bucket leaks during the run
    exact: str = "—"  # yes | within | NO (under) | ⚠ over | — (no limiter)

    @property
    def success_pct(self) -> float:
        return 100.0 * self.admitted / self.requests if self.requests else 0.0

    @property
    def over_limit(self) -> bool:
        return self.exact.startswith("⚠")


@dataclass
class RoundRow:
    round: int
    requests: int
    unsent: int
    seconds: float
    rps: float
    latency_ms: dict[str, float]
    statuses: dict[str, int]
    groups: list[GroupRow]


@dataclass
class VariantRow:
    key: str
    title: str
    gateway: str
    limiter: str
    rounds: list[RoundRow] = field(default_factory=list)
    missing: str = ""

    def stat(self, what: str) -> tuple[float, float] | None:
        """(min, median) over the rounds of ``rps`` or a latency (``mean``, ``p95``, ``p99``)."""
        values = [r.rps if what == "rps" else r.latency_ms[what] for r in self.rounds]
        if not values:
            return None
        return min(values), statistics.median(values)

    def groups(self) -> list[GroupRow]:
        """The per-group table summed over the rounds (exact: the worst round)."""
        out = []
        for g in GROUPS:
            rows = [gr for r in self.rounds for gr in r.groups if gr.group == g]
            total = GroupRow(g)
            for gr in rows:
                total.requests += gr.requests
                total.admitted += gr.admitted
                total.limited += gr.limited
                total.other += gr.other
            answered = sum(gr.requests for gr in rows)
            total.lat_avg_ms = sum(gr.lat_avg_ms * gr.requests for gr in rows) / answered if answered else 0.0
            if rows and rows[0].limit is not None:
                total.limit = sum(gr.limit or 0 for gr in rows)
                total.expected = sum(gr.expected or 0 for gr in rows)
                if any(gr.allowance is not None for gr in rows):
                    total.allowance = sum(gr.allowance or 0 for gr in rows)
                total.exact = _worst([gr.exact for gr in rows])
            out.append(total)
        return out

    @property
    def over_limit(self) -> bool:
        return any(g.over_limit for r in self.rounds for g in r.groups)


@dataclass
class CapacityRow:
    protocol: str  # http | grpc
    server: str  # floor | ours | ratewarden serve
    stack: str
    rps_runs: list[float] = field(default_factory=list)
    #: The server process's CPU time / wall time during each run (100 = one core busy): under ~90,
    #: the client, not the server, set the pace.
    cpu_pct_runs: list[float] = field(default_factory=list)
    #: The server's CPU time per answered request (µs) in each run: the cost of a decision, which
    #: other work on a shared core does not inflate the way it lowers req/s.
    cpu_us_runs: list[float] = field(default_factory=list)
    requests: int = 0
    bad: int = 0
    missing: str = ""

    def stat(self) -> tuple[float, float] | None:
        return (min(self.rps_runs), statistics.median(self.rps_runs)) if self.rps_runs else None

    def cpu_stat(self) -> tuple[float, float] | None:
        """(min, median) CPU µs per request over the rounds."""
        return (min(self.cpu_us_runs), statistics.median(self.cpu_us_runs)) if self.cpu_us_runs else None


@dataclass
class GatewayReport:
    options: dict[str, Any]
    service: str
    variants: list[VariantRow]
    capacity: list[CapacityRow]
    targets: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for v, vd in zip(self.variants, data["variants"], strict=True):
            vd["summary"] = {w: v.stat(w) for w in ("rps", "mean", "p95", "p99")}
            vd["groups_total"] = [asdict(g) | {"success_pct": g.success_pct} for g in v.groups()]
            vd["over_limit"] = v.over_limit
        return data


_RANK = {"⚠ over": 4, "NO": 3, "within": 2, "yes": 1, "—": 0}


def _worst(values: Sequence[str]) -> str:
    return max(values, key=lambda v: _RANK.get(v, 0)) if values else "—"


# ---------------------------------------------------------------------------------------------- rows

def keys_for(variant: str, round_no: int, per_group: int) -> list[tuple[str, str]]:
    """Fresh API keys of one variant's round, as (key, group), groups interleaved."""
    tag = "w" if round_no < 0 else str(round_no)
    return [(f"{g}-{variant}-{tag}-{k}", g) for k in range(per_group) for g in GROUPS]


def round_row(round_no: int, spec: VariantSpec, plan: Plan, result: LoadResult,
              limits: Mapping[str, int] = gp.GROUP_LIMITS) -> RoundRow:
    """One run's figures: latency over every answer, the groups' tables and their exactness."""
    lat = sorted(s.latency_s * 1000 for s in result.samples)
    statuses: dict[str, int] = {}
    for s in result.samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    per_key: list[dict[str, float]] = [{"n": 0, "ok": 0, "429": 0, "lat": 0.0} for _ in plan.keys]
    for s in result.samples:
        k = per_key[s.key]
        k["n"] += 1
        k["lat"] += s.latency_s * 1000
        if 200 <= s.status < 300:
            k["ok"] += 1
        elif s.status == 429:
            k["429"] += 1
    groups = []
    limited = spec.limiter in ("native", "ratewarden")
    for g in GROUPS:
        idx = [i for i, (_, grp) in enumerate(plan.keys) if grp == g]
        row = GroupRow(g)
        row.requests = int(sum(per_key[i]["n"] for i in idx))
        row.admitted = int(sum(per_key[i]["ok"] for i in idx))
        row.limited = int(sum(per_key[i]["429"] for i in idx))
        row.other = row.requests - row.admitted - row.limited
        row.lat_avg_ms = sum(per_key[i]["lat"] for i in idx) / row.requests if row.requests else 0.0
        if limited:
            limit = limits[g]
            leaky = spec.gateway == "nginx" and spec.limiter == "native"
            verdicts = []
            row.limit = limit * len(idx)
            row.expected = 0
            if leaky:
                row.allowance = 0
            for i in idx:
                n, ok = int(per_key[i]["n"]), int(per_key[i]["ok"])
                expected = min(n, limit)
                allowance = limit + math.floor(limit * result.seconds / 60) if leaky else limit
                row.expected += expected
                if leaky and row.allowance is not None:
                    row.allowance += allowance
                if ok == expected:
                    verdicts.append("yes")
                elif ok > allowance:
                    verdicts.append("⚠ over")
                elif ok > limit:
                    verdicts.append("within")
                else:
                    verdicts.append("NO")
            row.exact = _worst(verdicts)
        groups.append(row)
    mean = sum(lat) / len(lat) if lat else 0.0
    latency = {"mean": mean, "p50": percentile(lat, 50), "p95": percentile(lat, 95), "p99": percentile(lat, 99),
               "max": lat[-1] if lat else 0.0, "min": lat[0] if lat else 0.0}
    answered = len(result.samples)
    return RoundRow(round_no, answered, result.unsent, result.seconds,
                    answered / result.seconds if result.seconds else 0.0, latency, statuses, groups)


# ---------------------------------------------------------------------------------------------- run

def _clear_of_minute(seconds: float) -> None:
    """Waits until the wall clock has ``seconds`` left in its minute: ratewarden's sliding window
    counts per clock minute, and a run across a boundary would see the previous minute's count."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def run(opts: GatewayOptions, log: Callable[[str], None] = print) -> GatewayReport:
    """Everything: processes up, interleaved rounds, capacity, targets; processes down."""
    bins = gp.require_binaries()
    specs = [VARIANTS[k] for k in opts.variants]
    rows = [VariantRow(s.key, s.title, s.gateway, s.limiter) for s in specs]
    capacity: list[CapacityRow] = []
    service_desc = ""
    with tempfile.TemporaryDirectory(prefix="ratewarden-gateway-") as tmp, contextlib.ExitStack() as procs:
        root = Path(tmp)
        all_keys = {key: group for s in specs for r in range(-opts.warmup, opts.rounds)
                    for key, group in keys_for(s.key, r, opts.keys_per_group)}
        policy = root / "policy.toml"
        if sorted(opts.limits) != sorted(GROUPS):
            raise BenchError(f"limits must give every group {', '.join(GROUPS)}, got {dict(opts.limits)}")
        policy.write_text(gp.policy_toml(all_keys, opts.limits), encoding="utf-8")

        def start(name: str, argv: list[str], port: int, directory: Path | None = None,
                  cores: set[int] | None = None) -> gp.Proc:
            d = directory or root
            d.mkdir(parents=True, exist_ok=True)
            proc = gp.Proc(name, argv, d, port, cores)
            procs.callback(proc.stop)
            return proc.wait()

        backend_port = gp.free_port()
        bdir = root / "backend"
        bdir.mkdir()
        (bdir / "nginx.conf").write_text(gp.backend_conf(backend_port))
        start("backend", gp.nginx_command(bdir, bins["nginx"]), backend_port, bdir)
        service_port = floor_port = service_spoe = floor_spoe = 0
        down: dict[str, str] = {}  # limiter -> why its service is not there (its variants are reported missing)
        if any(s.limiter == "ratewarden" for s in specs):
            service_port = gp.free_port()
            service_spoe = gp.free_port() if any(s.limiter == "ratewarden" and s.via == "spoe" for s in specs) else 0
            try:
                proc = start("ratewarden", gp.serve_command([policy], service_port, spoe=service_spoe), service_port)
                if service_spoe:
                    gp.wait_port(service_spoe, 15.0, proc)
                service_desc = "ratewarden serve --workers 1 (memory store" + (", HTTP and SPOE)" if service_spoe else ")")
            except BenchError as exc:
                down["ratewarden"] = f"ratewarden serve did not start: {exc}"
        floors = [s for s in specs if s.limiter == "floor"]
        if floors:
            floor_port = gp.free_port() if any(s.via != "spoe" for s in floors) else 0
            floor_spoe = gp.free_port() if any(s.via == "spoe" for s in floors) else 0
            try:
                proc = start("floor", gp.floor_command(floor_port, spoe=floor_spoe), floor_port or floor_spoe)
                if floor_port and floor_spoe:
                    gp.wait_port(floor_spoe, 15.0, proc)
            except BenchError as exc:
                down["floor"] = f"the floor service did not start: {exc}"
        ports: dict[str, int] = {}
        for s in specs:
            if s.limiter in down:
                rows[specs.index(s)].missing = down[s.limiter]
                continue
            port = gp.free_port()
            d = root / s.key
            d.mkdir()
            try:
                asked = {("ratewarden", "spoe"): service_spoe, ("floor", "spoe"): floor_spoe,
                         ("floor", "lua"): floor_port}.get((s.limiter, s.via), service_port)
                files = _gateway_files(s, port, backend_port, asked, all_keys, opts.limits)
            except (ImportError, KeyError, TypeError) as exc:
                rows[specs.index(s)].missing = f"configuration not available: {exc}"
                continue
            for name, text in files.items():
                (d / name).write_text(text, encoding="utf-8")
            argv = gp.haproxy_command(d, bins["haproxy"]) if s.gateway == "haproxy" else gp.nginx_command(d, bins["nginx"])
            try:
                start(s.key, argv, port, d)
            except BenchError as exc:
                rows[specs.index(s)].missing = str(exc)
                continue
            ports[s.key] = port
        live = [i for i, s in enumerate(specs) if s.key in ports]
        total = opts.warmup + opts.rounds
        for r in range(total):
            round_no = r - opts.warmup
            for k in range(len(live)):
                i = live[(r + k) % len(live)]
                s = specs[i]
                plan = Plan(keys_for(s.key, round_no, opts.keys_per_group), opts.requests, opts.workers, opts.rate,
                            opts.max_seconds)
                if s.limiter == "ratewarden":
                    _clear_of_minute(opts.max_seconds + 1)
                result = load(ports[s.key], plan)
                if round_no >= 0:
                    rows[i].rounds.append(round_row(round_no, s, plan, result, opts.limits))
            log(f"gateway round {r + 1}/{total}{' (warm-up)' if round_no < 0 else ''} done")
        if opts.capacity:
            capacity = _capacity(opts, root, policy, bins, procs, log)
    report = GatewayReport(_options_dict(opts), service_desc, rows, capacity, [])
    report.targets = targets(report)
    return report


def _options_dict(opts: GatewayOptions) -> dict[str, Any]:
    d = asdict(opts)
    d["variants"] = list(opts.variants)
    d["limits"] = dict(opts.limits)
    return d


def _gateway_files(s: VariantSpec, port: int, backend: int, service: int,
                   keys: Mapping[str, str], limits: Mapping[str, int]) -> dict[str, str]:
    """A variant's configuration files; ``service``: the port of what it asks (ratewarden's or the
    floor's HTTP, or their SPOE agent for the ``spoe`` variants)."""
    if s.gateway == "haproxy":
        if s.limiter == "none":
            return {"haproxy.cfg": gp.haproxy_plain_conf(port, backend)}
        if s.limiter == "native":
            return {"haproxy.cfg": gp.haproxy_native_conf(port, backend)} | gp.haproxy_maps(keys, limits)
        if s.via == "spoe":
            return gp.haproxy_spoe_files(port, service, backend)
        return gp.haproxy_ratewarden_files(port, service, backend)
    if s.limiter == "none":
        return {"nginx.conf": gp.nginx_plain_conf(port, backend)}
    if s.limiter == "native":
        return {"nginx.conf": gp.nginx_limit_req_conf(port, backend, limits)} | gp.nginx_maps(keys)
    return {"nginx.conf": gp.nginx_ratewarden_conf(port, service, backend)}


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


def _capacity(opts: GatewayOptions, root: Path, policy: Path, bins: Mapping[str, str],
              procs: contextlib.ExitStack, log: Callable[[str], None]) -> list[CapacityRow]:
    """HTTP keep-alive and gRPC decisions/s of one worker: ``ratewarden serve`` (the policy for
    ``/check``, an envoyproxy/ratelimit file for gRPC) against the fixed-answer floor on the same stack
    (``gateway_floor``), every row once per round (order rotated), server and client on different cores."""
    server_cores, client_cores = _cores()
    envoy = root / "envoy.yaml"
    envoy.write_text(gp.envoy_yaml(), encoding="utf-8")
    stacks = {"floor": "fixed 200 / OK on ratewarden serve's stack (uvicorn + grpc.aio, one event loop)",
              "floor-headers": "the same fixed 200 with an allowed check's 5 rate-limit headers",
              "ours": "ratewarden serve --workers 1, memory store"}
    rows: list[CapacityRow] = []
    live: list[tuple[CapacityRow, int, int]] = []
    for what in CAPACITY_SERVERS:
        http, grpc = gp.free_port(), gp.free_port() if opts.grpc and what != "floor-headers" else 0
        if what == "ours":
            argv = gp.serve_command([policy, envoy], http, grpc)
        else:
            argv = gp.floor_command(http, grpc, headers=what == "floor-headers")
        mine = [CapacityRow("http", what, stacks[what])] + ([CapacityRow("grpc", what, stacks[what])] if grpc else [])
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


# ---------------------------------------------------------------------------------------------- targets

def _find(report: GatewayReport, key: str) -> VariantRow | None:
    for v in report.variants:
        if v.key == key and v.rounds and not v.missing:
            return v
    return None


def _cap(report: GatewayReport, protocol: str, server: str) -> CapacityRow | None:
    for c in report.capacity:
        if c.protocol == protocol and c.server == server and c.rps_runs:
            return c
    return None


def _capacity_targets(protocol: str, floor_name: str, fl: CapacityRow | None, us: CapacityRow | None,
                      entry: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """The capacity targets of one protocol against one floor: by req/s and by server CPU."""
    what = "HTTP keep-alive /check" if protocol == "http" else "gRPC ShouldRateLimit"
    against = ", floor with the same headers" if floor_name == "floor-headers" else ""
    floor_text = "the fixed answer with the same headers" if floor_name == "floor-headers" else "the fixed-answer floor"

    def cost(i: int, c: CapacityRow | None) -> float | None:
        s, f = (c.stat() if c else None), (fl.stat() if fl else None)
        return None if s is None or f is None or not s[i] else f[i] / s[i]

    e = entry(f"service capacity, {what}{against}", f"decision cost <= 1.3x {floor_text} (floor req/s / ours req/s)",
              1.3, "x", cost, ours_row=us, floor_row=fl)
    for i, suffix in ((1, ""), (0, "_min")):
        e[f"ours_rps{suffix}"] = us.stat()[i] if us and us.stat() else None  # type: ignore[index]
        e[f"floor_rps{suffix}"] = fl.stat()[i] if fl and fl.stat() else None  # type: ignore[index]

    def cpu_cost(i: int, c: CapacityRow | None) -> float | None:
        s, f = (c.cpu_stat() if c else None), (fl.cpu_stat() if fl else None)
        return None if s is None or f is None or not f[i] else s[i] / f[i]

    short = "HTTP /check" if protocol == "http" else "gRPC"
    e2 = entry(f"service capacity, {short}: server CPU per decision{against}",
               f"ours CPU µs per decision <= 1.3x {floor_text}'s per answer", 1.3, "x", cpu_cost,
               ours_row=us, floor_row=fl)
    for i, suffix in ((1, ""), (0, "_min")):
        e2[f"ours_us{suffix}"] = us.cpu_stat()[i] if us and us.cpu_stat() else None  # type: ignore[index]
        e2[f"floor_us{suffix}"] = fl.cpu_stat()[i] if fl and fl.cpu_stat() else None  # type: ignore[index]
    return [e, e2]


def targets(report: GatewayReport) -> list[dict[str, Any]]:
    """The issue's targets, each as target / ours / floor from the medians and the minima over rounds.

    * HAProxy + ratewarden adds <= 1 ms p99 over HAProxy without limiting; floor: the same Lua asking a
      fixed-200 service.
    * its average latency <= 1.25x HAProxy without limiting (the seed measured 6.99x); same floor.
    * both again for the SPOE path (``haproxy-spoe``), floor: the same SPOE asking a fixed agent.
    * capacity per protocol: floor req/s / ours req/s <= 1.3 (the cost of a decision against the cost
      of a fixed answer on the same stack); ours and floor also given as req/s.
    * the ratewarden rows exact per tier.
    """
    out: list[dict[str, Any]] = []
    none = _find(report, "haproxy")

    def lat(v: VariantRow | None, what: str, i: int) -> float | None:
        s = v.stat(what) if v is not None else None
        return None if s is None else s[i]

    def entry(name: str, rule: str, target: float, unit: str,
              value: Callable[[int, Any], float | None], *,
              ours_row: Any = None, floor_row: Any = None) -> dict[str, Any]:
        e: dict[str, Any] = {"target": name, "rule": rule, "target_value": target, "unit": unit}
        for i, suffix in ((1, ""), (0, "_min")):
            o, f = value(i, ours_row), value(i, floor_row)
            e[f"ours{suffix}"], e[f"floor{suffix}"] = o, f
            e[f"met{suffix}"] = None if o is None else o <= target
        return e

    def added_p99(i: int, v: VariantRow | None) -> float | None:
        a, b = lat(v, "p99", i), lat(none, "p99", i)
        return None if a is None or b is None else a - b

    def avg_ratio(i: int, v: VariantRow | None) -> float | None:
        a, b = lat(v, "mean", i), lat(none, "mean", i)
        return None if a is None or b is None or not b else a / b

    for path, ours_key, floor_key in (("Lua", "haproxy-ratewarden", "haproxy-floor"),
                                      ("SPOE", "haproxy-spoe", "haproxy-spoe-floor")):
        ours, floor = _find(report, ours_key), _find(report, floor_key)
        out.append(entry(f"HAProxy + ratewarden ({path}): added p99", "<= 1 ms over HAProxy without limiting", 1.0,
                         "ms", added_p99, ours_row=ours, floor_row=floor))
        out.append(entry(f"HAProxy + ratewarden ({path}): average latency",
                         "<= 1.25x HAProxy without limiting (HAProxy's Lua set-up: 6.99x)", 1.25, "x", avg_ratio,
                         ours_row=ours, floor_row=floor))
    for protocol, floors in CAPACITY_FLOORS.items():
        for floor_name in floors:
            out += _capacity_targets(protocol, floor_name, _cap(report, protocol, floor_name),
                                     _cap(report, protocol, "ours"), entry)
    rw = [v for v in report.variants if v.limiter == "ratewarden" and v.rounds]
    exact = all(g.exact == "yes" for v in rw for g in v.groups()) if rw else None
    out.append({"target": "ratewarden rows exact per tier", "rule": "admitted = min(requests, limit) per key, "
                "every round", "target_value": None, "unit": "", "ours": exact, "floor": None, "met": exact,
                "ours_min": exact, "floor_min": None, "met_min": exact})
    return out


# ---------------------------------------------------------------------------------------------- output

def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pair(s: tuple[float, float] | None, digits: int = 2) -> str:
    return "-" if s is None else f"{_f(s[1], digits)} / {_f(s[0], digits)}"


def _admitted(g: GroupRow) -> str:
    if g.limit is None:
        return f"{g.admitted:,} / no limit"
    cell = f"{g.admitted:,} / {g.limit:,}"
    if g.expected is not None and g.expected != g.limit:
        cell += f" (exact: {g.expected:,})"
    if g.allowance is not None and g.exact == "within":
        cell += f" (leaky bucket: ≤ {g.allowance:,})"
    return ("⚠ " + cell) if g.over_limit else cell


def variant_table(report: GatewayReport) -> list[list[str]]:
    head = ["variant", "rounds", "req/s (med / min)", "avg ms (med / min)", "p95 ms (med / min)",
            "p99 ms (med / min)", "avg vs no limiting", "exact", "statuses"]
    out = [head]
    base = {v.gateway: v for v in report.variants if v.limiter == "none" and v.rounds}
    for v in report.variants:
        if v.missing or not v.rounds:
            out.append([v.title, "0", "-", "-", "-", "-", "-", "-", f"MISSING: {v.missing or 'no rounds'}"])
            continue
        b = base.get(v.gateway)
        ratio = "-" if b is None or v is b else f"{v.stat('mean')[1] / b.stat('mean')[1]:.2f}x"  # type: ignore[index]
        statuses: dict[str, int] = {}
        for r in v.rounds:
            for k, n in r.statuses.items():
                statuses[k] = statuses.get(k, 0) + n
        exact = _worst([g.exact for g in v.groups()])
        out.append([v.title, str(len(v.rounds)), _pair(v.stat("rps"), 0), _pair(v.stat("mean")), _pair(v.stat("p95")),
                    _pair(v.stat("p99")), ratio, exact, ", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))])
    return out


def group_table(v: VariantRow) -> list[list[str]]:
    out = [["group", "requests", "avg latency ms", "limited", "success rate", "admitted / limit", "exact"]]
    for g in v.groups():
        out.append([g.group, f"{g.requests:,}", f"{g.lat_avg_ms:.2f}", f"{g.limited:,}", f"{g.success_pct:.1f}%",
                    _admitted(g), g.exact])
    return out


def capacity_table(report: GatewayReport) -> list[list[str]]:
    out = [["protocol", "server", "stack", "decisions/s per worker (med / min)", "vs floor (cost)",
            "server CPU % (med)", "CPU µs / request (med / min)", "vs floor (CPU)", "non-OK", "rounds"]]
    for c in report.capacity:
        fl = _cap(report, c.protocol, "floor")
        s = c.stat()
        if c.missing and not c.rps_runs:
            out.append([c.protocol, c.server, c.stack, "-", "-", "-", "-", "-", "-", f"MISSING: {c.missing}"])
            continue
        ratio = "-" if fl is None or s is None or c is fl else f"{fl.stat()[1] / s[1]:.2f}x"  # type: ignore[index]
        cpu = f"{statistics.median(c.cpu_pct_runs):.0f}" if c.cpu_pct_runs else "-"
        us, fus = c.cpu_stat(), (fl.cpu_stat() if fl else None)
        cpu_ratio = "-" if us is None or fus is None or c is fl else f"{us[1] / fus[1]:.2f}x"
        out.append([c.protocol, c.server, c.stack, _pair(s, 0), ratio, cpu, _pair(us, 1), cpu_ratio, str(c.bad),
                    str(len(c.rps_runs))])
    return out


def target_table(ts: Sequence[dict[str, Any]]) -> list[list[str]]:
    def met(x: Any) -> str:
        return "n/a" if x is None else ("yes" if x else "NO")

    out = [["target", "rule", "target", "ours (med / min)", "floor (med / min)", "met (med / min)"]]
    for t in ts:
        if t["unit"] == "":
            out.append([t["target"], t["rule"], "exact", met(t["ours"]), "-", met(t["met"])])
            continue
        u = " ms" if t["unit"] == "ms" else "x"
        ours = f"{_f(t['ours'])} / {_f(t['ours_min'])}{u}"
        floor = f"{_f(t['floor'])} / {_f(t['floor_min'])}{u}"
        if "ours_rps" in t:
            ours += f" ({_f(t['ours_rps'], 0)} / {_f(t['ours_rps_min'], 0)} req/s)"
            floor = f"1.00x ({_f(t['floor_rps'], 0)} / {_f(t['floor_rps_min'], 0)} req/s)"
        if "ours_us" in t:
            ours += f" ({_f(t['ours_us'], 1)} / {_f(t['ours_us_min'], 1)} µs)"
            floor = f"1.00x ({_f(t['floor_us'], 1)} / {_f(t['floor_us_min'], 1)} µs)"
        out.append([t["target"], t["rule"], f"{t['target_value']:g}{u}", ours, floor,
                    f"{met(t['met'])} / {met(t['met_min'])}"])
    return out


def _md(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def _method(report: GatewayReport) -> str:
    o = report.options
    pace = f"paced to {o['rate']:g} req/s" if o["rate"] else "as fast as they go (closed loop)"
    limits = ", ".join(f"{g} {n}/min" for g, n in o["limits"].items())
    return (f"{o['requests']} requests per variant per round ({o['workers']} keep-alive workers, {pace}, cut off "
            f"after {o['max_seconds']:g} s), {o['keys_per_group']} fresh API keys per group per round, PUT (1 KiB) "
            f"and GET alternating; limits per key: {limits}; {o['warmup']} warm-up + {o['rounds']} timed rounds, "
            f"variants interleaved (order rotated each round). Backend: nginx `return 200`. ratewarden: "
            f"{report.service or '-'}. Capacity: 1 worker each, server and client on different "
            f"cores, {o['capacity_connections']} connections / concurrent calls, {o['capacity_rounds']} rounds "
            f"of {o['capacity_seconds']:g} s, interleaved.")


def summary(report: GatewayReport) -> str:
    """The terminal summary: targets, the variants, capacity (Markdown tables)."""
    tables = [target_table(report.targets), variant_table(report)] + ([capacity_table(report)] if report.capacity else [])
    return "\n\n".join([_md(t) for t in tables] + [line for line in (report.meta.get("load", ""),) if line])


def _meta_lines(report: GatewayReport) -> list[str]:
    return [f"- {k}: {v}" for k, v in report.meta.items() if v not in ("", None)]


def markdown(report: GatewayReport) -> str:
    parts = ["# Gateways: HAProxy and nginx", "", _method(report), "", *_meta_lines(report), "", "## Targets", "", _md(target_table(report.targets)),
             "", "## Latency through the gateway (median / min over the rounds)", "",
             _md(variant_table(report)), ""]
    for v in report.variants:
        if v.rounds:
            parts += [f"### {v.title} (`{v.key}`), summed over {len(v.rounds)} rounds", "", _md(group_table(v)), ""]
    if report.capacity:
        parts += ["## Service capacity", "", _md(capacity_table(report)), ""]
    over = [v.title for v in report.variants if v.over_limit]
    if over:
        parts += [f"⚠ over the limit: {', '.join(over)}", ""]
    return "\n".join(parts)


def _html_table(rows: list[list[str]]) -> str:
    from html import escape

    head = "".join(f"<th>{escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f'<td{" class=over" if c.startswith("⚠") else ""}>{escape(c)}</td>'
                                    for c in r) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def html(report: GatewayReport) -> str:
    from html import escape

    from .reports.html_report import _CSS, bar_chart

    live = [v for v in report.variants if v.rounds]
    charts = [
        bar_chart("Latency through the gateway (median over rounds)", [v.title for v in live],
                  {"avg ms": [v.stat("mean")[1] for v in live],  # type: ignore[index]
                   "p99 ms": [v.stat("p99")[1] for v in live]},  # type: ignore[index]
                  "ms", {"avg ms": [v.over_limit for v in live], "p99 ms": [v.over_limit for v in live]}),
    ]
    caps = [c for c in report.capacity if c.rps_runs]
    if caps:
        charts.append(bar_chart("Service capacity: decisions/s per worker (median)",
                                [f"{c.protocol} · {c.server}" for c in caps],
                                {"req/s": [c.stat()[1] for c in caps]}, "req/s"))  # type: ignore[index]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>Gateways: HAProxy and nginx</title><style>{_CSS}</style>"
             f"</head><body><h1>Gateways: HAProxy and nginx</h1><p>{escape(_method(report))}</p>",
             "<ul class=meta>" + "".join(f"<li>{escape(line[2:])}</li>" for line in _meta_lines(report)) + "</ul>",
             "<h2>Targets</h2>", _html_table(target_table(report.targets)),
             "<h2>Latency through the gateway</h2>", _html_table(variant_table(report))]
    parts += [f'<div class="chart">{c}</div>' for c in charts[:1]]
    for v in live:
        parts += [f"<h3>{escape(v.title)}</h3>", _html_table(group_table(v))]
    if report.capacity:
        parts += ["<h2>Service capacity</h2>", _html_table(capacity_table(report))]
    parts += [f'<div class="chart">{c}</div>' for c in charts[1:]]
    parts.append("</body></html>")
    return "\n".join(parts)


CSV_COLUMNS = ["variant", "title", "gateway", "limiter", "group", "rounds", "requests", "admitted", "limited",
               "other", "lat_avg_ms", "success_pct", "limit", "expected", "allowance", "exact", "over_limit",
               "rps_median", "rps_min", "avg_ms_median", "avg_ms_min", "p95_ms_median", "p95_ms_min",
               "p99_ms_median", "p99_ms_min"]
CAPACITY_COLUMNS = ["protocol", "server", "stack", "rps_median", "rps_min", "rps_runs", "cpu_pct_runs", "cpu_us_median", "cpu_us_min", "cpu_us_runs", "vs_floor_cpu", "requests", "bad",
                    "vs_floor_cost", "missing"]


def write(out: Path | str, report: GatewayReport) -> list[Path]:
    """``gateway.json``, ``gateway.csv`` (one row per variant x group, plus ``all``),
    ``gateway-capacity.csv``, ``gateway.md`` and ``gateway.html`` in ``out``."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    written = [path / n for n in ("gateway.json", "gateway.csv", "gateway-capacity.csv", "gateway.md", "gateway.html")]
    written[0].write_text(json.dumps(report.as_dict(), indent=2, default=str), encoding="utf-8")
    with written[1].open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for v in report.variants:
            stats = {f"{name}_{m}": (round(s[j], 4) if s else "") for name, what in
                     (("rps", "rps"), ("avg_ms", "mean"), ("p95_ms", "p95"), ("p99_ms", "p99"))
                     for s in (v.stat(what),) for m, j in (("median", 1), ("min", 0))}
            base = {"variant": v.key, "title": v.title, "gateway": v.gateway, "limiter": v.limiter,
                    "rounds": len(v.rounds)}
            groups = v.groups()
            n = sum(g.requests for g in groups)
            w.writerow(base | stats | {
                "group": "all", "requests": n, "admitted": sum(g.admitted for g in groups),
                "limited": sum(g.limited for g in groups), "other": sum(g.other for g in groups),
                "lat_avg_ms": round(sum(g.lat_avg_ms * g.requests for g in groups) / n, 4) if n else "",
                "success_pct": round(100 * sum(g.admitted for g in groups) / n, 2) if n else "",
                "exact": _worst([g.exact for g in groups]), "over_limit": v.over_limit})
            for g in groups:
                w.writerow(base | {
                    "group": g.group, "requests": g.requests, "admitted": g.admitted, "limited": g.limited,
                    "other": g.other, "lat_avg_ms": round(g.lat_avg_ms, 4), "success_pct": round(g.success_pct, 2),
                    "limit": "" if g.limit is None else g.limit, "expected": "" if g.expected is None else g.expected,
                    "allowance": "" if g.allowance is None else g.allowance, "exact": g.exact,
                    "over_limit": g.over_limit})
    with written[2].open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CAPACITY_COLUMNS)
        w.writeheader()
        for c in report.capacity:
            s, fl = c.stat(), _cap(report, c.protocol, "floor")
            fs = fl.stat() if fl else None
            cs, fcs = c.cpu_stat(), (fl.cpu_stat() if fl else None)
            w.writerow({"protocol": c.protocol, "server": c.server, "stack": c.stack,
                        "rps_median": round(s[1], 1) if s else "", "rps_min": round(s[0], 1) if s else "",
                        "rps_runs": ";".join(f"{x:.1f}" for x in c.rps_runs),
                        "cpu_pct_runs": ";".join(f"{x:.0f}" for x in c.cpu_pct_runs),
                        "cpu_us_median": round(cs[1], 2) if cs else "", "cpu_us_min": round(cs[0], 2) if cs else "",
                        "cpu_us_runs": ";".join(f"{x:.2f}" for x in c.cpu_us_runs),
                        "vs_floor_cpu": round(cs[1] / fcs[1], 4) if cs and fcs else "", "requests": c.requests, "bad": c.bad,
                        "vs_floor_cost": round(fs[1] / s[1], 4) if s and fs else "", "missing": c.missing})
    written[3].write_text(markdown(report), encoding="utf-8")
    written[4].write_text(html(report), encoding="utf-8")
    return written
