"""Envoy's rate limit service as envoyproxy/ratelimit runs it under its service-wide settings
(``ratewarden serve --envoy-env``): ``ReferenceService`` decides with ``RateLimitService`` and adds

- ``SHADOW_MODE`` (global): an answer over its limit is sent ``OK`` overall, its statuses unchanged;
- ``LIMIT_LIMIT_HEADER``, ``LIMIT_REMAINING_HEADER``, ``LIMIT_RESET_HEADER``: the names of the
  reference's three headers (``--envoy-headers reference``);
- its Prometheus metrics (``serve.reference_metrics``): each descriptor a limit applies to counts
  under its stats key what the reference's rules add (``serve.reference_stats``), from the count
  before the request: the count the answer leaves less the hits when the request was allowed, the
  count it found when refused (``charge="each"``, the reference's way, charges a refused
  request up to the limit); with ``NEAR_LIMIT_RATIO``. A call's time is counted from its decision's
  start to its answer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..caches import remember
from ..enforcement.charge_strategies import COUNTED, SHADOW
from ..limiter import Limiter
from .envoy_config import EnvoyDomain
from .reference_metrics import ReferenceMetrics
from .reference_stats import increments, labels, stat_key
from .rls import RateLimitService, RequestDescriptor, RlsAnswer

__all__ = ["REFERENCE_HEADER_NAMES", "ReferenceOptions", "ReferenceService"]

log = logging.getLogger("ratewarden.serve")

#: The reference's header names by default (``LIMIT_*_HEADER``), as ``rls_headers`` writes them.
REFERENCE_HEADER_NAMES = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")


@dataclass(frozen=True)
class ReferenceOptions:
    """The reference's service-wide settings that ratewarden's options have no flag for.

    Args:
        shadow: ``SHADOW_MODE``.
        header_names: ``LIMIT_LIMIT_HEADER``, ``LIMIT_REMAINING_HEADER``, ``LIMIT_RESET_HEADER``.
        near_limit_ratio: ``NEAR_LIMIT_RATIO``.
        prometheus: ``PROMETHEUS_ADDR`` when ``USE_PROMETHEUS`` (and not ``DISABLE_STATS``), else ``None``.
        prometheus_path: ``PROMETHEUS_PATH``.
        healthy_with_config: ``HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED``: ``/healthcheck`` fails
            until a configuration with a domain is loaded.
        health_store: ``REDIS_HEALTH_CHECK_ACTIVE_CONNECTION``: ``/healthcheck`` fails while the
            store does not answer.
    """

    shadow: bool = False
    header_names: tuple[str, str, str] = REFERENCE_HEADER_NAMES
    near_limit_ratio: float = 0.8
    prometheus: tuple[str, int] | None = None
    prometheus_path: str = "/metrics"
    healthy_with_config: bool = False
    health_store: bool = False


class ReferenceService(RateLimitService):
    """``RateLimitService`` with the reference's service-wide settings.

    Args:
        domains: The loaded configurations by domain.
        limiter: Where the counts live.
        options: The reference's settings.
        metrics: Its metrics, or ``None`` for none.
        **kwargs: ``RateLimitService``'s options.
    """

    def __init__(
        self, domains: Mapping[str, EnvoyDomain], limiter: Limiter, *, options: ReferenceOptions,
        metrics: ReferenceMetrics | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(domains, limiter, **kwargs)
        self.options = options
        self.metrics = metrics
        self._renamed = (
            dict(zip(REFERENCE_HEADER_NAMES, options.header_names, strict=True))
            if options.header_names != REFERENCE_HEADER_NAMES else None
        )
        self._stat_keys: dict[tuple[str, int, tuple[tuple[str, str], ...], bool], str] = {}

    def replace(self, domains: Mapping[str, EnvoyDomain]) -> None:
        super().replace(domains)
        self._stat_keys = {}

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[RequestDescriptor], hits_addend: int = 1
    ) -> RlsAnswer:
        metrics = self.metrics
        if metrics is None:
            return await super().should_rate_limit(domain, descriptors, hits_addend)
        started = time.perf_counter()
        try:
            return await super().should_rate_limit(domain, descriptors, hits_addend)
        finally:
            metrics.call(time.perf_counter() - started)

    @property
    def json_service(self) -> Any:
        """What ``POST /json`` decides with: this service, its calls counted but not timed (the
        reference's ``total_requests`` and ``response_time`` count its gRPC calls only)."""
        return _Untimed(self)

    def _item(self, config: EnvoyDomain | None, domain: str, index: int, descriptor: RequestDescriptor,
              default_cost: int, replacing: set[str]) -> Any:
        made = super()._item(config, domain, index, descriptor, default_cost, replacing)
        item = made[0]
        if self.metrics is not None and config is not None and item.kind in COUNTED:
            override = descriptor.limit is not None
            cache_key = (domain, id(config), descriptor.entries, override)
            found = self._stat_keys.get(cache_key)
            if found is None:
                found = stat_key(config, domain, descriptor.entries, override)
                remember(self._stat_keys, cache_key, found, 16_384, 16 << 20)
            item.stat = found
        return made

    def _answer(self, items: list[Any]) -> RlsAnswer:
        answer = super()._answer(items)
        if self.metrics is not None:
            for item in items:
                if item.stat and item.kind in COUNTED:
                    self._count(item)
        if self._renamed is not None and answer.headers:
            answer.headers = [(self._renamed.get(name, name), value) for name, value in answer.headers]
        if self.options.shadow and not answer.overall_ok:
            answer.overall_ok = True
            if self.metrics is not None:
                self.metrics.global_shadow()
        return answer

    def _count(self, item: Any) -> None:
        """Add what the reference adds for one descriptor's answer."""
        assert self.metrics is not None and item.current is not None
        found = labels(item.stat)
        if found is None:
            return
        limit, hits = item.current.requests_per_unit, int(item.cost)
        decision = item.decision
        if item.limit is None:
            before = limit  # always over: the reference's count is past 0
        elif decision is None:  # the store failed: the reference counted the hits, then failed
            if hits > 0:
                self.metrics.add("total_hits", found, hits)
            return
        elif decision.allowed:
            before = max(0, limit - _whole(decision.remaining) - hits)
        else:
            left = item.left if item.left >= 0 else decision.remaining
            before = max(0, limit - _whole(left))
        for stat, amount in increments(limit, before, hits, item.kind == SHADOW, self.options.near_limit_ratio).items():
            self.metrics.add(stat, found, amount)


class _Untimed:
    """A ``ReferenceService`` whose ``should_rate_limit`` is ``RateLimitService``'s (not timed)."""

    def __init__(self, service: ReferenceService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def should_rate_limit(self, domain: str, descriptors: Sequence[RequestDescriptor], hits_addend: int = 1) -> Any:
        return RateLimitService.should_rate_limit(self._service, domain, descriptors, hits_addend)


def _whole(remaining: float) -> int:
    """A decision's ``remaining`` as a whole count (an algorithm's fraction rounds down, as a status's)."""
    return max(0, math.floor(remaining)) if remaining != math.inf else 0
