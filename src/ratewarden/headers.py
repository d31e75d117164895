"""Rate-limit response headers: IETF draft-ietf-httpapi-ratelimit-headers-10 and legacy ``X-RateLimit-*``.

``RateLimit-Policy: "name";q=100;w=60`` states the quota; ``RateLimit: "name";r=42;t=17`` the
remaining quota and seconds until it resets. Legacy headers give limit, remaining and seconds to
reset. ``Retry-After`` (whole seconds, at least 1) goes on 429 and 503 answers only.
"""

from __future__ import annotations

import math
from typing import Literal

from .decision import Decision

__all__ = ["HeaderMode", "HeaderStyle", "rate_limit_headers", "retry_after_header"]

HeaderMode = Literal["always", "on_limit", "off"]
HeaderStyle = Literal["ietf", "legacy", "both"]
Headers = list[tuple[bytes, bytes]]

_policy_cache: dict[tuple[str, int, float], bytes] = {}


def _policy_value(decision: Decision) -> bytes:
    cache_key = (decision.policy, decision.limit, decision.period)
    value = _policy_cache.get(cache_key)
    if value is None:
        window = max(1, math.ceil(decision.period))
        value = f'"{decision.policy}";q={decision.limit};w={window}'.encode("latin-1", "replace")
        if len(_policy_cache) < 4096:
            _policy_cache[cache_key] = value
    return value


def rate_limit_headers(decision: Decision, style: HeaderStyle = "both") -> Headers:
    """Headers describing ``decision`` (without ``Retry-After``)."""
    reset = b"%d" % math.ceil(decision.reset_after)
    remaining = b"%d" % decision.remaining
    out: Headers = []
    if style != "legacy":
        out.append((b"ratelimit-policy", _policy_value(decision)))
        out.append(
            (b"ratelimit", b'"%s";r=%s;t=%s' % (decision.policy.encode("latin-1", "replace"), remaining, reset))
        )
    if style != "ietf":
        out.append((b"x-ratelimit-limit", b"%d" % decision.limit))
        out.append((b"x-ratelimit-remaining", remaining))
        out.append((b"x-ratelimit-reset", reset))
    return out


def retry_after_header(decision: Decision) -> tuple[bytes, bytes] | None:
    """``Retry-After`` in whole seconds (at least 1); ``None`` when the request can never fit."""
    if math.isinf(decision.retry_after):
        return None
    return (b"retry-after", b"%d" % max(1, math.ceil(decision.retry_after)))
