"""Rate-limit response headers: IETF draft-ietf-httpapi-ratelimit-headers-10 and legacy ``X-RateLimit-*``.

``RateLimit-Policy: "name";q=100;w=60`` states the quota; ``RateLimit: "name";r=42;t=17`` the
remaining quota and the seconds until more quota is made available (draft-10's ``t``,
``reset_seconds``). Legacy headers give limit, remaining and that same ``t``. ``Retry-After`` (whole
seconds, at least 1) goes on 429 and 503 answers only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Literal

from ._mypyc import mypyc_attr
from .decision import Decision
from .limits import Limit

__all__ = [
    "HeaderMode",
    "HeaderStyle",
    "add_rate_limit_headers",
    "policy_value",
    "rate_limit_headers",
    "reset_seconds",
    "retry_after_header",
]

HeaderMode = Literal["always", "on_limit", "off"]
HeaderStyle = Literal["ietf", "legacy", "both"]
Headers = list[tuple[bytes, bytes]]

_CACHE_LIMIT = 4096


# The header tuples kept below are typed ``tuple[bytes, ...]``: compiled, a ``tuple[bytes, bytes]``
# would be unpacked into a C struct and packed into a new tuple for every list it joins.
_Header = tuple[bytes, ...]


@mypyc_attr(allow_interpreted_subclasses=True)
class _Reset:
    """A number of seconds to reset, with its text and its ``X-RateLimit-Reset`` header."""

    __slots__ = ("header", "seconds", "suffix", "text")

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.text = b"%d" % seconds
        self.suffix = b";t=" + self.text  # ends the RateLimit value
        self.header: _Header = (b"x-ratelimit-reset", self.text)


@mypyc_attr(allow_interpreted_subclasses=True)
class _Parts:
    """The parts of one policy's headers that do not change from request to request, built once,
    with the last reset and ``RateLimit-Policy`` headers built from them (a window's reset changes
    once a second, and the policy value given is the same rule's every time).

    Each memo is one attribute replaced whole, so threads never see half of one.
    """

    __slots__ = ("given", "limit", "limit_header", "period", "policy_header", "prefix", "reset")

    def __init__(self, policy: str, limit: int, period: float) -> None:
        self.limit = limit
        self.period = period
        name = policy.encode("latin-1", "replace")
        window = max(1, math.ceil(period))
        self.policy_header: _Header = (b"ratelimit-policy", b'"%s";q=%d;w=%d' % (name, limit, window))
        self.prefix = b'"%s";r=' % name
        self.limit_header: _Header = (b"x-ratelimit-limit", b"%d" % limit)
        self.given: _Header = self.policy_header  # the last RateLimit-Policy header of a given value
        self.reset = _Reset(0)

    def policy_for(self, policy: bytes | None) -> _Header:
        """The ``RateLimit-Policy`` header: ``policy``, or this policy's own value for ``None``."""
        if policy is None:
            return self.policy_header
        given = self.given
        if given[1] is policy or given[1] == policy:
            return given
        given = (b"ratelimit-policy", policy)
        self.given = given
        return given

    def reset_for(self, seconds: int) -> _Reset:
        """``seconds`` with its text and header."""
        reset = self.reset
        if reset.seconds != seconds:
            reset = _Reset(seconds)
            self.reset = reset
        return reset


_by_policy: Final[dict[str, _Parts]] = {}  # the usual hit: one (limit, period) per policy name
_by_limit: Final[dict[tuple[str, int, float], _Parts]] = {}  # a name shared by limits of other sizes


def _parts(decision: Decision) -> _Parts:
    """The header parts of the decision's policy.

    Looked up by the policy's name first (a string keeps its hash: no tuple to build and hash on
    every request), checked against the decision's limit and period; a name shared by limits of
    different sizes falls back to the (name, limit, period) table.
    """
    policy = decision.policy
    parts = _by_policy.get(policy)
    if parts is not None and parts.limit == decision.limit and parts.period == decision.period:
        return parts
    cache_key = (policy, decision.limit, decision.period)
    found = _by_limit.get(cache_key)
    if found is None:
        found = _Parts(policy, decision.limit, decision.period)
        if len(_by_limit) < _CACHE_LIMIT:
            _by_limit[cache_key] = found
    if parts is None and len(_by_policy) < _CACHE_LIMIT:
        _by_policy[policy] = found
    return found


def reset_seconds(decision: Decision) -> int:
    """The ``t`` of ``RateLimit`` (and ``X-RateLimit-Reset``): whole seconds until more quota is made
    available, as draft-ietf-httpapi-ratelimit-headers-10 defines it, not until all of it is.

    A denial's is its ``Retry-After``: when a request of the same cost fits again. Otherwise it is
    ``reset_after`` when that is within one period (a fixed window's boundary, a sliding log's or a
    bucket's full restore); a longer ``reset_after`` (a sliding window's current count fades over the
    next window; a bucket holds more than one period's refill) is folded into the period: by then
    some quota has come back, and ``t`` is at most the ``w`` of ``RateLimit-Policy``.

    Args:
        decision: The decision to describe.
    """
    retry = decision.retry_after
    if not decision.allowed and not math.isinf(retry):
        return max(1, math.ceil(retry))
    seconds = decision.reset_after
    period = decision.period
    if period > 0.0 and seconds > period:
        seconds = math.fmod(seconds, period) or period
    return max(0, math.ceil(seconds))


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
    parts = _parts(decision)
    reset = parts.reset_for(reset_seconds(decision))
    remaining = b"%d" % decision.remaining
    out: list[Any] = headers  # the kept header tuples join it as they are
    if style == "both" or style == "ietf":
        out.append(parts.policy_for(policy))
        out.append((b"ratelimit", parts.prefix + remaining + reset.suffix))
    if style != "ietf":
        out.append(parts.limit_header)
        out.append((b"x-ratelimit-remaining", remaining))
        out.append(reset.header)


def retry_after_header(decision: Decision) -> tuple[bytes, bytes] | None:
    """``Retry-After`` in whole seconds (at least 1); ``None`` when the request can never fit.

    Args:
        decision: The denying decision.
    """
    if math.isinf(decision.retry_after):
        return None
    return (b"retry-after", b"%d" % max(1, math.ceil(decision.retry_after)))
