"""Rate-limit response headers: IETF draft-ietf-httpapi-ratelimit-headers-10 and legacy ``X-RateLimit-*``.

``RateLimit-Policy: "name";q=100;w=60`` states the quota; ``RateLimit: "name";r=42;t=17`` the
remaining quota and seconds until it resets. Legacy headers give limit, remaining and seconds to
reset. ``Retry-After`` (whole seconds, at least 1) goes on 429 and 503 answers only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from .decision import Decision
from .limits import Limit

__all__ = ["HeaderMode", "HeaderStyle", "policy_value", "rate_limit_headers", "retry_after_header"]

HeaderMode = Literal["always", "on_limit", "off"]
HeaderStyle = Literal["ietf", "legacy", "both"]
Headers = list[tuple[bytes, bytes]]

_Fixed = tuple[bytes, bytes, bytes]  # (RateLimit-Policy value, RateLimit value prefix, limit)
_fixed_cache: dict[tuple[str, int, float], _Fixed] = {}


def _fixed_parts(decision: Decision) -> _Fixed:
    """The parts of the headers that depend only on the policy, built once per policy."""
    cache_key = (decision.policy, decision.limit, decision.period)
    parts = _fixed_cache.get(cache_key)
    if parts is None:
        window = max(1, math.ceil(decision.period))
        name = decision.policy.encode("latin-1", "replace")
        parts = (b'"%s";q=%d;w=%d' % (name, decision.limit, window), b'"%s";' % name, b"%d" % decision.limit)
        if len(_fixed_cache) < 4096:
            _fixed_cache[cache_key] = parts
    return parts


def policy_value(limits: Sequence[Limit]) -> bytes:
    """The ``RateLimit-Policy`` value listing every limit in ``limits`` (draft-10 allows a list):
    ``"a";q=10;w=1, "b";q=1000;w=86400``. Quota and window are what each limit's algorithm reports
    for a fresh key, so they match the decisions it makes. Built once per rule set, not per request.

    Args:
        limits: Every limit that applies.
    """
    items = []
    for limit in limits:
        probe = limit.fn(None, 0.0, 0.0, limit.rate)[1]
        name = limit.name.encode("latin-1", "replace")
        items.append(b'"%s";q=%d;w=%d' % (name, probe.limit, max(1, math.ceil(probe.period))))
    return b", ".join(items)


def rate_limit_headers(decision: Decision, style: HeaderStyle = "both", policy: bytes | None = None) -> Headers:
    """Headers describing ``decision`` (without ``Retry-After``).

    Args:
        decision: The decision to describe.
        style: Which rate-limit headers: ``"ietf"`` (``RateLimit``/``RateLimit-Policy``), ``"legacy"``
            (``X-RateLimit-*``) or ``"both"``.
        policy: The ``RateLimit-Policy`` value listing every limit that applied (``policy_of``); ``None``
            leaves that header out. (see ``policy_value``)
    """
    fixed_policy, prefix, limit = _fixed_parts(decision)
    if policy is None:
        policy = fixed_policy
    reset = math.ceil(decision.reset_after)
    remaining = decision.remaining
    if style == "both":
        return [
            (b"ratelimit-policy", policy),
            (b"ratelimit", b"%sr=%d;t=%d" % (prefix, remaining, reset)),
            (b"x-ratelimit-limit", limit),
            (b"x-ratelimit-remaining", b"%d" % remaining),
            (b"x-ratelimit-reset", b"%d" % reset),
        ]
    if style == "ietf":
        return [(b"ratelimit-policy", policy), (b"ratelimit", b"%sr=%d;t=%d" % (prefix, remaining, reset))]
    return [
        (b"x-ratelimit-limit", limit),
        (b"x-ratelimit-remaining", b"%d" % remaining),
        (b"x-ratelimit-reset", b"%d" % reset),
    ]


def retry_after_header(decision: Decision) -> tuple[bytes, bytes] | None:
    """``Retry-After`` in whole seconds (at least 1); ``None`` when the request can never fit.

    Args:
        decision: The denying decision.
    """
    if math.isinf(decision.retry_after):
        return None
    return (b"retry-after", b"%d" % max(1, math.ceil(decision.retry_after)))
