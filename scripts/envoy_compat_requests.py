"""The requests scripts/envoy_compat.py sends to envoyproxy/ratelimit and to ``ratewarden serve``, built
from a configuration's descriptors, and the answers that differ on purpose (``KEPT``)."""

# ruff: noqa
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import wrappers_pb2

Unit = rls_pb2.RateLimitResponse.RateLimit.Unit

#: The sequences whose answers differ on purpose: ratewarden's INVALID_ARGUMENT, with the reason, where the
#: reference answers UNKNOWN or OK (docs/gateways/envoy.md, "Compatibility with envoyproxy/ratelimit").
KEPT: dict[str, str] = {
    "empty domain": "INVALID_ARGUMENT, not UNKNOWN: the request is at fault, not the service",
    "no descriptors": "INVALID_ARGUMENT, not UNKNOWN: the request is at fault, not the service",
    "an entry with an empty key": "INVALID_ARGUMENT, not OK: a caller that sends it has a bug worth seeing",
    "a descriptor with no entries": "INVALID_ARGUMENT, not OK: a caller that sends it has a bug worth seeing",
}


@dataclass
class Node:
    """A descriptor of a configuration, with the entries of a request that reaches it."""

    entries: list[tuple[str, str]]
    requests_per_unit: int | None  # None: no rate_limit, or unlimited
    unit: str
    unlimited: bool = False
    shadow: bool = False
    quota: bool = False
    literal: list[tuple[str, str]] = field(default_factory=list)  # the values as written, when one has a '*'


def walk(descriptors: list[dict[str, Any]] | None, prefix: list[tuple[str, str]], out: list[Node],
         literal: list[tuple[str, str]] | None = None) -> None:
    for d in descriptors or []:
        value = str(d.get("value", "") or "")
        instance = value.replace("*", "x1") if value else f"v{len(out)}"
        entries = [*prefix, (str(d["key"]), instance)]
        written = [*(literal or prefix), (str(d["key"]), value or instance)]
        rl = d.get("rate_limit") or {}
        unlimited = bool(rl.get("unlimited", False))
        rpu = None if (not rl or unlimited) else int(rl.get("requests_per_unit", 0))
        out.append(Node(entries, rpu, str(rl.get("unit", "")).lower(), unlimited,
                        bool(d.get("shadow_mode", False)), bool(d.get("quota_mode", False)),
                        written if written != entries else []))
        walk(d.get("descriptors"), entries, out, written)


def desc(entries: list[tuple[str, str]], limit: tuple[int, str] | None = None, hits: int | None = None) -> Any:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if limit is not None:
        d.limit.requests_per_unit = limit[0]
        d.limit.unit = Unit.Value(limit[1].upper())
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


@dataclass
class Sequence:
    """Requests sent in order after a flush; ``what`` names what it exercises."""

    what: str
    requests: list[Any]
    per_second: bool = False


def req(domain: str, descriptors: list[Any], hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


def sequences(domain: str, nodes: list[Node]) -> list[Sequence]:
    out: list[Sequence] = []
    limited = [n for n in nodes if n.requests_per_unit is not None]
    for n in nodes:
        name = "/".join(f"{k}={v}" for k, v in n.entries)
        d = [desc(n.entries)]
        sec = n.unit == "second"
        if n.literal:  # a value with a '*', sent as written: a wildcard's pattern, or a literal '*'
            written = "/".join(f"{k}={v}" for k, v in n.literal)
            out.append(Sequence(f"single {written} (the value as written)", [req(domain, [desc(n.literal)])], sec))
        if n.requests_per_unit is None:
            out.append(Sequence(f"single {name} ({'unlimited' if n.unlimited else 'no limit'})", [req(domain, d)]))
            continue
        rpu = n.requests_per_unit
        kind = "shadow " if n.shadow else "quota " if n.quota else ""
        if rpu == 0:
            out.append(Sequence(f"single {kind}{name} (0/{n.unit})", [req(domain, d), req(domain, d)], sec))
            continue
        steps = [1] + ([rpu - 1] if rpu > 1 else []) + [1]
        out.append(Sequence(f"single {kind}{name} ({rpu}/{n.unit}) up to and over", [req(domain, d, h) for h in steps], sec))
        out.append(Sequence(f"single {kind}{name} ({rpu}/{n.unit}) cost over what is left, then 1",
                            [req(domain, d, rpu + 1), req(domain, d, 1)], sec))
    for a, b in zip(limited, limited[1:]):
        assert a.requests_per_unit is not None
        pair = [desc(a.entries), desc(b.entries)]
        an = "/".join(f"{k}={v}" for k, v in a.entries)
        bn = "/".join(f"{k}={v}" for k, v in b.entries)
        sec = "second" in (a.unit, b.unit)
        out.append(Sequence(
            f"pair {an} + {bn}: the first to its limit, over, then the second alone",
            [req(domain, pair, max(1, a.requests_per_unit)), req(domain, pair, 1), req(domain, [desc(b.entries)], 1)],
            sec,
        ))
    if limited:
        n = limited[0]
        over = [desc(n.entries, limit=(3, "minute"))]
        out.append(Sequence(f"override 3/minute on {n.entries}", [req(domain, over, 3), req(domain, over, 1)]))
        out.append(Sequence(f"per-descriptor hits_addend 0 on {n.entries}", [req(domain, [desc(n.entries, hits=0)])],
                            n.unit == "second"))
    return out


def malformed(domain: str) -> list[Sequence]:
    return [
        Sequence("unknown domain", [req("no-such-domain", [desc([("k", "v")])])]),
        Sequence("empty domain", [req("", [desc([("k", "v")])])]),
        Sequence("no descriptors", [req(domain, [])]),
        Sequence("an entry with an empty key", [req(domain, [desc([("", "v")])])]),
        Sequence("a descriptor with no entries", [req(domain, [desc([])])]),
    ]
