"""Envoy's global rate limit service, framework-free: ``RateLimitService.should_rate_limit``.

It answers ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` (``serve.grpc`` translates
the protobuf), with envoyproxy/ratelimit's semantics and ratewarden's counting:

- each request descriptor selects a limit (``serve.descriptors``) or, with a ``limit`` override,
  that rate (in the domain, with the matched descriptor's algorithm);
- the cost is the descriptor's ``hits_addend`` when given, else the request's (0 counts as 1);
- every enforced descriptor of a request is charged all or nothing in one store call, so N
  concurrent requests against a limit L get exactly L through; ``shadow_mode`` and ``quota_mode``
  descriptors are counted on their own: shadow ones never limit, quota ones only when every quota
  descriptor of the request is over (as envoyproxy/ratelimit); ``unlimited`` ones touch no store;
  ``replaces`` drops the limits it names; ``charge="each"`` charges every descriptor on its own,
  a refused one up to its limit, as envoyproxy/ratelimit does;
- a descriptor's counter is ``storage_key(prefix, "envoy:" + domain, its entries, the limit's
  suffix)`` (the builder every rule's counter goes through): its entries are the request's values,
  or the wildcard pattern under ``share_threshold``, and the suffix the algorithm and rate, so an
  override of another rate counts apart;
- the enforced descriptors are charged by ``enforcement.check.store_answer`` and the shadow ones by
  ``shadow_answer``, the functions every door's check uses: a store failure is decided by the
  insurance limiter, or ``LimitUnavailable`` (fail-closed: ``UNAVAILABLE``), or, fail-open without
  an insurance limiter, nothing (``OK``, no limit stated); a shadow descriptor's failure is logged
  and never refuses;
- the answer's headers are ratewarden's, as ``/check`` writes them, envoyproxy/ratelimit's three,
  or none (``headers=``, ``serve.rls_headers``). This module only translates: descriptors to storage keys,
  limits and costs; decisions to statuses and codes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..caches import remember
from ..decision import Decision
from ..enforcement.check import shadow_answer, store_answer
from ..enforcement.plan import log_failure
from ..errors import ConfigurationError, LimitUnavailable
from ..limiter import Limiter
from ..limits import DEFAULT_ALGORITHM, Limit
from ..rates import Rate
from ..storage_keys import storage_key
from ..stores.base import StoreError
from .bounds import MAX_DESCRIPTORS, MAX_ENTRIES
from .descriptors import entries_key, escape, match_descriptor
from .envoy_config import UNIT_SECONDS, EnvoyDomain, EnvoyRateLimit
from .rls_headers import HEADER_STYLES, copy_decision, ratewarden_headers, reference_headers, window_left
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


@dataclass
class _Plan:
    """How one descriptor is decided."""

    index: int
    kind: Literal["none", "unlimited", "zero", "counted"]
    current: CurrentLimit | None = None
    limit: Limit | None = None
    key: str = ""
    cost: float = 1.0
    shadow: bool = False
    period: int = 1
    decision: Decision | None = None
    quota: bool = False
    name: str = ""  # a zero plan's limit name in the headers (a counted plan's is its limit's)
    stat: str = ""  # the reference's stats key, for its metrics (serve.reference_service)
    left: float = -1.0  # charge="each": what a refused charge found left, before it was charged up to the limit


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
        self, domains: Mapping[str, EnvoyDomain], limiter: Limiter, *, headers: bool | str = True,
        charge: str = "all", max_descriptors: int = MAX_DESCRIPTORS, max_entries: int = MAX_ENTRIES,
    ) -> None:
        style = "ratewarden" if headers is True else "none" if headers is False else headers
        if style not in HEADER_STYLES:
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
        plans: list[_Plan] = []
        replacing: set[str] = set()
        names: list[str] = []
        for index, descriptor in enumerate(descriptors):
            plan, name = self._plan(config, domain, index, descriptor, default_cost, replacing)
            plans.append(plan)
            names.append(name)
        if replacing:
            for plan, name in zip(plans, names, strict=True):
                if name and name in replacing and plan.kind != "none":
                    plan.kind = "none"
                    plan.current = None
        await self._decide(plans)
        return self._answer(plans)

    def _plan(
        self, config: EnvoyDomain | None, domain: str, index: int, descriptor: RequestDescriptor,
        default_cost: int, replacing: set[str],
    ) -> tuple[_Plan, str]:
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
            return _Plan(index, "none"), ""
        match = match_descriptor(config, entries)
        shared: dict[int, str] = {}
        if override is not None:
            algorithm = match.rate_limit.algorithm if match is not None else config.algorithm
            requests, unit = override
            current = CurrentLimit("", requests, unit)
            limit = self._override_limit(requests, unit, algorithm) if requests > 0 else None
            shadow, quota, name = False, False, ""
        elif match is None:
            return _Plan(index, "none"), ""
        else:
            rate_limit: EnvoyRateLimit = match.rate_limit
            replacing.update(rate_limit.replaces)
            name = rate_limit.name
            if rate_limit.unlimited:
                return _Plan(index, "unlimited"), name
            shared = match.shared
            unit = rate_limit.unit
            current = CurrentLimit(rate_limit.name, rate_limit.requests_per_unit, unit)
            limit = rate_limit.limit
            shadow = rate_limit.shadow_mode
            quota = rate_limit.quota_mode
        period = UNIT_SECONDS[unit]
        if limit is None:  # requests_per_unit 0: every request is over
            label = name or (match.rate_limit.full_key if override is None and match is not None else f"0/{period * 1000}")
            return _Plan(index, "zero", current, cost=cost, shadow=shadow, period=period, name=label, quota=quota), name
        cache_key = (domain, entries, limit.suffix, tuple(shared.items()) if shared else ())
        key = self._keys.get(cache_key, "")
        if not key:
            key = storage_key(self.limiter.prefix, self._namespace(domain), entries_key(entries, shared), limit.suffix)
            remember(self._keys, cache_key, key, 16_384, 16 << 20)  # 1 KiB an entry at most
        return _Plan(index, "counted", current, limit, key, float(cost), shadow, period, quota=quota), name

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

    async def _decide(self, plans: list[_Plan]) -> None:
        """Charge the counted plans: enforced ones all or nothing (``enforcement.check.store_answer``,
        the failure policy of every door), shadow and quota ones each on its own; with
        ``charge="each"``, every one on its own (``_charge_one``)."""
        if self._each:
            jobs = [self._charge_one(plan) for plan in plans if plan.kind == "counted"]
            if len(jobs) == 1:
                await jobs[0]
            elif jobs:
                await asyncio.gather(*jobs)
            return
        enforced: list[_Plan] = []
        shadows: list[_Plan] = []
        blocked = False
        for plan in plans:
            if plan.kind == "counted":
                (shadows if plan.shadow or plan.quota else enforced).append(plan)
            elif plan.kind == "zero" and not plan.shadow and not plan.quota:
                blocked = True
        if not shadows:
            if enforced:
                await self._charge(enforced, blocked)
            return
        jobs = [self._shadow(p) for p in shadows]
        if enforced:
            jobs.append(self._charge(enforced, blocked))
        await asyncio.gather(*jobs)

    async def _charge_one(self, plan: _Plan) -> None:
        """Charge one plan on its own (``charge="each"``), as envoyproxy/ratelimit counts: a refused
        charge is made anyway, up to the limit (``Store.adjust``), so the counter ends exhausted and
        the status says 0 left."""
        assert plan.limit is not None
        keys, limits, costs = (plan.key,), (plan.limit,), (plan.cost,)
        limiter = self.limiter
        if plan.shadow:
            decision = await shadow_answer(limiter, keys, limits, costs)
        else:
            try:
                decision = await store_answer(limiter, keys, limits, costs, "store")
            except LimitUnavailable as exc:
                raise LimitUnavailable(f"the rate limit store failed: {exc.__cause__ or exc}") from exc.__cause__
        if decision is not None and not decision.allowed:
            plan.left = float(decision.remaining)
            if decision.remaining > 0:
                try:
                    await limiter.store.adjust(keys, limits, costs)
                except Exception as exc:  # the refusal stands; only its charge is lost
                    log_failure("store", exc)
            decision = Decision(
                False, decision.limit, 0, decision.reset_after, decision.retry_after, decision.period, decision.policy
            )
        plan.decision = decision

    async def _shadow(self, plan: _Plan) -> None:
        """Charge a shadow or quota plan on its own (a quota plan can refuse: the failure policy applies)."""
        assert plan.limit is not None
        if not plan.quota:
            plan.decision = await shadow_answer(self.limiter, (plan.key,), (plan.limit,), (plan.cost,))
            return
        try:
            plan.decision = await store_answer(self.limiter, (plan.key,), (plan.limit,), (plan.cost,), "store")
        except LimitUnavailable as exc:
            raise LimitUnavailable(f"the rate limit store failed: {exc.__cause__ or exc}") from exc.__cause__

    async def _charge(self, plans: list[_Plan], blocked: bool) -> None:
        """One all-or-nothing check of ``plans`` (``blocked``: another enforced descriptor is
        always over, so nothing is charged, only read); sets each plan's decision (``None``: the
        store failed under fail-open without an insurance limiter, nothing decided)."""
        by_key: dict[str, int] = {}
        keys: list[str] = []
        limits: list[Limit] = []
        costs: list[float] = []
        for plan in plans:
            assert plan.limit is not None
            at = by_key.get(plan.key)
            if at is None:  # the same counter twice in one request: charged once, for both costs
                by_key[plan.key] = len(keys)
                keys.append(plan.key)
                limits.append(plan.limit)
                costs.append(0.0 if blocked else plan.cost)
            elif not blocked:
                costs[at] += plan.cost
        limiter = self.limiter
        try:
            decision = await store_answer(limiter, keys, limits, costs, "store")
        except LimitUnavailable as exc:  # fail-closed: UNAVAILABLE, naming what the store said
            raise LimitUnavailable(f"the rate limit store failed: {exc.__cause__ or exc}") from exc.__cause__
        if decision is None:
            return
        if len(keys) == 1:
            for plan in plans:
                plan.decision = decision
            return
        try:
            each = await limiter.store.peek(keys, limits)
        except (StoreError, NotImplementedError):
            each = [decision] * len(keys)
        for plan in plans:
            found = each[by_key[plan.key]]
            if blocked:
                found = copy_decision(found, True)
            elif not decision.allowed:
                over = found.remaining < costs[by_key[plan.key]] or not found.allowed
                found = copy_decision(found, not over, decision.retry_after if over else 0.0)
            plan.decision = found
        if not blocked and not decision.allowed and all(p.decision is not None and p.decision.allowed for p in plans):
            for plan in plans:  # a race moved the counts: the store said no, so the request is denied
                assert plan.decision is not None
                plan.decision = copy_decision(plan.decision, False, decision.retry_after)

    def _answer(self, plans: list[_Plan]) -> RlsAnswer:
        statuses: list[DescriptorStatus] = []
        overall_ok = True
        quotas = quotas_over = 0
        closest: _Plan | None = None
        shown: list[_Plan] = []  # the enforced limits, listed in RateLimit-Policy
        for plan in plans:
            kind = plan.kind
            if kind == "none":
                statuses.append(DescriptorStatus("OK"))
                continue
            if kind == "unlimited":
                statuses.append(DescriptorStatus("OK", None, UINT32_MAX))
                continue
            if kind == "zero":
                over = True
                remaining = 0
                reset = window_left(plan.period)
                if not plan.shadow:  # refused by a limit of 0: its headers, as any limit's refusal has
                    plan.decision = Decision(False, 0, 0, reset, math.inf, float(plan.period), plan.name)
                    shown.append(plan)
                    if closest is None or _closer(plan, closest):
                        closest = plan
            else:
                decision = plan.decision
                if decision is None:  # the store failed and nothing decided (fail-open): as no limit
                    statuses.append(DescriptorStatus("OK"))
                    continue
                over = not decision.allowed
                remaining = min(max(0, decision.remaining), UINT32_MAX)
                reset = decision.reset_after
                if not plan.shadow:
                    shown.append(plan)
                    if closest is None or _closer(plan, closest):
                        closest = plan
            if plan.shadow:
                statuses.append(DescriptorStatus("OK", plan.current, remaining, reset, shadowed=over))
                continue
            if plan.quota:
                quotas += 1
                if over:
                    quotas_over += 1
            elif over:
                overall_ok = False
            statuses.append(DescriptorStatus("OVER_LIMIT" if over else "OK", plan.current, remaining, reset))
        if quotas and quotas_over == quotas:  # every quota is spent
            overall_ok = False
        headers: list[tuple[str, str]] = []
        if self._ratewarden_headers:
            if closest is not None and closest.decision is not None:
                headers = self._headers(closest, shown, not overall_ok)
        elif self._reference_headers:
            headers = reference_headers(statuses, plans)
        return RlsAnswer(overall_ok, statuses, headers)

    def _headers(self, plan: _Plan, shown: list[_Plan], over: bool) -> list[tuple[str, str]]:
        """ratewarden's headers (``rls_headers.ratewarden_headers``) of the plan's decision, listing
        every enforced limit in ``RateLimit-Policy`` (a limit of 0 as ``q=0``)."""
        decision = plan.decision
        assert decision is not None
        if len(shown) == 1:
            policies: tuple[Limit | tuple[str, int], ...] = (plan.limit if plan.limit is not None else (plan.name, plan.period),)
        else:
            policies = tuple(dict.fromkeys(p.limit if p.limit is not None else (p.name, p.period) for p in shown))
        label = plan.limit.name if plan.limit is not None else plan.name
        return ratewarden_headers(decision, label, policies, over, self._policies)


def _closer(plan: _Plan, other: _Plan) -> bool:
    """Whether ``plan`` is closer to its limit than ``other`` (a denial first)."""
    mine, theirs = plan.decision, other.decision
    assert mine is not None and theirs is not None
    if mine.allowed != theirs.allowed:
        return not mine.allowed
    return mine.remaining < theirs.remaining
