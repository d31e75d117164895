"""Envoy's global rate limit service, framework-free: ``RateLimitService.should_rate_limit``.

It answers ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` (``serve.grpc`` translates
the protobuf), with envoyproxy/ratelimit's semantics and ratewarden's counting. This module only
translates; charging and the failure policy are the core's (``enforcement.charge_strategies``):

- each request descriptor selects a limit (``serve.descriptors``) or, with a ``limit`` override,
  that rate (in the domain, with the matched descriptor's algorithm), and becomes one of the core's
  items: enforced, ``shadow_mode``, ``quota_mode``, a limit of 0, ``unlimited`` (no store), or none
  (no match, or dropped by another's ``replaces``);
- the cost is the descriptor's ``hits_addend`` when given, else the request's (0 counts as 1);
- a descriptor's counter is ``storage_key(prefix, "envoy:" + domain, its entries, the limit's
  suffix)`` (the builder every rule's counter goes through): its entries are the request's values,
  or the wildcard pattern under ``share_threshold``, and the suffix the algorithm and rate, so an
  override of another rate counts apart;
- the core charges the items (``charge_items``: all or nothing, or ``charge="each"`` each on its
  own as envoyproxy/ratelimit does) and says whether the request is allowed (``request_allowed``);
  a store failure under fail-closed is its ``LimitUnavailable`` (gRPC's ``UNAVAILABLE``);
- the decisions become statuses and codes, and the answer's headers are ratewarden's (the one header
  writer, ``enforcement.answers.text_headers``), envoyproxy/ratelimit's three, or none
  (``headers=``, ``serve.rls_headers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._mypyc import mypyc_attr
from ..caches import remember
from ..enforcement.answers import text_headers
from ..enforcement.charge_strategies import (
    ENFORCED,
    NONE,
    QUOTA,
    SHADOW,
    UNLIMITED,
    Item,
    charge_items,
    copy_decision,
    request_allowed,
)
from ..errors import ConfigurationError
from ..limiter import Limiter
from ..limits import DEFAULT_ALGORITHM, Limit
from ..rates import Rate
from ..storage_keys import storage_key
from .bounds import MAX_DESCRIPTORS, MAX_ENTRIES
from .descriptors import entries_key, escape, match_descriptor
from .envoy_config import UNIT_SECONDS, EnvoyDomain, EnvoyRateLimit
from .rls_headers import HEADER_STYLES, reference_headers
from .rls_messages import (
    UINT32_MAX,
    CurrentLimit,
    DescriptorStatus,
    RequestDescriptor,
    RlsAnswer,
    RlsRequestError,
)

__all__ = ["CHARGES", "HEADER_STYLES", "UINT32_MAX", "CurrentLimit", "DescriptorStatus", "RateLimitService",
           "RequestDescriptor", "RlsAnswer", "RlsRequestError"]

#: ``charge=``: the enforced descriptors all or nothing, or each on its own (envoyproxy/ratelimit).
CHARGES = ("all", "each")


@mypyc_attr(allow_interpreted_subclasses=True)
class _DescriptorItem(Item):
    """One descriptor as the core charges it (``Item``), with the limit its status reports."""

    current: CurrentLimit | None = None
    stat: str = ""  # the reference's stats key, for its metrics (serve.reference_service)


@mypyc_attr(allow_interpreted_subclasses=True)  # ReferenceService
class RateLimitService:
    """Envoy's rate limit service over a ``Limiter``.

    Args:
        domains: The loaded configurations by domain (``load_envoy_configs``).
        limiter: Where the counts live (its store, prefix and ``on_error``).
        headers: The answers' headers: ``"ratewarden"`` (or ``True``, the default), ``"reference"``
            (envoyproxy/ratelimit's ``RateLimit-Limit``/``-Remaining``/``-Reset``), ``"none"`` (or ``False``).
        charge: ``"all"`` (the default): a request's enforced descriptors are charged all or
            nothing; ``"each"``: each on its own, a refused one too (up to its limit), as
            envoyproxy/ratelimit does. Needs a store that can adjust.
        max_descriptors: The most descriptors a request may carry; more is refused before any work.
        max_entries: The most entries a request may carry over all its descriptors; more is refused.
    """

    def __init__(
        self, domains: Mapping[str, EnvoyDomain], limiter: Limiter, *, headers: object = True,
        charge: str = "all", max_descriptors: int = MAX_DESCRIPTORS, max_entries: int = MAX_ENTRIES,
    ) -> None:
        style = "ratewarden" if headers is True else "none" if headers is False else headers
        if not isinstance(style, str) or style not in HEADER_STYLES:
            raise ConfigurationError(f"headers must be one of {', '.join(HEADER_STYLES)}, got {headers!r}")
        if charge not in CHARGES:
            raise ConfigurationError(f"charge must be 'all' (all or nothing) or 'each' (envoyproxy/ratelimit's), got {charge!r}")
        if charge == "each" and not limiter.store.supports("adjust"):
            raise ConfigurationError(f"charge='each' needs a store that can adjust counts; {type(limiter.store).__name__} cannot")
        self._domains: Mapping[str, EnvoyDomain] = dict(domains)
        self.limiter = limiter
        self.headers = style
        self.charge = charge
        self._each = charge == "each"
        self._ratewarden_headers = style == "ratewarden"
        self._reference_headers = style == "reference"
        self.max_descriptors = max_descriptors
        self.max_entries = max_entries
        self._overrides: dict[tuple[int, str, str], Limit] = {}
        self._policies: dict[tuple[Limit | tuple[str, int], ...], bytes] = {}
        self._keys: dict[tuple[object, ...], str] = {}
        self._namespaces: dict[str, str] = {}

    @property
    def domains(self) -> Mapping[str, EnvoyDomain]:
        """The configurations in use."""
        return self._domains

    def replace(self, domains: Mapping[str, EnvoyDomain]) -> None:
        """Use new configurations from the next request on (an atomic swap, for reloads).

        Args:
            domains: The new configurations by domain.
        """
        self._domains = dict(domains)

    def check_size(self, descriptors: int, entries: int) -> None:
        """Refuse (``RlsRequestError``) a request of more than ``max_descriptors`` descriptors or
        ``max_entries`` entries, before any work on it.

        Args:
            descriptors: The request's descriptors.
            entries: Its entries, over all its descriptors.
        """
        if descriptors > self.max_descriptors:
            raise RlsRequestError(f"a request may carry at most {self.max_descriptors} descriptors, got {descriptors}")
        if entries > self.max_entries:
            raise RlsRequestError(f"a request may carry at most {self.max_entries} entries in all, got {entries}")

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[RequestDescriptor], hits_addend: int = 1
    ) -> RlsAnswer:
        """Decide a request; raises ``RlsRequestError`` for a malformed one and ``LimitUnavailable``
        when the store failed and the limiter is fail-closed.

        Args:
            domain: The request's domain.
            descriptors: Its descriptors.
            hits_addend: The request's cost (0 counts as 1).
        """
        if not domain:
            raise RlsRequestError("rate limit domain must not be empty")
        if not descriptors:
            raise RlsRequestError("rate limit descriptor list must not be empty")
        entries = 0
        for descriptor in descriptors:
            entries += len(descriptor.entries)
        self.check_size(len(descriptors), entries)
        if hits_addend < 0:
            raise RlsRequestError(f"hits_addend must not be negative, got {hits_addend}")
        config = self._domains.get(domain)
        default_cost = max(1, hits_addend)
        items: list[_DescriptorItem] = []
        replacing: set[str] = set()
        names: list[str] = []
        for index, descriptor in enumerate(descriptors):
            item, name = self._item(config, domain, index, descriptor, default_cost, replacing)
            items.append(item)
            names.append(name)
        if replacing:
            for item, name in zip(items, names, strict=True):
                if name and name in replacing and item.kind != NONE:
                    item.kind = NONE
                    item.current = None
        await charge_items(self.limiter, items, self._each)
        return self._answer(items)

    def _item(
        self, config: EnvoyDomain | None, domain: str, index: int, descriptor: RequestDescriptor,
        default_cost: int, replacing: set[str],
    ) -> tuple[_DescriptorItem, str]:
        """What deciding ``descriptor`` takes, and its limit's name (for ``replaces``)."""
        entries = descriptor.entries
        if not entries:
            raise RlsRequestError(f"descriptor {index} has no entries")
        for key, _value in entries:
            if not key:
                raise RlsRequestError(f"descriptor {index} has an entry with an empty key")
        cost = descriptor.hits_addend if descriptor.hits_addend is not None else default_cost
        if cost < 0:
            raise RlsRequestError(f"descriptor {index}: hits_addend must not be negative, got {cost}")
        override = descriptor.limit
        if override is not None and override[1] not in UNIT_SECONDS:
            raise RlsRequestError(
                f"descriptor {index}: limit override unit must be one of {', '.join(u.upper() for u in UNIT_SECONDS)}, "
                f"got {override[1]!r}"
            )
        if config is None:
            return _DescriptorItem(NONE), ""
        match = match_descriptor(config, entries)
        shared: dict[int, str] = {}
        if override is not None:
            algorithm = match.rate_limit.algorithm if match is not None else config.algorithm
            requests, unit = override
            current = CurrentLimit("", requests, unit)
            limit = self._override_limit(requests, unit, algorithm) if requests > 0 else None
            kind, name = ENFORCED, ""
        elif match is None:
            return _DescriptorItem(NONE), ""
        else:
            rate_limit: EnvoyRateLimit = match.rate_limit
            replacing.update(rate_limit.replaces)
            name = rate_limit.name
            if rate_limit.unlimited:
                return _DescriptorItem(UNLIMITED), name
            shared = match.shared
            unit = rate_limit.unit
            current = rate_limit.current
            limit = rate_limit.limit
            kind = SHADOW if rate_limit.shadow_mode else QUOTA if rate_limit.quota_mode else ENFORCED
        if limit is None:  # requests_per_unit 0: every request is over
            period = UNIT_SECONDS[unit]
            label = name or (match.rate_limit.full_key if override is None and match is not None else f"0/{period * 1000}")
            item = _DescriptorItem(kind, cost=float(cost), zero=(label, period))
            item.current = current
            return item, name
        cache_key = (domain, entries, limit.suffix, tuple(shared.items()) if shared else ())
        key = self._keys.get(cache_key, "")
        if not key:
            key = storage_key(self.limiter.prefix, self._namespace(domain), entries_key(entries, shared), limit.suffix)
            remember(self._keys, cache_key, key, 16_384, 16 << 20)  # 1 KiB an entry at most
        item = _DescriptorItem(kind, key, limit, float(cost))
        item.current = current
        return item, name

    def _namespace(self, domain: str) -> str:
        found = self._namespaces.get(domain)
        if found is None:
            found = "envoy:" + escape(domain)
            remember(self._namespaces, domain, found, 1024)
        return found

    def _override_limit(self, requests: int, unit: str, algorithm: str) -> Limit:
        cache_key = (requests, unit, algorithm)
        found = self._overrides.get(cache_key)
        if found is None:
            from ..algorithms import algorithm_name

            found = Limit(Rate(requests, float(UNIT_SECONDS[unit])), algorithm_name(algorithm or DEFAULT_ALGORITHM))
            remember(self._overrides, cache_key, found, 1024)
        return found

    def _answer(self, items: list[_DescriptorItem]) -> RlsAnswer:
        """The core's decisions as Envoy's statuses, its verdict and the headers."""
        statuses: list[DescriptorStatus] = []
        closest: _DescriptorItem | None = None
        shown: list[_DescriptorItem] = []  # the enforced and quota limits, listed in RateLimit-Policy
        for item in items:
            decision = item.decision
            if decision is None:  # no limit, unlimited, or its store failed under fail-open: as no limit
                statuses.append(DescriptorStatus("OK", None, UINT32_MAX) if item.kind == UNLIMITED else DescriptorStatus("OK"))
                continue
            over = not decision.allowed
            remaining = min(max(0, decision.remaining), UINT32_MAX)
            if item.kind == SHADOW:
                statuses.append(DescriptorStatus("OK", item.current, remaining, decision.reset_after, shadowed=over))
                continue
            shown.append(item)
            if closest is None or _closer(item, closest):
                closest = item
            statuses.append(DescriptorStatus("OVER_LIMIT" if over else "OK", item.current, remaining, decision.reset_after))
        overall_ok = request_allowed(items)
        headers: list[tuple[str, str]] = []
        if self._ratewarden_headers:
            if closest is not None:
                headers = self._headers(closest, shown, not overall_ok)
        elif self._reference_headers:
            headers = reference_headers(statuses, items)
        return RlsAnswer(overall_ok, statuses, headers)

    def _headers(self, item: _DescriptorItem, shown: list[_DescriptorItem], over: bool) -> list[tuple[str, str]]:
        """ratewarden's headers (``enforcement.answers.text_headers``) of the item's decision, listing
        every enforced limit in ``RateLimit-Policy`` (a limit of 0 as ``q=0``)."""
        decision = item.decision
        assert decision is not None
        if len(shown) == 1:
            policies: tuple[Limit | tuple[str, int], ...] = (item.limit if item.limit is not None else item.zero,)
        else:
            policies = tuple(dict.fromkeys(p.limit if p.limit is not None else p.zero for p in shown))
        label = item.limit.name if item.limit is not None else item.zero[0]
        if decision.policy != label:  # a decision read for several counters names the one it is for
            decision = copy_decision(decision, decision.allowed, policy=label)
        return text_headers(decision, policies, over and not decision.allowed, self._policies)


def _closer(item: _DescriptorItem, other: _DescriptorItem) -> bool:
    """Whether ``item`` is closer to its limit than ``other`` (a denial first)."""
    mine, theirs = item.decision, other.decision
    assert mine is not None and theirs is not None
    if mine.allowed != theirs.allowed:
        return not mine.allowed
    return mine.remaining < theirs.remaining
