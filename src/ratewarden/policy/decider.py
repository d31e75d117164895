"""The policy's decision without I/O: what a request needs read and charged, and what
the store's answers make of it (the outcome). Nothing here awaits or blocks; the doors drive it.

A door (``PolicyMiddleware``, ``WSGIPolicyMiddleware``, ``ratewarden serve``) runs::

    ctx = core._plan_request(scope)                  # None: no rule applies, pass the request on
    outcome = drive(core.decide_steps(ctx, scope))   # or drive_blocking: the one step machine

``decide_steps`` reads the ban (a refusal if banned), chooses the caller's group, checks the rules
(``enforcement.core.check_steps``), holds a refusal for its turn (``Delay.steps``) and makes the
``Outcome``: allow, shadow or refuse, with its status, headers and body; a check that raised
``LimitUnavailable`` is its 400 or 503. The door then does what the outcome asks: send it, strike
the ban counter (``Outcome.strike``: ``strike_steps``), serve the app with ``Outcome.headers`` and
refund after-response charges (``Outcome.settle``: ``settle_steps``), through the same driver.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Sequence

from ..context import STATE_KEY
from ..decision import Decision
from ..enforcement.answers import HeaderOptions, problem_body, problem_headers
from ..enforcement.core import check_steps, finish_key, key_of, key_value, report_failure
from ..enforcement.outcome import ALLOW, REFUSE, SHADOW, Outcome, failed, outcome_of, served
from ..errors import LimitUnavailable
from ..keys import key_text
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, policy_of
from ..steps import Await, Machine
from ..types import Scope
from .bans import Bans, Strike
from .delay import Delay
from .request_context import PolicyContext
from .runtime import Needs, Runtime
from .tiers import PolicyRule

__all__ = ["ALLOW", "REFUSE", "SHADOW", "Decider", "Outcome", "ban_answer", "failed", "listed", "owner"]

log = logging.getLogger("ratewarden")
_NEEDS_CACHE_LIMIT = 4096
_Headers = list[tuple[bytes, bytes]]


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


def ban_answer(bans: Bans, left: float) -> tuple[int, bytes, _Headers]:
    """A banned request's answer: status, problem+json body and the ``Retry-After`` header.

    Args:
        bans: The bans in force (their ``status``).
        left: Seconds left on the ban.
    """
    title = "Forbidden" if bans.status == 403 else "Too Many Requests"
    seconds = max(1, math.ceil(left))
    body = problem_body(bans.status, title, f"Too many rejected requests; blocked for {seconds}s.", retry_after=seconds)
    return bans.status, body, [(b"retry-after", b"%d" % seconds)]


def listed(ctx: PolicyContext) -> bytes:
    """The ``RateLimit-Policy`` value of the request: every limit of the rules it was charged to
    (a tiered rule's as its caller's group), as ``RateLimitMiddleware`` lists them."""
    rules = ctx.rules
    return policy_of(rules if isinstance(rules, tuple) else tuple(rules))


class Decider:
    """The decision steps of a policy middleware (a mixin of ``PolicyCore``, which sets
    these attributes): each reads the policy in force and the request, and none does I/O."""

    limiter: Limiter
    answers: HeaderOptions
    metrics: Metrics | None
    shadow_header: bool
    _runtime: Runtime
    _needs: dict[tuple[CompiledRule, ...], Needs]

    def decide_steps(self, ctx: PolicyContext, scope: Scope) -> Machine[Outcome]:
        """The request's outcome as a step machine (``ratewarden.steps``): the ban read, the check
        of the rules to charge, a refusal's wait for its turn, then ``_outcome``; a check that raised
        ``LimitUnavailable`` is ``failed``'s 400 or 503.

        Args:
            ctx: The request's context (``_plan_request``).
            scope: The request's scope.
        """
        rt = ctx.runtime
        try:
            if rt.bans is not None:
                banned = yield from self._ban_steps(ctx, scope, rt.bans)
                if banned is not None:
                    return banned
            rules = self._charged(ctx, scope)  # empty when the caller's group is unlimited
            decision = (yield from check_steps(self.limiter, rules, scope)) if rules else None
            if decision is not None and not decision.allowed and ctx.needs.delayed and not rt.shadow:
                decision = yield from self._delay_steps(ctx, scope, decision)
        except LimitUnavailable as exc:
            return failed(exc)
        return self._outcome(ctx, decision)

    def _ban_steps(self, ctx: PolicyContext, scope: Scope, bans: Bans) -> Machine[Outcome | None]:
        """The refusal of a banned client (``_banned``); ``None``: not banned, or the bans' key
        function failed under fail-open (skipped)."""
        key = self._ban_key(ctx, scope)
        if key is not None and not isinstance(key, str):
            try:
                key = self._ban_key_from(ctx, scope, (yield Await(key, "the bans' key function")))
            except Exception as exc:
                self._ban_key_failed(exc)
                key = None
        if key is None:
            return None
        return self._banned(ctx, (yield from bans.read_steps(self.limiter, key)))

    def _delay_steps(self, ctx: PolicyContext, scope: Scope, decision: Decision) -> Machine[Decision | None]:
        """Hold a refused request for its turn when its rule has a ``delay`` (``Delay.steps``); ``None``
        when the re-check could not decide (fail-open: served as for any failed check)."""
        decider = owner(ctx.rules, decision)
        delay: Delay | None = getattr(decider.rule, "delay", None)
        if delay is None:
            return decision
        rules = ctx.rules
        try:
            found = key_of(self.limiter, decider, scope)
            client = found if isinstance(found, str) else (yield from finish_key(self.limiter, decider, scope, found))
            waited = yield from delay.steps(client, decision, lambda: check_steps(self.limiter, rules, scope))
        except LimitUnavailable:
            raise
        except Exception as exc:  # the delay key could not be computed: refuse as without a delay
            log.warning("delay skipped rule=%s: %s: %s", decider.rule.name, type(exc).__name__, exc)
            return decision
        if waited is not None and waited.allowed and self.metrics is not None:
            self.metrics.observe_delayed(decider.rule.name, ctx.group)
        return waited

    def strike_steps(self, ctx: PolicyContext) -> Machine[None]:
        """Count a refusal toward the client's ban (``Outcome.strike``; ``ctx.ban_key`` is set when
        bans are on); a failure is logged, never the request's.

        Args:
            ctx: The refused request's context.
        """
        bans = ctx.runtime.bans
        if bans is not None and ctx.ban_key is not None:
            try:
                yield Strike(bans, self.limiter, ctx.ban_key)
            except Exception as exc:
                log.warning("ban strike failed: %s: %s", type(exc).__name__, exc)

    def _plan_request(self, scope: Scope) -> PolicyContext | None:
        """The request's context: the policy in force, the rules it matched and what they need beyond
        a plain check (bans to read, a group to choose, a delay, after-response charges), left in
        the scope's ``state``; ``None`` when no rule applies (the request passes untouched).

        Args:
            scope: The request as an ASGI HTTP scope (the WSGI door and ``ratewarden serve`` build one).
        """
        rt = self._runtime
        matched = rt.rules.match(scope["method"], scope["path"])
        if not matched or not self.limiter.enabled:
            return None
        return self._planned(rt, matched, scope)

    def _planned(self, rt: Runtime, matched: tuple[CompiledRule, ...], scope: Scope) -> PolicyContext:
        """``_plan_request`` for rules already matched under the policy ``rt``."""
        needs = self._needs.get(matched)
        if needs is None:
            needs = Needs(matched)
            if len(self._needs) >= _NEEDS_CACHE_LIMIT:
                self._needs = {}
            self._needs[matched] = needs
        ctx = PolicyContext(rt, matched, needs)
        scope.setdefault("state", {})[STATE_KEY] = ctx
        return ctx

    def _ban_key(self, ctx: PolicyContext, scope: Scope) -> str | Awaitable[object] | None:
        """Who the bans read (``ctx.ban_key``); an awaitable when the bans' key function answered one
        (the door awaits it and passes its value to ``_ban_key_from``); ``None`` when the key function
        raised under fail-open (the bans are skipped; fail-closed raises ``LimitUnavailable``).

        Args:
            ctx: The request's context (bans on).
            scope: The request's scope.
        """
        bans = ctx.runtime.bans
        assert bans is not None
        try:
            value = key_value(bans.key, scope)
            if not isinstance(value, str):
                return value
            ctx.ban_key = value
        except Exception as exc:
            self._ban_key_failed(exc)
            return None
        return ctx.ban_key

    def _ban_key_from(self, ctx: PolicyContext, scope: Scope, value: object) -> str:
        """The ban key from the awaited answer of the bans' key function (``ctx.ban_key``).

        Args:
            ctx: The request's context.
            scope: The request's scope.
            value: The key function's answer.
        """
        ctx.ban_key = key_text(value, scope)
        return ctx.ban_key

    def _ban_key_failed(self, exc: Exception) -> None:
        """The bans' key function raised: skip the bans under fail-open (``None``), raise
        ``LimitUnavailable`` under fail-closed (and for an ``AmbiguousRequest`` under either).

        Args:
            exc: What it raised.
        """
        report_failure(self.limiter, "ban key function", exc)

    def _banned(self, ctx: PolicyContext, left: float) -> Outcome | None:
        """The refusal of a banned client, counted; ``None`` when ``left`` (seconds left on its ban,
        as the store or the ban cache said) is no ban.

        Args:
            ctx: The request's context.
            left: Seconds left on the ban.
        """
        if left <= 0:
            return None
        bans = ctx.runtime.bans
        assert bans is not None
        if self.metrics is not None:
            self.metrics.observe_banned(bans.status)
        status, body, headers = ban_answer(bans, left)
        return Outcome(REFUSE, status, problem_headers(body, headers), body)

    def _charged(self, ctx: PolicyContext, scope: Scope) -> Sequence[CompiledRule]:
        """The rules to charge (``ctx.rules``): the matched ones, a tiered rule replaced by the rule of
        the caller's group (``ctx.group``), an unlimited group's dropped. Empty: nothing to charge.

        Args:
            ctx: The request's context.
            scope: The request's scope (its identity).
        """
        if not ctx.needs.tiered:
            return ctx.rules
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
        return rules

    def _outcome(self, ctx: PolicyContext, decision: Decision | None) -> Outcome:
        """What the limits' decision (``None``: nothing decided) makes of the request, recorded in its
        context, the metrics and the log: the 429 when a limit refused it outside shadow mode, else
        the headers to add to the app's response (rate-limit, ``RateLimit-Shadow``).

        Args:
            ctx: The request's context.
            decision: The store's answer for the rules to charge.
        """
        if decision is not None:
            self._record(ctx, decision)
            if not decision.allowed and not ctx.runtime.shadow:
                refusal = outcome_of(decision, self.answers, listed(ctx), ctx.group if ctx.runtime.show_group else "")
                refusal.strike = ctx.ban_key is not None
                return refusal
            extra = served(decision, self.answers, listed(ctx)).headers  # a shadow refusal is served too
        else:
            extra = []
        verdict = ALLOW
        if ctx.would_deny is not None or ctx.shadow:
            shadowed = self._shadow_headers(ctx)
            if shadowed is not None:
                verdict = SHADOW
                if self.shadow_header:
                    extra = [*extra, shadowed]
        settle = ctx.needs.charged and decision is not None and ctx.would_deny is None
        return Outcome(verdict, 200, extra, b"", decision, False, settle)

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

    def _shadow_headers(self, ctx: PolicyContext) -> tuple[bytes, bytes] | None:
        """``RateLimit-Shadow`` for the first decision a shadow limit would have denied (``None``:
        none would have); counts the per-rule shadow denials."""
        if self.metrics is not None:
            for d in ctx.shadow:
                self.metrics.observe_shadow_rule(d)
        denied = ctx.would_deny
        if denied is None:
            denied = next((d for d in ctx.shadow if not d.allowed), None)
            if denied is None:
                return None
        retry = "inf" if math.isinf(denied.retry_after) else str(max(1, math.ceil(denied.retry_after)))
        return b"ratelimit-shadow", f'"{denied.policy}";deny;r={denied.remaining};t={retry}'.encode("latin-1", "replace")
