"""``PolicyMiddleware``: ``RateLimitMiddleware`` plus the operational features — a reloadable
policy file, tiers, global shadow mode, bans, delays, after-response charging and metrics.

A request is decided by the policy core (``decision_plan.py``: its plan, then its outcome, neither
doing I/O), driven here through the store by awaiting it: refuse if banned, choose the caller's
group, check, delay, record, then refuse or serve (and settle after-response charges). It is a separate class so the plain middleware's hot path carries none
of this; features left off here cost a few attribute checks per request. WebSocket traffic is
handled exactly as by ``RateLimitMiddleware``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from ..asgi.middleware import RateLimitMiddleware
from ..asgi.responses import send_answer, send_on_limit
from ..charges import adjust
from ..decision import Decision
from ..enforcement.check import Checked, LimitUnavailable, check, check_rules, decided, rule_key
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, Rule, RuleSet
from ..types import ASGIApp, Message, Receive, Scope, Send
from .bans import Bans
from .core import PolicyCore, policy_in_rules, refund_amounts, refunded
from .decision_plan import REFUSE, Outcome, failed, listed
from .request_context import PolicyContext
from .schema import Policy

__all__ = ["PolicyMiddleware"]

log = logging.getLogger("ratewarden")
_refund_warned: set[str] = set()
_NO_BODY = (b"content-length", b"0")


class PolicyMiddleware(PolicyCore, RateLimitMiddleware):
    """Rate limiting driven by rules or a policy file, with the operational modes.

    Args:
        app: The ASGI app to protect.
        limiter: Checks the limits on its store.
        rules: The rules, when no ``policy`` gives them (a policy given here is taken as ``policy``).
        policy: A TOML/YAML policy file's path (or a loaded ``Policy``); its rules replace ``rules``.
        watch: Poll the file every this many seconds and reload it on change; ``None`` disables
            (``reload()`` and, with ``sighup``, ``SIGHUP`` always work).
        sighup: Reload the policy file on ``SIGHUP``.
        shadow: Count and log, never block (the policy's ``settings.shadow`` overrides it).
        bans: Bans to enforce (the policy's ``[bans]`` overrides it); ``None`` for none.
        metrics: Where to record metrics; ``None`` records none.
        shadow_header: Add ``RateLimit-Shadow`` to responses a shadow limit would have denied.
        show_group: 429 bodies name the caller's group (the policy's ``settings.show_group = false`` also
            turns it off).
        **kwargs: Those of ``RateLimitMiddleware`` (``headers``, ``header_style``, ``on_limit``...).
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rules: Sequence[Rule] | RuleSet | str | Path | Policy = (),
        *,
        policy: str | Path | Policy | None = None,
        watch: float | None = None,
        sighup: bool = False,
        shadow: bool = False,
        bans: Bans | None = None,
        metrics: Metrics | None = None,
        shadow_header: bool = True,
        show_group: bool = True,
        **kwargs: Any,
    ) -> None:
        rules, policy = policy_in_rules(rules, policy)
        super().__init__(app, limiter, rules, **kwargs)
        self._start_policy(policy, watch, sighup, shadow, bans, metrics, shadow_header, show_group)

    # -- request path: the decision core's plan and outcome, the store awaited --------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        ctx = self._plan_request(scope)
        if ctx is None:
            await self.app(scope, receive, send)
            return
        outcome = self._decide(ctx, scope)
        if not isinstance(outcome, Outcome):
            outcome = await outcome
        if outcome.verdict is not REFUSE:
            await self._serve(ctx, outcome, scope, receive, send)
            return
        if outcome.strike:
            await self._strike(ctx)
        decision = outcome.decision
        if decision is not None and self.on_limit is not None:
            answer = self.on_limit(scope, decision)
            await send_on_limit(answer, scope, receive, send, decision, self.answers, listed(ctx))
            return
        await send_answer(send, outcome.status, outcome.body, outcome.headers)

    async def answer(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """What this middleware answers an HTTP request when the app behind it answers ``200`` with an
        empty body: ``(status, complete header list, body)``, returned rather than sent, and the app
        not called (``ratewarden serve``'s checks). The decision is ``__call__``'s (``_decide``); a
        refusal is the default 429 (``on_limit`` answers with an app, so it is not used here).

        Args:
            scope: An HTTP scope; its ``state`` receives the request's context, as in ``__call__``.
        """
        ctx = self._plan_request(scope)
        if ctx is None:
            return 200, [_NO_BODY], b""
        outcome = self._decide(ctx, scope)
        if not isinstance(outcome, Outcome):
            outcome = await outcome
        if outcome.verdict is REFUSE:
            if outcome.strike:
                await self._strike(ctx)
            return outcome.status, outcome.headers, outcome.body
        if outcome.settle:
            await self._settle(scope, ctx.rules, 200)
        return 200, [*outcome.headers, _NO_BODY], b""

    def _decide(self, ctx: PolicyContext, scope: Scope) -> Outcome | Awaitable[Outcome]:
        """The request's outcome: its plan driven through the store, at once where the store answers
        without waiting (``enforcement.check.check``), else an awaitable of it (a ban read, a store
        that asks its server, a delay's re-checks)."""
        if ctx.runtime.bans is not None:
            return self._decide_banned(ctx, scope)
        return self._decide_check(ctx, scope)

    def _decide_check(self, ctx: PolicyContext, scope: Scope) -> Outcome | Awaitable[Outcome]:
        """``_decide`` once the bans let the request through: the check of the rules to charge."""
        try:
            rules = self._charged(ctx, scope)  # empty when the caller's group is unlimited
            checked = check(self.limiter, rules if isinstance(rules, tuple) else tuple(rules), scope) if rules else None
        except LimitUnavailable as exc:
            return failed(exc)
        if checked is None:
            return self._outcome(ctx, None)
        if isinstance(checked, Decision) and (checked.allowed or not ctx.plan.delayed or ctx.runtime.shadow):
            return self._outcome(ctx, checked)
        return self._decide_later(ctx, scope, checked)

    async def _decide_later(self, ctx: PolicyContext, scope: Scope, checked: Checked) -> Outcome:
        """``_decide_check`` when the check must be awaited, or a refusal waits for its turn (``delay``)."""
        try:
            decision = await decided(checked)
            if decision is not None and not decision.allowed and ctx.plan.delayed and not ctx.runtime.shadow:
                decision = await self._delay(ctx, scope, decision)
        except LimitUnavailable as exc:
            return failed(exc)
        return self._outcome(ctx, decision)

    async def _decide_banned(self, ctx: PolicyContext, scope: Scope) -> Outcome:
        """``_decide`` with bans on: the ban read (awaited) first, then the check."""
        bans = ctx.runtime.bans
        assert bans is not None
        try:
            key = self._ban_key(ctx, scope)
            if key is not None and not isinstance(key, str):
                key = await self._awaited_ban_key(ctx, scope, key)
            if key is not None:
                banned = self._banned(ctx, await bans.check(self.limiter, key))
                if banned is not None:
                    return banned
        except LimitUnavailable as exc:
            return failed(exc)
        outcome = self._decide_check(ctx, scope)
        return outcome if isinstance(outcome, Outcome) else await outcome

    async def _awaited_ban_key(self, ctx: PolicyContext, scope: Scope, pending: Awaitable[object]) -> str | None:
        """The ban key once the bans' key function's awaitable answer is awaited (``None``: skipped)."""
        try:
            return self._ban_key_from(ctx, scope, await pending)
        except Exception as exc:
            self._ban_key_failed(exc)
            return None

    async def _delay(self, ctx: PolicyContext, scope: Scope, decision: Decision) -> Decision | None:
        """Hold a refused request for its turn when its rule has a ``delay``; ``None`` when the
        re-check could not decide (fail-open: served as for any failed check)."""
        delayer = self._delayer(ctx, decision)
        if delayer is None:
            return decision
        decider, delay = delayer
        try:
            client = await rule_key(self.limiter, decider, scope)
            waited = await delay.wait(client, decision, lambda: check_rules(self.limiter, ctx.rules, scope))
        except LimitUnavailable:
            raise
        except Exception as exc:  # the delay key could not be computed: refuse as without a delay
            log.warning("delay skipped rule=%s: %s: %s", decider.rule.name, type(exc).__name__, exc)
            return decision
        return self._delayed(ctx, decider, waited)

    async def _strike(self, ctx: PolicyContext) -> None:
        """Count a refusal toward the client's ban (``ctx.ban_key`` is set when bans are on)."""
        bans = ctx.runtime.bans
        if bans is not None and ctx.ban_key is not None:
            try:
                await bans.strike(self.limiter, ctx.ban_key)
            except Exception as exc:
                log.warning("ban strike failed: %s: %s", type(exc).__name__, exc)

    async def _serve(self, ctx: PolicyContext, outcome: Outcome, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app, adding the outcome's headers, then settle after-response charges."""
        extra = outcome.headers
        settle = outcome.settle
        if not extra and not settle:
            await self.app(scope, receive, send)
            return
        status = 500

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if extra:
                    message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            if settle:
                await self._settle(scope, ctx.rules, status)

    async def _settle(self, scope: Scope, rules: Sequence[CompiledRule], status: int) -> None:
        """Refund the charge of rules whose ``charge`` says this status does not count."""
        for rule in refunded(rules, status):
            try:
                key = await rule_key(self.limiter, rule, scope)
                await adjust(self.limiter.store, rule.storage_keys(key), rule.limits, refund_amounts(rule, scope))
            except NotImplementedError as exc:
                name = type(self.limiter.store).__name__
                if name not in _refund_warned:
                    _refund_warned.add(name)
                    log.warning("after-response charging unavailable: %s", exc)
            except Exception as exc:
                log.warning("refund failed rule=%s: %s: %s", rule.rule.name, type(exc).__name__, exc)
