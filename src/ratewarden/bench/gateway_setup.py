"""What a gateway bench run is asked to do (``ratewarden bench --gateway``): the variants it
compares, the servers its capacity rounds measure, the groups of API keys and the run's options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import gateway_procs as gp

__all__ = ["CAPACITY_FLOORS", "CAPACITY_SERVERS", "GROUPS", "VARIANTS", "GatewayOptions", "VariantSpec"]


@dataclass(frozen=True)
class VariantSpec:
    key: str
    title: str
    gateway: str  # haproxy | nginx
    limiter: str  # none | native | ratewarden | floor
    via: str = ""  # how HAProxy asks (ratewarden, floor): lua (httpclient -> HTTP) | spoe
    spoe_front: str = "python"  # the SPOE agent of ``ratewarden serve`` (--spoe-front): python | compiled


VARIANTS: Mapping[str, VariantSpec] = {v.key: v for v in (
    VariantSpec("haproxy", "HAProxy, no limiting", "haproxy", "none"),
    VariantSpec("haproxy-native", "HAProxy stick tables + map file (HAProxy's own limiting)", "haproxy", "native"),
    VariantSpec("haproxy-ratewarden", "HAProxy + ratewarden (Lua httpclient -> /check)", "haproxy", "ratewarden",
                "lua"),
    VariantSpec("haproxy-floor", "HAProxy + the same Lua -> fixed-200 service (floor)", "haproxy", "floor", "lua"),
    VariantSpec("haproxy-spoe", "HAProxy + ratewarden (SPOE)", "haproxy", "ratewarden", "spoe"),
    VariantSpec("haproxy-spoe-compiled", "HAProxy + ratewarden (SPOE, compiled front door)", "haproxy", "ratewarden",
                "spoe", "compiled"),
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
    #: gRPC beside envoyproxy/ratelimit (``gateway_peers``): rounds and ghz calls per cell.
    peers: bool = False
    peer_rounds: int = 3
    peer_requests: int = 20000
