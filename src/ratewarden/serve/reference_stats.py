"""envoyproxy/ratelimit's rate limit statistics, computed as it computes them:

- ``stat_key``: the key its counters are named by for a request descriptor (its ``GetLimit``): the
  matched limit's path in the configuration (``domain.key_value.key``), the request's entries with
  ``detailed_metric`` (the wildcard pattern for a ``share_threshold`` entry), the request's value at a
  ``value_to_metric`` level, ``domain.key_value...`` of the request for a ``limit`` override; then its
  ``SanitizeStatName`` (``:`` and ``|`` to ``_``, the dots of an IPv4 address to ``_``);
- ``labels``: the Prometheus labels its default statsd-exporter mapping gives that key
  (``domain``, ``key1``, and ``key2`` from the third part on);
- ``increments``: what one descriptor's answer adds to ``total_hits``, ``over_limit``, ``near_limit``,
  ``within_limit`` and ``shadow_mode`` (its ``base_limiter.go``), from the count before and after the
  request's hits and ``NEAR_LIMIT_RATIO`` (rounded as its float32 arithmetic rounds it).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence

from .descriptors import wildcard_match
from .envoy_config import EnvoyDescriptor, EnvoyDomain

__all__ = ["STATS", "increments", "labels", "near_threshold", "sanitize", "stat_key"]

#: The per-descriptor counters of the reference's Prometheus mapping, in its order.
STATS = ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode")

_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
_MAPPED = re.compile(r"([^.]*)\.([^.]*)\.([^.]*)(\..*)?")


def sanitize(key: str) -> str:
    """The reference's ``SanitizeStatName``.

    Args:
        key: A stats key.
    """
    key = key.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda found: found.group(0).replace(".", "_"), key)


def labels(key: str) -> tuple[str, ...] | None:
    """``(domain, key1)`` or ``(domain, key1, key2)``: the labels the reference's default mapping
    (``default_mapper.yaml``) gives the counters of the sanitized ``key``; ``None`` when it maps none.

    Args:
        key: A sanitized stats key.
    """
    parts = key.split(".")
    if len(parts) == 2:  # the glob mapping ratelimit.service.rate_limit.*.*.<stat>
        return parts[0], parts[1]
    found = _MAPPED.fullmatch(key)
    return (found.group(1), found.group(2), found.group(3)) if found else None


def _entry(key: str, value: str) -> str:
    return f"{key}_{value}" if value else key


def stat_key(config: EnvoyDomain, domain: str, entries: Sequence[tuple[str, str]], override: bool) -> str:
    """The reference's stats key for a request descriptor whose limit applies (sanitized); ``""``
    when none applies.

    Args:
        config: The domain's configuration.
        domain: The request's domain.
        entries: The descriptor's entries.
        override: Whether the descriptor carries a ``limit`` override.
    """
    if override:
        return sanitize(domain + "." + ".".join(_entry(k, v) for k, v in entries))
    children, previous = config.root.children, config.root
    detailed, valued = [domain], [domain]
    leaf: EnvoyDescriptor | None = None
    shared: dict[int, str] = {}
    last = len(entries) - 1
    for index, (key, value) in enumerate(entries):
        final_key = f"{key}_{value}"
        detailed.append(final_key)
        node, wildcard = children.get(final_key), ""
        if node is None and previous.wildcards:
            for pattern, parts in previous.wildcards:
                if wildcard_match(parts, final_key):
                    node, wildcard = children.get(pattern), pattern
                    break
        by_value = node is not None
        if node is None:
            node = children.get(key)
        if node is None:
            valued.append(key)
            break
        pattern = wildcard.removeprefix(key + "_") if wildcard else ""
        if wildcard and node.share_threshold:
            shared[index] = pattern
        if wildcard:
            use = shared.get(index) or (value if node.value_to_metric else pattern)
        else:
            use = value if by_value or node.value_to_metric else ""
        valued.append(_entry(key, use))
        if node.rate_limit is not None and index == last:
            leaf = node
        if not node.children:
            break
        children, previous = node.children, node
    if leaf is None or leaf.rate_limit is None:
        return ""
    if leaf.detailed_metric:
        if shared:
            return sanitize(domain + "." + ".".join(
                f"{k}_{shared[i]}" if i in shared else _entry(k, v) for i, (k, v) in enumerate(entries)))
        return sanitize(".".join(detailed))
    return sanitize(".".join(valued))


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def near_threshold(limit: int, ratio: float) -> int:
    """The count above which a request is near its limit: ``floor(float32(limit) * float32(ratio))``,
    as the reference computes it.

    Args:
        limit: ``requests_per_unit``.
        ratio: ``NEAR_LIMIT_RATIO``.
    """
    return math.floor(_float32(_float32(float(limit)) * _float32(ratio)))


def increments(limit: int, before: int, hits: int, shadow: bool, ratio: float) -> dict[str, int]:
    """What one descriptor's answer adds to each counter of ``STATS`` (zero ones left out), given its
    count ``before`` the request and the request's ``hits``, as the reference's
    ``GetResponseDescriptorStatus`` adds them.

    Args:
        limit: ``requests_per_unit``.
        before: The count before the request.
        hits: The hits the request adds.
        shadow: A ``shadow_mode`` limit.
        ratio: ``NEAR_LIMIT_RATIO``.
    """
    after = before + hits
    near = near_threshold(limit, ratio)
    out = {"total_hits": hits}
    if after > limit:
        if before >= limit:
            out["over_limit"] = hits
        else:
            out["over_limit"] = after - limit
            out["near_limit"] = limit - max(near, before)
        if shadow:
            out["shadow_mode"] = hits if before >= limit else after - limit
    else:
        if after > near:
            out["near_limit"] = hits if before >= near else after - near
        out["within_limit"] = hits
    return {name: value for name, value in out.items() if value > 0}
