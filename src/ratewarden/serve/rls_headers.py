"""The headers of an Envoy rate limit answer (``serve.rls``): ratewarden's (``headers.rate_limit_headers``
and ``retry_after_header``, as ``/check`` writes them, as text) or envoyproxy/ratelimit's three
(``RateLimit-Limit``, ``RateLimit-Remaining``, ``RateLimit-Reset``, its ``LIMIT_RESPONSE_HEADERS_ENABLED``)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Protocol

from ..caches import remember
from ..decision import Decision
from ..headers import policy_value, rate_limit_headers, retry_after_header
from ..limits import Limit
from .envoy_config import UNIT_SECONDS
from .rls_messages import UINT32_MAX, DescriptorStatus

__all__ = ["HEADER_STYLES", "QuotaFlagged", "copy_decision", "ratewarden_headers", "reference_headers", "window_left"]

#: ``RateLimitService(headers=...)``: ratewarden's five (both styles), envoyproxy/ratelimit's three,
#: or none (envoyproxy/ratelimit's default).
HEADER_STYLES = ("ratewarden", "reference", "none")
#: envoyproxy/ratelimit's header names (its ``LIMIT_*_HEADER`` defaults).
_REFERENCE_NAMES = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")


class QuotaFlagged(Protocol):
    """What decided a status: whether its limit is a ``quota_mode`` one."""

    quota: bool


def ratewarden_headers(
    decision: Decision, label: str, policies: tuple[Limit | tuple[str, int], ...], over: bool,
    cache: dict[tuple[Limit | tuple[str, int], ...], bytes],
) -> list[tuple[str, str]]:
    """``headers.rate_limit_headers`` (both styles) of ``decision``, as text, listing ``policies`` in
    ``RateLimit-Policy`` (a limit of 0 as ``(name, period)``: ``q=0``); ``Retry-After`` when the
    request is ``over`` and can fit later.

    Args:
        decision: The decision of the limit closest to it.
        label: That limit's name.
        policies: Every enforced limit of the answer.
        over: Whether the request is refused.
        cache: The ``RateLimit-Policy`` values already written, by ``policies``.
    """
    policy = cache.get(policies)
    if policy is None:
        policy = b", ".join(
            policy_value((item,)) if isinstance(item, Limit) else b'"%s";q=0;w=%d' % (item[0].encode("latin-1", "replace"), item[1])
            for item in policies
        )
        remember(cache, policies, policy, 1024)
    if decision.policy != label:  # a decision read for several counters names the one it is for
        decision = copy_decision(decision, decision.allowed, policy=label)
    written = rate_limit_headers(decision, "both", policy)
    if over and not decision.allowed:
        retry = retry_after_header(decision)
        if retry is not None:
            written.append(retry)
    return _text(written)


def copy_decision(decision: Decision, allowed: bool, retry_after: float | None = None, policy: str | None = None) -> Decision:
    """A new decision like ``decision`` (a store's decisions are never changed in place).

    Args:
        decision: The decision copied.
        allowed: The copy's verdict.
        retry_after: The copy's ``retry_after`` (``None``: the same).
        policy: The copy's limit name (``None``: the same).
    """
    retry = decision.retry_after if retry_after is None else retry_after
    return Decision(
        allowed, decision.limit, decision.remaining, decision.reset_after, retry, decision.period,
        decision.policy if policy is None else policy,
    )


def reference_headers(statuses: Sequence[DescriptorStatus], plans: Sequence[QuotaFlagged]) -> list[tuple[str, str]]:
    """envoyproxy/ratelimit's headers: ``RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (seconds to
    the end of the unit's window) of the status with a limit closest to it (the first of the least
    remaining), or of the last one over its limit that is not a quota; shadow, quota and zero limits
    included.

    Args:
        statuses: The answer's statuses.
        plans: What decided each, ``plans[i]`` for ``statuses[i]``.
    """
    chosen: DescriptorStatus | None = None
    least = UINT32_MAX
    for status, plan in zip(statuses, plans, strict=True):
        if status.current_limit is None:
            continue
        if status.limit_remaining < least:
            chosen, least = status, status.limit_remaining
        if status.code == "OVER_LIMIT" and not plan.quota:
            chosen, least = status, 0
    if chosen is None or chosen.current_limit is None:
        return []
    period = UNIT_SECONDS[chosen.current_limit.unit]
    limit_name, remaining_name, reset_name = _REFERENCE_NAMES
    return [
        (limit_name, str(chosen.current_limit.requests_per_unit)),
        (remaining_name, str(chosen.limit_remaining)),
        (reset_name, str(period - int(time.time()) % period)),
    ]


def window_left(period: int) -> float:
    """Seconds to the end of the current epoch-aligned window of ``period`` seconds.

    Args:
        period: The window, in seconds.
    """
    return period - math.fmod(time.time(), period)


#: The headers whose value changes with every answer: decoded each time, never remembered.
_CHANGING = {b"ratelimit": "ratelimit", b"x-ratelimit-remaining": "x-ratelimit-remaining"}
_texts: dict[tuple[bytes, bytes], tuple[str, str]] = {}


def _text(written: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The headers as text (latin-1), the ones that repeat from answer to answer (a policy, a limit,
    a reset second) decoded once: what gRPC and JSON carry."""
    out: list[tuple[str, str]] = []
    for pair in written:
        found = _texts.get(pair)
        if found is None:
            name = _CHANGING.get(pair[0])
            if name is not None:
                out.append((name, pair[1].decode("latin-1")))
                continue
            found = (pair[0].decode("latin-1"), pair[1].decode("latin-1"))
            remember(_texts, pair, found, 4096, 4 << 20)
        out.append(found)
    return out
