"""The ``cost`` of a JSON check (``/v1/check``): the policy served with each rule's cost multiplied
by the check's (``costed_policy``), so one check can charge several requests' worth."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..policy.schema import Policy
from ..policy.tiers import PolicyRule
from ..rules import Rule
from ..types import Scope

__all__ = ["COST_KEY", "MAX_COST", "costed_policy"]


#: In the rewritten scope's state: the JSON check's cost.
COST_KEY = "ratewarden.serve.cost"
#: The largest ``cost`` a JSON check may ask for.
MAX_COST = 1_000_000


def _scaled(rule: Rule) -> Rule:
    """``rule`` with its cost multiplied by the check's ``cost`` (read from the scope's state)."""
    base = rule.cost

    def cost(scope: Scope) -> float:
        own = base(scope) if callable(base) else base
        return float(own) * float(scope["state"].get(COST_KEY, 1))

    common: dict[str, Any] = {
        "name": rule.name, "methods": rule.methods, "algorithm": rule.algorithm, "shadow": rule.shadow, "cost": cost,
    }
    if isinstance(rule, PolicyRule):
        if rule.tiers is not None:
            return PolicyRule(rule.path, tiers=rule.tiers, delay=rule.delay, charge=rule.charge, **common)
        return PolicyRule(rule.path, rule.rate, key=rule.key, delay=rule.delay, charge=rule.charge, **common)
    return Rule(rule.path, rule.rate, key=rule.key, **common)


def costed_policy(policy: Policy) -> Policy:
    """``policy`` whose rules charge a check's ``cost`` times their own (bypass rules unchanged): the
    same names, limits and keys, so the same counts.

    Args:
        policy: A validated policy.
    """
    rules = [rule if rule.bypass or rule.websocket else _scaled(rule) for rule in policy.rules]
    return replace(policy, rules=rules)
