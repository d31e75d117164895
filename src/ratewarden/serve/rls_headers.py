"""The header styles of an Envoy rate limit answer (``serve.rls``): ratewarden's, written by the one
header writer every door uses (``enforcement.answers.text_headers``), envoyproxy/ratelimit's three
(``RateLimit-Limit``, ``RateLimit-Remaining``, ``RateLimit-Reset``, its ``LIMIT_RESPONSE_HEADERS_ENABLED``:
``reference_headers``), or none."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..enforcement.charge_strategies import QUOTA, Item
from .envoy_config import UNIT_SECONDS
from .rls_messages import UINT32_MAX, DescriptorStatus

__all__ = ["HEADER_STYLES", "reference_headers"]

#: ``RateLimitService(headers=...)``: ratewarden's five (both styles), envoyproxy/ratelimit's three,
#: or none (envoyproxy/ratelimit's default).
HEADER_STYLES = ("ratewarden", "reference", "none")
#: envoyproxy/ratelimit's header names (its ``LIMIT_*_HEADER`` defaults).
_REFERENCE_NAMES = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")


def reference_headers(statuses: Sequence[DescriptorStatus], items: Sequence[Item]) -> list[tuple[str, str]]:
    """envoyproxy/ratelimit's headers: ``RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (seconds to
    the end of the unit's window) of the status with a limit closest to it (the first of the least
    remaining), or of the last one over its limit that is not a quota; shadow, quota and zero limits
    included.

    Args:
        statuses: The answer's statuses.
        items: What decided each, ``items[i]`` for ``statuses[i]``.
    """
    chosen: DescriptorStatus | None = None
    least = UINT32_MAX
    for status, item in zip(statuses, items, strict=True):
        if status.current_limit is None:
            continue
        if status.limit_remaining < least:
            chosen, least = status, status.limit_remaining
        if status.code == "OVER_LIMIT" and item.kind != QUOTA:
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
