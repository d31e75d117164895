"""A made-up gateway bench report with every part (variants, capacity, the peer rows, targets), for
the report tests: figures chosen so each verdict and each way of judging shows."""

from __future__ import annotations

from ratewarden.bench.gateway_load import LoadResult, Plan, Sample
from ratewarden.bench.gateway_peer_rows import EXACT_LIMIT, PeerRound, PeerRow, peer_targets
from ratewarden.bench.gateway_rows import CapacityRow, GatewayReport, VariantRow, keys_for, round_row
from ratewarden.bench.gateway_setup import VARIANTS, GatewayOptions
from ratewarden.bench.gateway_targets import targets

LIMITS = {"premium": 30, "standard": 10, "basic": 5}
PER_KEY = 20
ROUNDS = 3
#: Per variant, per round: (average ms, p99 ms). haproxy-spoe-compiled's p99 is below HAProxy's own:
#: a negative added p99, which must read as noise.
LATENCY = {
    "haproxy": [(0.14, 0.40), (0.15, 0.45), (0.13, 0.50)],
    "haproxy-native": [(0.14, 0.42), (0.16, 0.47), (0.14, 0.52)],
    "haproxy-ratewarden": [(0.43, 1.10), (0.45, 1.30), (0.40, 1.05)],
    "haproxy-floor": [(0.37, 0.90), (0.39, 1.00), (0.36, 0.95)],
    "haproxy-spoe": [(0.30, 0.80), (0.32, 0.85), (0.29, 0.70)],
    "haproxy-spoe-compiled": [(0.20, 0.35), (0.21, 0.40), (0.19, 0.45)],
    "haproxy-spoe-floor": [(0.18, 0.50), (0.20, 0.55), (0.17, 0.52)],
    "nginx": [(0.11, 0.28), (0.12, 0.30), (0.10, 0.26)],
    "nginx-limit_req": [(0.11, 0.28), (0.13, 0.29), (0.10, 0.27)],
}
MISSING_WHY = ("configuration not available: " + "the shipped nginx.conf could not be rendered because " * 4).strip()


def _variant(key: str) -> VariantRow:
    spec = VARIANTS[key]
    row = VariantRow(spec.key, spec.title, spec.gateway, spec.limiter)
    if key not in LATENCY:
        row.missing = MISSING_WHY
        return row
    for r, (avg, p99) in enumerate(LATENCY[key]):
        plan = Plan(keys_for(key, r, 1), PER_KEY * 3)
        result = LoadResult(seconds=0.08)
        for k, (_, group) in enumerate(plan.keys):
            ok = min(PER_KEY, LIMITS[group]) if spec.limiter in ("native", "ratewarden") else PER_KEY
            result.samples += [Sample(k, 200 if i < ok else 429, avg / 1000) for i in range(PER_KEY)]
        rnd = round_row(r, spec, plan, result, LIMITS)
        rnd.latency_ms.update(mean=avg, p95=(avg + p99) / 2, p99=p99)
        rnd.rps = 750.0 + r
        row.rounds.append(rnd)
    return row


def _capacity() -> list[CapacityRow]:
    stack = {"floor": "fixed 200 / OK", "floor-headers": "fixed 200 with headers", "ours": "ratewarden serve"}
    runs = {("http", "floor"): ([20_000.0, 23_000.0, 21_000.0], [20.0, 21.0, 19.5]),
            ("grpc", "floor"): ([5_800.0, 5_400.0, 6_358.0], [168.0, 170.0, 162.0]),
            ("http", "floor-headers"): ([18_000.0, 19_000.0, 17_500.0], [24.0, 25.0, 23.0]),
            ("http", "ours"): ([14_700.0, 6_156.0, 15_000.0], [50.8, 49.2, 51.0]),
            ("grpc", "ours"): ([4_429.0, 4_272.0, 4_500.0], [225.6, 213.7, 220.0])}
    return [CapacityRow(p, s, stack[s], rps, [90.0, 95.0, 92.0], us, 1000, 0) for (p, s), (rps, us) in runs.items()]


def _peer(service: str, store: str, scenario: str, connections: int, rps: list[float], cpu: list[float],
          workers: int = 1) -> PeerRow:
    rounds = [PeerRound(r, 20_000, x, 1.0, 2.0 + r / 10, c, 10.0 if store == "redis" else None)
              for r, (x, c) in enumerate(zip(rps, cpu, strict=True))]
    return PeerRow(service, store, scenario, workers, connections, rounds, [EXACT_LIMIT] * len(rounds))


def _peers() -> list[PeerRow]:
    return [
        _peer("python", "redis", "under", 1, [2_000, 2_100, 1_900], [400, 410, 390]),
        _peer("front", "redis", "over", 1, [12_000, 12_500, 11_000], [40, 42, 41]),
        _peer("front", "redis", "under", 1, [10_000, 10_400, 9_800], [60, 61, 59]),
        _peer("reference", "redis", "over", 1, [11_000, 13_000, 10_500], [45, 44, 46]),
        _peer("reference", "redis", "under", 1, [8_000, 8_200, 7_900], [80, 79, 82]),
        _peer("front", "redis", "under", 4, [15_000, 15_500, 14_000], [55, 56, 54], workers=2),
        _peer("front-same", "redis", "under", 1, [10_500, 10_900, 10_100], [58, 59, 57]),
        PeerRow("front-same", "memory", "under", 1, 1, missing="compiled front door skipped: " + "not built; " * 20),
        PeerRow("floor", "none", "under", 1, 1, _peer("floor", "none", "under", 1, [16_000, 16_400, 15_800],
                                                     [20, 21, 19]).rounds),
    ]


def synthetic_report(peers: bool = True) -> GatewayReport:
    """Every variant but ``nginx-ratewarden`` (missing, with a long reason), capacity, the peer rows."""
    opts = GatewayOptions(rounds=ROUNDS, warmup=1, requests=PER_KEY * 3, limits=LIMITS, peers=peers,
                          peer_rounds=ROUNDS, peer_requests=20_000)
    from dataclasses import asdict

    options = asdict(opts) | {"variants": list(VARIANTS), "limits": dict(LIMITS)}
    report = GatewayReport(options, "ratewarden serve --workers 1 (memory store)", [_variant(k) for k in VARIANTS],
                           _capacity(), [], peers=_peers() if peers else [], peer_notes=["ghz: v0.120.0"])
    report.targets = targets(report) + peer_targets(report.peers)
    report.meta = {"command": "ratewarden bench --gateway", "seconds": 300.0,
                   "load": "load average (1/5/15 min) 0.50/0.40/0.30 at the start, 1.20/0.60/0.40 at the end, "
                           "on 2 cores"}
    return report
