"""Stats: the current state of one client across every limit that can apply to it, read with
``store.peek`` so nothing is charged."""

from __future__ import annotations

from collections.abc import Iterable

from ..limiter import Limiter
from ..rules import CompiledRule, Rule

__all__ = ["rule_stats"]


async def rule_stats(
    limiter: Limiter, rules: Iterable[Rule], key: str, *, group: str | None = None
) -> list[dict[str, object]]:
    """One entry per limit of ``rules`` for client ``key``: rule, group, policy, rate, limit,
    remaining and seconds until reset (bypass rules are skipped).

    Args:
        limiter: The limiter whose store is read.
        rules: The rules to report.
        key: The client's key.
        group: The client's group: tiered rules report that group's limits; with the default ``None`` (or
            an unlimited group) they are skipped.
    """
    out: list[dict[str, object]] = []
    for rule in rules:
        if rule.bypass:
            continue
        compiled: CompiledRule | None
        tiers = getattr(rule, "tiers", None)
        if tiers is not None:
            if group is None:
                continue
            compiled = rule.group_rules(limiter.prefix).get(group)  # type: ignore[attr-defined]
            if compiled is None:
                continue
        elif rule.limits:
            compiled = CompiledRule(rule, limiter.prefix)
        else:
            continue
        decisions = await limiter.store.peek(compiled.storage_keys(key), compiled.limits)
        for limit, decision in zip(compiled.limits, decisions, strict=True):
            out.append(
                {
                    "rule": rule.name,
                    "group": group if tiers is not None else None,
                    "policy": limit.name,
                    "rate": str(limit.rate),
                    "algorithm": limit.algorithm,
                    "limit": decision.limit,
                    "remaining": decision.remaining,
                    "reset_after": round(decision.reset_after, 3),
                }
            )
    return out
