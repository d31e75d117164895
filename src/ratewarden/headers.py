"""Rate-limit response headers: IETF draft-ietf-httpapi-ratelimit-headers-10 and legacy ``X-RateLimit-*``.

``RateLimit-Policy: "name";q=100;w=60`` states the quota; ``RateLimit: "name";r=42;t=17`` the
remaining quota and seconds until it resets. Legacy headers give limit, remaining and seconds to
reset. ``Retry-After`` (whole seconds, at least 1) goes on 429 and 503 answers only.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Sequence
from typing import Literal

from ._mypyc import mypyc_attr
from .decision import Decision
from .limits import Limit
from .types import Message, Send

__all__ = [
    "HeaderMode",
    "HeaderStyle",
    "SendWithRateHeaders",
    "add_rate_limit_headers",
    "policy_value",
    "rate_limit_headers",
    "retry_after_header",
]

HeaderMode = Literal["always", "on_limit", "off"]
HeaderStyle = Literal["ietf", "legacy", "both"]
Headers = list[tuple[bytes, bytes]]

_Fixed = tuple[bytes, bytes, bytes]  # (RateLimit-Policy value, RateLimit value prefix, limit)
_fixed_cache: dict[tuple[str, int, float], _Fixed] = {}
_by_policy: dict[str, tuple[int, float, _Fixed]] = {}  # the usual hit: one (limit, period) per name


def _fixed_parts(decision: Decision) -> _Fixed:
    """The parts of the headers that depend only on the policy, built once per policy.

    Looked up by the policy's name first (a string keeps its hash: no tuple to build and hash on
    every request), checked against the decision's limit and period; a name shared by limits of
    different sizes falls back to the (name, limit, period) table.
    """
    policy = decision.policy
    named = _by_policy.get(policy)
    if named is not None and named[0] == decision.limit and named[1] == decision.period:
        return named[2]
    cache_key = (policy, decision.limit, decision.period)
    parts = _fixed_cache.get(cache_key)
    if parts is None:
        window = max(1, math.ceil(decision.period))
        name = policy.encode("latin-1", "replace")
        parts = (b'"%s";q=%d;w=%d' % (name, decision.limit, window), b'"%s";' % name, b"%d" % decision.limit)
        if len(_fixed_cache) < 4096:
            _fixed_cache[cache_key] = parts
    if named is None and len(_by_policy) < 4096:
        _by_policy[policy] = (decision.limit, decision.period, parts)
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
    headers: Headers = []
    add_rate_limit_headers(headers, decision, style, policy)
    return headers


def add_rate_limit_headers(
    headers: Headers, decision: Decision, style: HeaderStyle = "both", policy: bytes | None = None
) -> None:
    """Append ``rate_limit_headers(decision, style, policy)`` to ``headers`` (no list of its own).

    Args:
        headers: The list to extend.
        decision: The decision to describe.
        style: Which rate-limit headers: ``"ietf"``, ``"legacy"`` or ``"both"``.
        policy: The ``RateLimit-Policy`` value; ``None`` uses the deciding limit's.
    """
    fixed_policy, prefix, limit = _fixed_parts(decision)
    if policy is None:
        policy = fixed_policy
    reset = b"%d" % math.ceil(decision.reset_after)
    remaining = b"%d" % decision.remaining
    if style == "both" or style == "ietf":
        headers.append((b"ratelimit-policy", policy))
        headers.append((b"ratelimit", b"%sr=%s;t=%s" % (prefix, remaining, reset)))
    if style != "ietf":
        headers.append((b"x-ratelimit-limit", limit))
        headers.append((b"x-ratelimit-remaining", remaining))
        headers.append((b"x-ratelimit-reset", reset))


@mypyc_attr(allow_interpreted_subclasses=True)
class SendWithRateHeaders:
    """An ASGI ``send`` that adds the rate-limit headers of ``decision`` to the response start.

    One small object per allowed request instead of a closure, and no coroutine of its own: calling
    it returns the wrapped ``send``'s awaitable (what ``await send(message)`` awaits).

    Args:
        send: The ASGI ``send`` to wrap.
        decision: The decision the headers describe.
        style: Which rate-limit headers: ``"ietf"``, ``"legacy"`` or ``"both"``.
        policy: The ``RateLimit-Policy`` value (``policy_of``); ``None`` uses the deciding limit's.
    """

    __slots__ = ("decision", "policy", "send", "style")

    def __init__(self, send: Send, decision: Decision, style: HeaderStyle, policy: bytes | None) -> None:
        self.send = send
        self.decision = decision
        self.style: HeaderStyle = style
        self.policy = policy

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            headers: Headers = [*message.get("headers", ())]
            add_rate_limit_headers(headers, self.decision, self.style, self.policy)
            message["headers"] = headers
        return self.send(message)


def retry_after_header(decision: Decision) -> tuple[bytes, bytes] | None:
    """``Retry-After`` in whole seconds (at least 1); ``None`` when the request can never fit.

    Args:
        decision: The denying decision.
    """
    if math.isinf(decision.retry_after):
        return None
    return (b"retry-after", b"%d" % max(1, math.ceil(decision.retry_after)))
