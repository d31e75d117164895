"""Operator actions on a running ``PolicyMiddleware``: bans by hand, penalties and rewards, and
a client's stats across its limits (none of them on the request path)."""

from __future__ import annotations

from ..charges import adjust
from ..decision import Decision
from ..errors import ConfigurationError, UsageError
from ..limiter import Limiter
from ..rules import CompiledRule
from .bans import Bans
from .runtime import Runtime
from .stats import rule_stats
from .tiers import PolicyRule

__all__ = ["Operations"]


class Operations:
    """The admin methods of ``PolicyMiddleware`` (a mixin: it reads the middleware's limiter and
    current policy)."""

    limiter: Limiter
    _runtime: Runtime

    def _bans(self) -> Bans:
        bans = self._runtime.bans
        if bans is None:
            raise UsageError("bans are not configured (pass bans=Bans(...) or add [bans] to the policy)")
        return bans

    async def block(self, key: str, seconds: float) -> float:
        """Ban ``key`` (as produced by the bans' key function) for ``seconds``, in every worker
        sharing the store; returns the seconds left on the ban in force.

        Args:
            key: Who, as the bans' key function produces it (e.g. the client IP).
            seconds: How long the ban lasts.
        """
        return await self._bans().block(self.limiter, key, seconds)

    async def unblock(self, key: str) -> None:
        """Lift ``key``'s ban (other workers follow within the bans' ``cache_for`` seconds).

        Args:
            key: Who, as the bans' key function produces it (e.g. the client IP).
        """
        await self._bans().unblock(self.limiter, key)

    def _rule_named(self, name: str, group: str | None) -> CompiledRule:
        for rule in self._runtime.rules.rules:
            if rule.name != name:
                continue
            if isinstance(rule, PolicyRule) and rule.tiers is not None:
                if group is None or group not in rule.tiers.groups:
                    raise ConfigurationError(f"rule {name!r} is tiered: pass group= one of {', '.join(rule.tiers.groups)}")
                compiled = rule.group_rules(self.limiter.prefix)[group]
                if compiled is None:
                    raise ConfigurationError(f"group {group!r} of rule {name!r} is unlimited")
                return compiled
            return CompiledRule(rule, self.limiter.prefix)
        raise KeyError(f"no rule named {name!r}")

    async def _adjust(self, rule: str, key: str, points: float, group: str | None) -> Decision:
        compiled = self._rule_named(rule, group)
        amounts = [points] * len(compiled.limits)
        decisions = await adjust(self.limiter.store, compiled.storage_keys(key), compiled.limits, amounts)
        return min(decisions, key=lambda d: d.remaining)

    async def penalty(self, rule: str, key: str, points: float, group: str | None = None) -> Decision:
        """Charge ``points`` to ``key`` under rule ``rule`` regardless of its limit (saturating).

        Args:
            rule: The rule's name.
            key: Who, as the rule's key function produces it (e.g. the client IP).
            points: Units to charge.
            group: The client's group, for tiered rules (``None``: untiered).
        """
        return await self._adjust(rule, key, points, group)

    async def reward(self, rule: str, key: str, points: float, group: str | None = None) -> Decision:
        """Give ``points`` back to ``key`` under rule ``rule``.

        Args:
            rule: The rule's name.
            key: Who, as the rule's key function produces it (e.g. the client IP).
            points: Units to give back.
            group: The client's group, for tiered rules (``None``: untiered).
        """
        return await self._adjust(rule, key, -points, group)

    async def stats(self, key: str | None = None, *, api_key: str | None = None) -> list[dict[str, object]]:
        """Current state of a client across every limit that can apply to it, charging nothing.

        Args:
            key: A key as the rules' key functions produce it (e.g. the client IP).
            api_key: An API key instead: the policy's identity resolves the caller's group and key.
        """
        group = None
        rules = self._runtime.rules.rules
        if api_key is not None:
            policy = self._runtime.policy
            if policy is None or policy.tiers is None:
                raise ConfigurationError("api_key= needs a policy with an [identity] section")
            identity = policy.tiers.identity
            group = identity.group_of(api_key)
            key = identity.client_key(api_key)
        if key is None:
            raise ConfigurationError("stats() needs key= or api_key=")
        return await rule_stats(self.limiter, rules, key, group=group)
