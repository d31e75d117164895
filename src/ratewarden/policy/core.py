"""What the two policy middlewares share, whatever the server interface: the policy in force and
its reloads, the per-rule-tuple plans, the choice of the caller's group, the record of a decision
(metrics and logs), the ban answer and the ``RateLimit-Shadow`` header.

``PolicyCore`` is a mixin: ``PolicyMiddleware`` (ASGI, ``asgi.py``) and ``WSGIPolicyMiddleware``
(``wsgi.py``) each set ``limiter`` and ``rules`` and then call ``_start_policy``; each keeps its own
request path, since one awaits and the other blocks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..decision import Decision
from ..enforcement.answers import problem_body
from ..enforcement.check import rule_costs
from ..errors import ConfigurationError, UsageError
from ..headers import HeaderMode, HeaderStyle, rate_limit_headers
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, Rule, RuleSet, policy_of
from ..types import Scope
from .admin import Operations
from .bans import Bans
from .delay import Delay
from .reload import PolicyReloader
from .request_context import PolicyContext
from .runtime import Plan, Runtime
from .schema import Policy
from .tiers import PolicyRule

__all__ = ["PolicyCore", "ban_answer", "listed", "owner", "policy_in_rules", "refund_amounts", "refunded"]

log = logging.getLogger("ratewarden")
_PLAN_CACHE_LIMIT = 4096


def owner(rules: Sequence[CompiledRule], decision: Decision) -> CompiledRule:
    """The rule whose limit made ``decision`` (by policy name).

    Args:
        rules: The rules that were checked.
        decision: Their combined decision.
    """
    if len(rules) > 1:
        for rule in rules:
            for limit in rule.limits:
                if limit.name == decision.policy:
                    return rule
    return rules[0]


def ban_answer(bans: Bans, left: float) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """A banned request's answer: status, problem+json body and the ``Retry-After`` header.

    Args:
        bans: The bans in force (their ``status``).
        left: Seconds left on the ban.
    """
    title = "Forbidden" if bans.status == 403 else "Too Many Requests"
    seconds = max(1, math.ceil(left))
    body = problem_body(bans.status, title, f"Too many rejected requests; blocked for {seconds}s.", retry_after=seconds)
    return bans.status, body, [(b"retry-after", b"%d" % seconds)]


def policy_in_rules(
    rules: Sequence[Rule] | RuleSet | str | Path | Policy, policy: str | Path | Policy | None,
) -> tuple[Sequence[Rule] | RuleSet, str | Path | Policy | None]:
    """The rules and the policy of ``PolicyMiddleware(app, limiter, rules, policy=...)``: a policy (a
    file's path or a ``Policy``) given where the rules go, ``PolicyMiddleware(app, limiter, policy)``,
    is taken as ``policy=``.

    Args:
        rules: The third argument.
        policy: The ``policy=`` argument.
    """
    if not isinstance(rules, (Policy, str, Path)):
        return rules, policy
    if policy is not None:
        raise ConfigurationError(
            f"a policy was given twice, as the rules argument ({rules!r:.60}) and as policy=; give it once, as policy="
        )
    return (), rules


def refunded(rules: Sequence[CompiledRule], status: int) -> Iterator[CompiledRule]:
    """The rules whose ``charge`` says a response of ``status`` does not count (to refund).

    Args:
        rules: The rules the request was charged to.
        status: The response's status.
    """
    for rule in rules:
        charge = getattr(rule.rule, "charge", None)
        if charge is not None and not charge.counts(status):
            yield rule


def refund_amounts(rule: CompiledRule, scope: Scope) -> list[float]:
    """What refunding ``rule``'s charge of this request adjusts each of its limits by.

    Args:
        rule: A rule the request was charged to.
        scope: The request's scope, for a cost function.
    """
    return [-c for c in rule_costs(rule, scope)]


def listed(ctx: PolicyContext) -> bytes:
    """The ``RateLimit-Policy`` value of the request: every limit of the rules it was charged to
    (a tiered rule's as its caller's group), as ``RateLimitMiddleware`` lists them."""
    rules = ctx.rules
    return policy_of(rules if isinstance(rules, tuple) else tuple(rules))


class PolicyCore(Operations):
    """The policy state and the interface-neutral stages of a policy middleware (a mixin: the
    middleware sets ``limiter`` and ``rules``, then calls ``_start_policy``)."""

    limiter: Limiter
    rules: RuleSet
    headers: HeaderMode
    header_style: HeaderStyle
    metrics: Metrics | None
    shadow_header: bool
    reloader: PolicyReloader | None
    _defaults: tuple[bool, Bans | None, bool]
    _plans: dict[tuple[CompiledRule, ...], Plan]

    def _start_policy(
        self,
        policy: str | Path | Policy | None,
        watch: float | None,
        sighup: bool,
        shadow: bool,
        bans: Bans | None,
        metrics: Metrics | None,
        shadow_header: bool,
        show_group: bool,
    ) -> None:
        """Set up the policy state (the middleware's arguments of the same names) and load the file."""
        self._check_store(self.rules.rules, bans)
        self.metrics = metrics
        if metrics is not None:
            metrics.watch(self.limiter.store)
        self.shadow_header = shadow_header
        self._defaults = (shadow, bans, show_group)
        self._plans = {}
        self._runtime = Runtime(self.rules, shadow, bans, show_group, None)
        self.reloader = None
        if isinstance(policy, Policy):
            self.apply(policy)
        elif policy is not None:
            self.reloader = PolicyReloader(policy, self.apply, interval=watch or 1.0)
            self.reloader.load()
            if watch is not None:
                self.reloader.start()
            if sighup:
                self.reloader.install_sighup()

    # -- policy --------------------------------------------------------------------------------

    @property
    def policy(self) -> Policy | None:
        """The policy in force (``None`` when the middleware was given rules, not a policy)."""
        return self._runtime.policy

    @property
    def shadow(self) -> bool:
        """Global shadow mode: count and log, never block."""
        return self._runtime.shadow

    @property
    def bans(self) -> Bans | None:
        """The bans in force, if any."""
        return self._runtime.bans

    def apply(self, policy: Policy) -> None:
        """Swap in ``policy`` atomically (one assignment); ban lists carry over.

        Args:
            policy: The new policy, already validated.
        """
        shadow, bans, show_group = self._defaults
        old = self._runtime.bans
        new_bans = policy.bans if policy.bans is not None else bans
        if old is not None and new_bans is not None and new_bans is not old:
            new_bans = old.configure_from(new_bans)
        self._check_store(policy.rules, new_bans)
        ruleset = RuleSet(policy.rules, self.limiter.prefix)
        self._runtime = Runtime(ruleset, policy.shadow or shadow, new_bans, policy.show_group and show_group, policy)
        self.rules = ruleset
        self._plans = {}

    def _check_store(self, rules: Sequence[Rule], bans: Bans | None) -> None:
        """At start-up (and before a reload takes effect): after-response charging refunds, so the
        store must be able to adjust; not at the first refund."""
        for rule in rules:
            if getattr(rule, "charge", None) is not None:
                self.limiter.store.require("adjust", f"rule {rule.name!r} (charge: counting only some statuses)")

    def reload(self) -> bool:
        """Reload the policy file now (an admin call); ``False`` if it was invalid (old one kept)."""
        if self.reloader is None:
            raise UsageError("this middleware was not given a policy file to reload")
        return self.reloader.reload()

    def close(self) -> None:
        """Stop watching the policy file."""
        if self.reloader is not None:
            self.reloader.stop()
        if self.metrics is not None:
            self.metrics.close()

    # -- request stages that neither await nor block -------------------------------------------

    def _plan(self, matched: tuple[CompiledRule, ...]) -> Plan:
        plan = self._plans.get(matched)
        if plan is None:
            plan = Plan(matched)
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans = {}
            self._plans[matched] = plan
        return plan

    def _choose_group(self, ctx: PolicyContext, scope: Scope) -> None:
        """Replace tiered rules by the rule of the caller's group (dropping unlimited groups)."""
        rules: list[CompiledRule] = []
        prefix = self.limiter.prefix
        for compiled in ctx.rules:
            rule = compiled.rule
            if isinstance(rule, PolicyRule) and rule.tiers is not None:
                ctx.group = rule.tiers.identity.group(scope)
                chosen = rule.group_rules(prefix).get(ctx.group)
                if chosen is not None:
                    rules.append(chosen)
            else:
                rules.append(compiled)
        ctx.rules = rules

    def _record(self, ctx: PolicyContext, decision: Decision) -> None:
        """Publish the decision in the context, count it and log a refusal."""
        ctx.decision = decision
        shadow = ctx.runtime.shadow
        if self.metrics is None and decision.allowed:
            return
        name = owner(ctx.rules, decision).rule.name
        if self.metrics is not None:
            self.metrics.observe(name, ctx.group, decision, shadow=shadow)
        if decision.allowed:
            return
        if shadow:
            ctx.would_deny = decision
            log.info(
                "shadow_limited rule=%s group=%s policy=%s retry_after=%.3f",
                name, ctx.group, decision.policy, decision.retry_after,
            )
        else:
            log.info(
                "rate_limited rule=%s group=%s policy=%s limit=%d retry_after=%.3f",
                name, ctx.group, decision.policy, decision.limit, decision.retry_after,
            )

    def _shadow_headers(self, ctx: PolicyContext) -> list[tuple[bytes, bytes]]:
        """``RateLimit-Shadow`` for the first decision a shadow limit would have denied; counts
        the per-rule shadow denials."""
        if self.metrics is not None:
            for d in ctx.shadow:
                self.metrics.observe_shadow_rule(d)
        if not self.shadow_header:
            return []
        denied = [d for d in ctx.shadow if not d.allowed]
        if ctx.would_deny is not None:
            denied.insert(0, ctx.would_deny)
        for d in denied[:1]:
            retry = "inf" if math.isinf(d.retry_after) else str(max(1, math.ceil(d.retry_after)))
            return [(b"ratelimit-shadow", f'"{d.policy}";deny;r={d.remaining};t={retry}'.encode("latin-1", "replace"))]
        return []

    def _banned(self, bans: Bans, left: float) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """A banned request's answer (``ban_answer``), counted; ``None`` when ``left`` says no ban."""
        if left <= 0:
            return None
        if self.metrics is not None:
            self.metrics.observe_banned(bans.status)
        return ban_answer(bans, left)

    @staticmethod
    def _delayer(ctx: PolicyContext, decision: Decision) -> tuple[CompiledRule, Delay] | None:
        """The rule that refused (``owner``) and its ``delay``; ``None`` when it has none."""
        decider = owner(ctx.rules, decision)
        delay: Delay | None = getattr(decider.rule, "delay", None)
        return None if delay is None else (decider, delay)

    def _delayed(self, ctx: PolicyContext, decider: CompiledRule, waited: Decision | None) -> Decision | None:
        """The answer of a wait, counted as delayed when it was allowed."""
        if waited is not None and waited.allowed and self.metrics is not None:
            self.metrics.observe_delayed(decider.rule.name, ctx.group)
        return waited

    def _answer_headers(self, ctx: PolicyContext) -> tuple[list[tuple[bytes, bytes]], bool]:
        """What serving adds: the rate-limit and shadow headers, and whether after-response charges
        are to be settled."""
        decision = ctx.decision
        extra = (
            rate_limit_headers(decision, self.header_style, listed(ctx))
            if decision is not None and self.headers == "always" else []
        )
        if ctx.would_deny is not None or ctx.shadow:
            extra = [*extra, *self._shadow_headers(ctx)]
        return extra, ctx.plan.charged and decision is not None and ctx.would_deny is None
