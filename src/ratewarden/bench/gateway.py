"""Gateway bench (the reference set-up reproduced with its peers): ``ratewarden bench --gateway``.

**Latency through the gateway.** The reference set-up's load (premium, standard and basic API keys; PUT with a
1 KiB body and GET alternating; 15 concurrent keep-alive workers; a few hundred requests per variant,
paced to the reference set-up's measured ~750 req/s and cut off after ``max_seconds``) against a fast backend
(nginx ``return 200``), through these variants, all up at once and run INTERLEAVED in rounds (every
variant once per round, the order rotated), each round with fresh API keys:

* ``haproxy``: HAProxy, no limiting;
* ``haproxy-native``: HAProxy's stick tables + a map file of API key -> group (the reference set-up's mechanism);
* ``haproxy-ratewarden``: the shipped ``haproxy.cfg`` + ``ratewarden.lua`` (``ratewarden.serve.gateways``)
  asking ``ratewarden serve`` (``/check``) about every request;
* ``haproxy-floor``: the same shipped files asking a service that answers a fixed 200 without checking
  anything: what the Lua round trip costs by itself;
* ``haproxy-spoe``: the shipped ``haproxy-spoe.cfg`` + ``spoe.conf`` asking ``ratewarden serve --spoe``
  over HAProxy's SPOE (persistent, pipelined connections) about every request;
* ``haproxy-spoe-compiled``: the same, asking ``ratewarden serve --spoe --spoe-front compiled`` (a service
  of its own): the SPOP connections held by the compiled front door, the same decisions;
* ``haproxy-spoe-floor``: the same shipped files asking an SPOE agent that answers every request with a
  fixed 200 and an allowed check's variables (``gateway_floor --spoe``): what the SPOE round trip costs;
* ``nginx``: nginx, no limiting; ``nginx-limit_req``: nginx's own ``limit_req``; ``nginx-ratewarden``:
  the shipped ``nginx.conf`` (``auth_request`` to ``ratewarden serve``).

Per variant: the reference set-up's per-group table (requests, average latency, limited, success rate) plus
admitted / limit per group with an exactness flag; latency average, p95 and p99 and throughput, min
and median over the rounds.

**Service capacity.** Decisions per second of one worker over HTTP keep-alive (``/check``, wrk) and
over gRPC (``ShouldRateLimit``), each against a floor on the same stack answering a fixed OK
(``gateway_floor``), and HTTP also against the same fixed 200 carrying an allowed check's rate-limit
headers (the part of an answer any check must write), interleaved in rounds, server and client pinned
to different cores.

**gRPC beside envoyproxy/ratelimit** (``gateway_peers``, with ``peers``): the Python grpc server, the
compiled front door (1 and 2 workers) and the reference on one Redis, and ratewarden on memory, under
ghz (50 streams per connection), over and under the limit: req/s, p50, p99, CPU per decision of the
service and of Redis, admitted against the limit, ratios to the reference within each round.

**Targets** (``targets``): through HAProxy, ratewarden adds <= 1 ms p99 and its average is <= 1.25x no
limiting, each for the Lua path (floor ``haproxy-floor``) and the SPOE path (floor
``haproxy-spoe-floor``); capacity cost <= 1.3x the floor per protocol; the ratewarden rows exact per
tier. Each reported as target / ours / floor.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import gateway_procs as gp
from .gateway_capacity import measure_capacity
from .gateway_load import Plan, load
from .gateway_peer_rows import peer_targets
from .gateway_peer_run import run_peers
from .gateway_peers import PeerOptions
from .gateway_progress import Heartbeat
from .gateway_rows import CapacityRow, GatewayReport, VariantRow, keys_for, round_row
from .gateway_setup import GROUPS, VARIANTS, GatewayOptions, VariantSpec
from .gateway_targets import targets
from .services import BenchError

__all__ = ["run"]


def _clear_of_minute(seconds: float) -> None:
    """Waits until the wall clock has ``seconds`` left in its minute: ratewarden's sliding window
    counts per clock minute, and a run across a boundary would see the previous minute's count."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


@dataclass
class _Starter:
    """Starts the bench's processes in ``root`` and stops each when ``procs`` closes."""

    root: Path
    procs: contextlib.ExitStack

    def __call__(self, name: str, argv: list[str], port: int, directory: Path | None = None) -> gp.Proc:
        d = directory or self.root
        d.mkdir(parents=True, exist_ok=True)
        proc = gp.Proc(name, argv, d, port, None)
        self.procs.callback(proc.stop)
        return proc.wait()


@dataclass
class _Services:
    """What the ratewarden and floor variants ask: their ports (0: not started), a description of
    ratewarden's service, and why a limiter's service is down (its variants are reported missing)."""

    http: int = 0
    spoe: int = 0
    spoe_compiled: int = 0
    floor_http: int = 0
    floor_spoe: int = 0
    description: str = ""
    down: dict[str, str] | None = None

    def asked(self, s: VariantSpec) -> int:
        """The port variant ``s`` asks."""
        if s.limiter == "ratewarden" and s.via == "spoe" and s.spoe_front == "compiled":
            return self.spoe_compiled
        return {("ratewarden", "spoe"): self.spoe, ("floor", "spoe"): self.floor_spoe,
                ("floor", "lua"): self.floor_http}.get((s.limiter, s.via), self.http)


def _start_services(specs: Sequence[VariantSpec], policy: Path, start: _Starter) -> _Services:
    """``ratewarden serve`` (HTTP, and SPOE if a variant asks over it) and the floor service, as
    far as the variants need them."""
    services = _Services(down={})
    assert services.down is not None
    if any(s.limiter == "ratewarden" for s in specs):
        services.http = gp.free_port()
        services.spoe = gp.free_port() if any(s.limiter == "ratewarden" and s.via == "spoe" and s.spoe_front != "compiled"
                                              for s in specs) else 0
        try:
            # uvicorn, the stack of the floor its Lua row is set against (the floor's own service)
            proc = start("ratewarden", gp.serve_command([policy], services.http, spoe=services.spoe, http_front="python"),
                         services.http)
            if services.spoe:
                gp.wait_port(services.spoe, 15.0, proc)
            services.description = "ratewarden serve --workers 1 --http-front python (uvicorn; memory store" + (
                ", HTTP and SPOE on asyncio)" if services.spoe else ")")
        except BenchError as exc:
            services.down["ratewarden"] = f"ratewarden serve did not start: {exc}"
    if any(s.limiter == "ratewarden" and s.spoe_front == "compiled" for s in specs) and "ratewarden" not in services.down:
        services.spoe_compiled = gp.free_port()
        try:  # a service of its own: its SPOE agent on the compiled front door
            start("ratewarden-spoe-compiled", gp.serve_command([policy], gp.free_port(), spoe=services.spoe_compiled,
                                                               spoe_front="compiled"), services.spoe_compiled)
            services.description += "; ratewarden serve --spoe-front compiled (SPOE)"
        except BenchError as exc:
            services.down["spoe-compiled"] = f"ratewarden serve --spoe-front compiled did not start: {exc}"
    floors = [s for s in specs if s.limiter == "floor"]
    if floors:
        services.floor_http = gp.free_port() if any(s.via != "spoe" for s in floors) else 0
        services.floor_spoe = gp.free_port() if any(s.via == "spoe" for s in floors) else 0
        try:
            proc = start("floor", gp.floor_command(services.floor_http, spoe=services.floor_spoe),
                         services.floor_http or services.floor_spoe)
            if services.floor_http and services.floor_spoe:
                gp.wait_port(services.floor_spoe, 15.0, proc)
        except BenchError as exc:
            services.down["floor"] = f"the floor service did not start: {exc}"
    return services


def _start_gateways(specs: Sequence[VariantSpec], rows: Sequence[VariantRow], services: _Services,
                    start: _Starter, bins: Mapping[str, str], backend_port: int, keys: Mapping[str, str],
                    limits: Mapping[str, int]) -> dict[str, int]:
    """Each variant's gateway, configured and started: variant key -> its port. A variant that
    cannot start gets its row's ``missing`` instead."""
    down = services.down or {}
    ports: dict[str, int] = {}
    for s, row in zip(specs, rows, strict=True):
        why = down.get(s.limiter) or (down.get("spoe-compiled") if s.spoe_front == "compiled" else None)
        if why:
            row.missing = why
            continue
        port = gp.free_port()
        d = start.root / s.key
        d.mkdir()
        try:
            files = _gateway_files(s, port, backend_port, services.asked(s), keys, limits)
        except (ImportError, KeyError, TypeError) as exc:
            row.missing = f"configuration not available: {exc}"
            continue
        for name, text in files.items():
            (d / name).write_text(text, encoding="utf-8")
        argv = gp.haproxy_command(d, bins["haproxy"]) if s.gateway == "haproxy" else gp.nginx_command(d, bins["nginx"])
        try:
            start(s.key, argv, port, d)
        except BenchError as exc:
            row.missing = str(exc)
            continue
        ports[s.key] = port
    return ports


def _load_rounds(opts: GatewayOptions, specs: Sequence[VariantSpec], rows: Sequence[VariantRow],
                 ports: Mapping[str, int], log: Callable[[str], None]) -> None:
    """The warm-up and timed rounds, every started variant once per round (order rotated), each
    round with fresh API keys; the timed rounds' figures go to ``rows``."""
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


def run(opts: GatewayOptions, log: Callable[[str], None] = print) -> GatewayReport:
    """Everything: processes up, interleaved rounds, capacity, the peer rows, targets; processes down."""
    bins = gp.require_binaries() if opts.variants or opts.capacity else {}
    specs = [VARIANTS[k] for k in opts.variants]
    rows = [VariantRow(s.key, s.title, s.gateway, s.limiter) for s in specs]
    capacity: list[CapacityRow] = []
    if sorted(opts.limits) != sorted(GROUPS):
        raise BenchError(f"limits must give every group {', '.join(GROUPS)}, got {dict(opts.limits)}")
    with tempfile.TemporaryDirectory(prefix="ratewarden-gateway-") as tmp, contextlib.ExitStack() as procs, \
            Heartbeat(log) as progress:
        root = Path(tmp)
        start = _Starter(root, procs)
        all_keys = {key: group for s in specs for r in range(-opts.warmup, opts.rounds)
                    for key, group in keys_for(s.key, r, opts.keys_per_group)}
        policy = root / "policy.toml"
        policy.write_text(gp.policy_toml(all_keys, opts.limits), encoding="utf-8")
        services = _Services()
        if specs:
            progress(f"gateways: starting {len(specs)} variants (HAProxy, nginx, ratewarden serve, the floors)")
            backend_port = gp.free_port()
            bdir = root / "backend"
            bdir.mkdir()
            (bdir / "nginx.conf").write_text(gp.backend_conf(backend_port))
            start("backend", gp.nginx_command(bdir, bins["nginx"]), backend_port, bdir)
            services = _start_services(specs, policy, start)
            ports = _start_gateways(specs, rows, services, start, bins, backend_port, all_keys, opts.limits)
            _load_rounds(opts, specs, rows, ports, progress)
        if opts.capacity:
            progress("capacity: starting the servers (ratewarden serve and its floors)")
            capacity = measure_capacity(opts, root, policy, bins, procs, progress)
        procs.close()  # the peer rows measure CPU per decision: nothing of the above still running
        peers, notes = run_peers(PeerOptions(opts.peer_rounds, opts.peer_requests), root / "peers", progress) \
            if opts.peers else ([], [])
    report = GatewayReport(_options_dict(opts), services.description, rows, capacity, [], peers=peers,
                           peer_notes=notes)
    report.targets = (targets(report) if specs or opts.capacity else []) + peer_targets(peers)
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


