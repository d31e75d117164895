"""Scenario definitions: what each benchmark sends, against which limit, and what an exact limiter allows.

The in-process tuples (limit, window, requests, mode, identity) follow the reference documents (the old
traffik-vs-SlowAPI suite); the live ones follow the wrk/HAProxy/ratelimit_bench reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ALGORITHMS",
    "FLOOD_CONNECTIONS",
    "MEASURES",
    "QUICK_FLOOD",
    "QUICK_LIVE",
    "QUICK_SCENARIOS",
    "SCENARIOS",
    "Scenario",
    "Tier",
    "resolve",
]

Mode = Literal["sequential", "batches", "all_at_once", "clients", "ws", "live"]
Integration = Literal["dependency", "middleware", "websocket"]
Identity = Literal["ip", "header", "many"]
Measure = Literal["", "allowed", "mixed", "rejected", "admitted"]

#: What a row of each kind measures: the reports' headings.
MEASURES: dict[str, str] = {
    "allowed": "all allowed: overhead on served requests",
    "mixed": "allowed up to the limit, then rejected (429): served and rejected requests together",
    "rejected": "mostly rejected (429) requests: cost of a rejection",
    "admitted": "admitted against the limit (count first, speed second)",
    "": "requests",
}

#: Connections of the flood scenarios (one client, one uvicorn worker).
FLOOD_CONNECTIONS = 1000

ALGORITHMS = (
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "token_bucket_debt",
    "leaky_bucket",
    "gcra",
)


@dataclass(frozen=True)
class Tier:
    """One API-key group of the tiered scenario: its name, limit and share of the traffic."""

    name: str
    limit: int
    requests: int


@dataclass(frozen=True)
class Scenario:
    """One benchmark configuration, independent of the library under test.

    ``requests`` is per iteration (per client for ``clients`` mode, per connection for WebSocket
    ``connections`` > 1). ``exempt_requests`` go to ``/unthrottled`` after the limited ones.
    ``expected_allowed`` is what an exact limiter allows in one iteration from a clean store (None when
    it depends on the algorithm's parameters or on timing, as in live runs).
    ``workers`` is the number of uvicorn worker processes of a live run; 0 means one per core, at least 2.
    ``measure`` says what the scenario measures (see :data:`MEASURES`); empty: derived from
    ``expected_allowed`` (:attr:`measures`).
    """

    key: str
    group: str
    title: str
    limit: int
    window_s: int
    requests: int
    mode: Mode
    integration: Integration = "dependency"
    concurrency: int = 1
    clients: int = 1
    connections: int = 1
    identity: Identity = "ip"
    path: str = "/test"
    method: str = "GET"
    body: bytes = b""
    content_type: str = ""
    exempt_requests: int = 0
    algorithm: str = "fixed_window"
    headers: str = ""
    rules: str = ""
    tiers: tuple[Tier, ...] = ()
    expected_allowed: int | None = None
    duration_s: float = 0.0
    workers: int = 1
    measure: Measure = ""
    tags: tuple[str, ...] = field(default=())

    @property
    def measures(self) -> Measure:
        """What the scenario's rows measure: all allowed, mostly rejected, mixed, or admitted counts."""
        if self.measure:
            return self.measure
        total = self.total_requests
        if self.expected_allowed is None or not total:
            return ""
        if self.expected_allowed >= total:
            return "allowed"
        return "rejected" if self.expected_allowed <= total // 4 else "mixed"

    @property
    def total_requests(self) -> int:
        per = self.requests * max(self.clients, 1) * max(self.connections, 1)
        return per + self.exempt_requests + sum(t.requests for t in self.tiers)

    @property
    def rate(self) -> str:
        """The limit as ``"<limit>/<window>s"`` (every library here accepts this form or is given the parts)."""
        return f"{self.limit}/{self.window_s}s"


def _json_body(items: int) -> bytes:
    rows = ",".join(f'{{"id":{i},"name":"item-{i}","price":{i}.5,"tags":["a","b"]}}' for i in range(items))
    return f'{{"items":[{rows}]}}'.encode()


def _http(prefix: str, integration: Integration, group: str) -> list[Scenario]:
    return [
        Scenario(f"{prefix}.low", group, "Low load (50 req, within limit)", 100, 60, 50, "sequential",
                 integration, expected_allowed=50),
        Scenario(f"{prefix}.high", group, "High load (200 req, over limit)", 100, 60, 200, "sequential",
                 integration, expected_allowed=100),
        Scenario(f"{prefix}.sustained", group, "Sustained load (500 req, 50 concurrent)", 1000, 60, 500,
                 "batches", integration, concurrency=50, expected_allowed=500),
        Scenario(f"{prefix}.burst", group, "Burst (100 req, 2x limit)", 50, 60, 100, "sequential",
                 integration, expected_allowed=50),
    ]


def _correctness() -> list[Scenario]:
    return [
        Scenario("race", "correctness", "Race: 150 concurrent vs limit 100", 100, 60, 150, "all_at_once",
                 expected_allowed=100),
        Scenario("distributed", "correctness", "Distributed: 10 clients x 120 vs 100 each", 100, 60, 120,
                 "clients", clients=10, identity="header", expected_allowed=1000),
    ]


def _websocket() -> list[Scenario]:
    return [
        Scenario("ws.low", "websocket", "Low load (50 msg, within limit)", 100, 60, 50, "ws", "websocket",
                 expected_allowed=50),
        Scenario("ws.high", "websocket", "High load (200 msg, over limit)", 100, 60, 200, "ws", "websocket",
                 expected_allowed=100),
        Scenario("ws.sustained", "websocket", "Sustained (500 msg, 1000/min limit)", 1000, 60, 500, "ws",
                 "websocket", expected_allowed=500),
        Scenario("ws.burst", "websocket", "Burst (100 msg, 50/min limit)", 50, 60, 100, "ws", "websocket",
                 expected_allowed=50),
        Scenario("ws.concurrent", "websocket", "10 concurrent connections (15 msg each, one client)", 100, 60, 15, "ws",
                 "websocket", connections=10, expected_allowed=100),
    ]


def _variants() -> list[Scenario]:
    """The same load under each algorithm, each header setting and each shape of rules."""
    s: list[Scenario] = []
    for algo in ALGORITHMS:
        s.append(Scenario(f"strategy.{algo}", "strategy", algo, 100, 60, 200, "sequential", algorithm=algo,
                          expected_allowed=None if algo == "gcra" else 100, measure="mixed"))
    for variant, title in (
        ("none", "No headers (baseline)"),
        ("always", "Rate-limit headers on every response"),
        ("throttled", "Headers only on 429"),
    ):
        s.append(Scenario(f"headers.{variant}", "headers", title, 1000, 60, 500, "batches", "middleware",
                          concurrency=50, headers=variant, expected_allowed=500))
    for variant, title in (
        ("none", "No rules (baseline: one catch-all rule)"),
        ("single", "Single rule (exact path)"),
        ("wildcard", "Rule with * single-segment wildcard"),
        ("deep", "Rule with ** deep wildcard"),
        ("bypass", "Bypass rule + rule"),
        ("many", "10 mixed rules"),
        ("regex", "Compiled regex rule"),
    ):
        s.append(Scenario(f"rules.{variant}", "rules", title, 1000, 60, 500, "batches", "middleware",
                          concurrency=50, rules=variant, path="/api/v1/items/7", expected_allowed=500))
    return s


def _workloads() -> list[Scenario]:
    """Handlers, bodies, paths and keys of different weights, and the tiered API keys."""
    return [
        Scenario("workload.light", "workload", "Light (small JSON response)", 1000, 60, 500, "batches",
                 concurrency=50, expected_allowed=500),
        Scenario("workload.heavy", "workload", "Heavy (CPU-bound handler, 100k sqrt)", 1000, 60, 100,
                 "batches", concurrency=10, path="/heavy", expected_allowed=100),
        Scenario("workload.json-small", "workload", "JSON body small (~90 B)", 1000, 60, 300, "batches",
                 concurrency=50, path="/json", method="POST", body=_json_body(1),
                 content_type="application/json", expected_allowed=300),
        Scenario("workload.json-medium", "workload", "JSON body medium (~1.5 KB)", 1000, 60, 300, "batches",
                 concurrency=50, path="/json", method="POST", body=_json_body(20),
                 content_type="application/json", expected_allowed=300),
        Scenario("workload.json-large", "workload", "JSON body large (~15 KB)", 1000, 60, 300, "batches",
                 concurrency=50, path="/json", method="POST", body=_json_body(200),
                 content_type="application/json", expected_allowed=300),
        Scenario("workload.path", "workload", "Path parameters (/items/{id}/{sub})", 1000, 60, 500, "batches",
                 concurrency=50, path="/items/42/reviews", expected_allowed=500),
        Scenario("workload.query", "workload", "Query parameters (8 params)", 1000, 60, 500, "batches",
                 concurrency=50, path="/search?q=shoes&page=2&size=20&sort=price&order=asc&brand=x&min=1&max=9",
                 expected_allowed=500),
        Scenario("workload.form", "workload", "URL-encoded form (5 fields)", 1000, 60, 300, "batches",
                 concurrency=50, path="/form", method="POST", body=b"a=1&b=two&c=3.5&d=four&e=five",
                 content_type="application/x-www-form-urlencoded", expected_allowed=300),
        Scenario("keys.many", "workload", "Many keys (1000 distinct clients)", 100, 60, 1000, "batches",
                 concurrency=50, identity="many", expected_allowed=1000),
        Scenario("keys.hot", "workload", "One hot key (1000 req vs 100)", 100, 60, 1000, "batches",
                 concurrency=50, identity="header", expected_allowed=100),
        Scenario("tiered", "tiered", "Tiered API keys (premium 1000, standard 100, basic 20 per min)", 0, 60, 0,
                 "batches", concurrency=15, path="/tiered",
                 tiers=(Tier("premium", 1000, 40), Tier("standard", 100, 40), Tier("basic", 20, 40)),
                 expected_allowed=100),
    ]


def _live() -> list[Scenario]:
    """Live runs (uvicorn + wrk). limit/window as in ratelimit_bench: 100 per 60 s, one hot key."""
    return [
        Scenario("live.light", "live", "Light, one hot key (100/min, wrk)", 100, 60, 0, "live",
                 identity="header", duration_s=10, concurrency=50, measure="rejected"),
        Scenario("live.heavy", "live", "Heavy handler, one hot key (100/min, wrk)", 100, 60, 0, "live",
                 identity="header", path="/heavy", duration_s=10, concurrency=50, measure="rejected"),
        Scenario("live.many-keys", "live", "Light, 10k distinct keys (100/min, wrk)", 100, 60, 0, "live",
                 identity="many", duration_s=10, concurrency=50, measure="allowed"),
        Scenario("live.allowed", "live", "Light, all allowed (10^9/min, wrk)", 1_000_000_000, 60, 0, "live",
                 identity="header", duration_s=10, concurrency=50, measure="allowed"),
        Scenario("live.middleware", "live", "Middleware, one hot key (100/min, wrk)", 100, 60, 0, "live",
                 "middleware", identity="header", duration_s=10, concurrency=50, measure="rejected"),
        # Several uvicorn workers on one host: does the limit hold across processes? A fresh hot key
        # per iteration, so an exact limiter allows exactly `limit` in each run of a few seconds.
        Scenario("live.workers", "workers", "uvicorn --workers N, one hot key (100/min, wrk)", 100, 60, 0,
                 "live", identity="header", duration_s=10, concurrency=50, workers=0, measure="admitted"),
    ]


def _floods() -> list[Scenario]:
    """The flood: 1,000 connections from one client IP against one uvicorn worker,
    100/hour fixed window per client IP, on the shared stores (Redis, Memcached) and memory. What it
    checks is the admitted count: an exact limiter admits 100 and no more, however fast it answers
    the rest."""
    floods: tuple[tuple[Integration, str], ...] = (("middleware", "middleware"), ("dependency", "dependency / edge"))
    return [
        Scenario(f"flood.{integration}", "flood",
                 f"Flood: {FLOOD_CONNECTIONS:,} connections, one client IP vs 100/hour ({how})", 100, 3600,
                 0, "live", integration, identity="ip", duration_s=3, concurrency=FLOOD_CONNECTIONS,
                 measure="admitted")
        for integration, how in floods
    ]


def _build() -> dict[str, Scenario]:
    """Every scenario by key, in report order: the reference reports' tables, group after group."""
    selective = Scenario("mw.selective", "middleware", "Selective throttling (mixed paths)", 50, 60, 100,
                         "sequential", "middleware", exempt_requests=100, expected_allowed=150)
    s = [
        *_http("http", "dependency", "dependency"),
        *_http("mw", "middleware", "middleware"),
        selective,
        *_correctness(),
        *_websocket(),
        *_variants(),
        *_workloads(),
        *_live(),
        *_floods(),
    ]
    return {x.key: x for x in s}


SCENARIOS: dict[str, Scenario] = _build()

QUICK_SCENARIOS = (
    "http.low", "http.high", "http.sustained", "http.burst",
    "mw.low", "mw.high", "mw.sustained", "mw.burst", "mw.selective",
    "race", "distributed", "keys.many",
)
# The usual production case (every request served) and the flooded hot key (nearly every request a 429):
# their ratios to no limiter answer different questions, and the reports head them apart.
QUICK_LIVE = ("live.allowed", "live.light")
# One short flood (2 s iterations, on the first shared store available): about a minute more.
QUICK_FLOOD = ("flood.middleware",)


def resolve(names: list[str]) -> list[Scenario]:
    """Scenarios for ``names``: exact keys, group names (``dependency``, ``websocket``...) or ``all``.

    Raises ``KeyError`` naming the first unknown name.
    """
    out: dict[str, Scenario] = {}
    groups = {s.group for s in SCENARIOS.values()}
    for name in names:
        if name == "all":
            out.update(SCENARIOS)
        elif name in SCENARIOS:
            out[name] = SCENARIOS[name]
        elif name in groups:
            out.update({k: v for k, v in SCENARIOS.items() if v.group == name})
        elif any(k.startswith(name + ".") for k in SCENARIOS):
            out.update({k: v for k, v in SCENARIOS.items() if k.startswith(name + ".")})
        else:
            raise KeyError(name)
    return list(out.values())
