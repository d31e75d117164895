"""``PolicyMiddleware``: ``RateLimitMiddleware`` plus the operational features — a reloadable
policy file, tiers, global shadow mode, bans, delays, after-response charging and metrics.

A request goes through named stages over one ``PolicyContext`` (``request_context.py``): refuse if
banned, choose the caller's group, check, delay, record, then refuse or serve (and settle
after-response charges). It is a separate class so the plain middleware's hot path carries none
of this; features left off here cost a few attribute checks per request. WebSocket traffic is
handled exactly as by ``RateLimitMiddleware``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from ..asgi.middleware import RateLimitMiddleware
from ..asgi.responses import send_limited, send_on_limit, send_problem, send_unavailable
from ..charges import adjust
from ..context import STATE_KEY
from ..decision import Decision
from ..enforcement.answers import problem_headers, rejection, unavailable_answer
from ..enforcement.check import LimitUnavailable, check_rules, report_failure
from ..keys import key_text
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, Rule, RuleSet
from ..types import ASGIApp, Message, Receive, Scope, Send
from .bans import Bans
from .core import PolicyCore, listed, policy_in_rules, refund_amounts, refunded
from .request_context import PolicyContext
from .schema import Policy

__all__ = ["PolicyMiddleware"]

log = logging.getLogger("ratewarden")
_refund_warned: set[str] = set()
_NO_BODY = (b"content-length", b"0")


async def _key(rule: CompiledRule, scope: Scope) -> str:
    value = rule.key(scope)
    if isinstance(value, Awaitable):
        value = await value
    return key_text(value, scope)


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

    # -- request path: a pipeline of stages over one PolicyContext -------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        rt = self._runtime
        matched = rt.rules.match(scope["method"], scope["path"])
        if not matched or not self.limiter.enabled:
            await self.app(scope, receive, send)
            return
        ctx = PolicyContext(rt, matched, self._plan(matched))
        scope.setdefault("state", {})[STATE_KEY] = ctx
        try:
            if rt.bans is not None and await self._refuse_if_banned(ctx, scope, send):
                return
            if ctx.plan.tiered:
                self._choose_group(ctx, scope)
            rules = ctx.rules  # empty when the caller's group is unlimited
            decision = await check_rules(self.limiter, rules, scope) if rules else None
            if decision is not None and not decision.allowed and ctx.plan.delayed and not rt.shadow:
                decision = await self._delay(ctx, scope, decision)
        except LimitUnavailable as exc:
            await send_unavailable(send, exc)
            return
        if decision is not None:
            self._record(ctx, decision)
            if not decision.allowed and not rt.shadow:
                await self._refuse(ctx, scope, receive, send, decision)
                return
        await self._serve(ctx, scope, receive, send)

    async def answer(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """What this middleware answers an HTTP request when the app behind it answers ``200`` with an
        empty body: ``(status, complete header list, body)``, returned rather than sent, and the app
        not called (``ratewarden serve``'s checks). The stages are ``__call__``'s (keep the two alike);
        a refusal is the default 429 (``on_limit`` answers with an app, so it is not used here).

        Args:
            scope: An HTTP scope; its ``state`` receives the request's context, as in ``__call__``.
        """
        rt = self._runtime
        matched = rt.rules.match(scope["method"], scope["path"])
        if not matched or not self.limiter.enabled:
            return 200, [_NO_BODY], b""
        ctx = PolicyContext(rt, matched, self._plan(matched))
        scope.setdefault("state", {})[STATE_KEY] = ctx
        try:
            if rt.bans is not None:
                banned = await self._ban_answer(ctx, scope)
                if banned is not None:
                    status, body, headers = banned
                    return status, problem_headers(body, headers), body
            if ctx.plan.tiered:
                self._choose_group(ctx, scope)
            rules = ctx.rules
            decision = await check_rules(self.limiter, rules, scope) if rules else None
            if decision is not None and not decision.allowed and ctx.plan.delayed and not rt.shadow:
                decision = await self._delay(ctx, scope, decision)
        except LimitUnavailable as exc:
            status, body, headers = unavailable_answer(exc)
            return status, headers, body
        if decision is not None:
            self._record(ctx, decision)
            if not decision.allowed and not rt.shadow:
                if ctx.ban_key is not None:
                    await self._strike(ctx)
                group = ctx.group if rt.show_group else ""
                body, headers = rejection(decision, self.header_style, self.headers != "off", listed(ctx), group)
                return 429, headers, body
        extra, settle = self._answer_headers(ctx)
        if settle:
            await self._settle(scope, ctx.rules, 200)
        return 200, [*extra, _NO_BODY], b""

    async def _refuse_if_banned(self, ctx: PolicyContext, scope: Scope, send: Send) -> bool:
        """Answer a banned client (``True``: done)."""
        answer = await self._ban_answer(ctx, scope)
        if answer is None:
            return False
        status, body, headers = answer
        await send_problem(send, status, body, headers)
        return True

    async def _ban_answer(self, ctx: PolicyContext, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """A banned client's answer (``ban_answer``); ``None`` when it is not banned. A failing ban
        key function skips the bans under fail-open and raises ``LimitUnavailable`` under fail-closed."""
        bans = ctx.runtime.bans
        assert bans is not None
        try:
            value = bans.key(scope)
            if isinstance(value, Awaitable):
                value = await value
            ctx.ban_key = key_text(value, scope)
        except Exception as exc:
            report_failure(self.limiter, "ban key function", exc)
            return None
        return self._banned(bans, await bans.check(self.limiter, ctx.ban_key))

    async def _delay(self, ctx: PolicyContext, scope: Scope, decision: Decision) -> Decision | None:
        """Hold a refused request for its turn when its rule has a ``delay``; ``None`` when the
        re-check could not decide (fail-open: served as for any failed check)."""
        delayer = self._delayer(ctx, decision)
        if delayer is None:
            return decision
        decider, delay = delayer
        try:
            client = await _key(decider, scope)
            waited = await delay.wait(client, decision, lambda: check_rules(self.limiter, ctx.rules, scope))
        except LimitUnavailable:
            raise
        except Exception as exc:  # the delay key could not be computed: refuse as without a delay
            log.warning("delay skipped rule=%s: %s: %s", decider.rule.name, type(exc).__name__, exc)
            return decision
        return self._delayed(ctx, decider, waited)

    async def _refuse(self, ctx: PolicyContext, scope: Scope, receive: Receive, send: Send, decision: Decision) -> None:
        """Answer 429 (or ``on_limit``), counting the refusal toward a ban."""
        if ctx.ban_key is not None:
            await self._strike(ctx)
        with_rate_headers = self.headers != "off"
        if self.on_limit is not None:
            answer = self.on_limit(scope, decision)
            await send_on_limit(answer, scope, receive, send, decision, self.header_style, with_rate_headers, listed(ctx))
            return
        # The default 429 with this middleware's extra body fields: ``remaining`` and the caller's ``group``.
        group = ctx.group if ctx.runtime.show_group else ""
        await send_limited(send, decision, self.header_style, with_rate_headers, listed(ctx), group)

    async def _strike(self, ctx: PolicyContext) -> None:
        """Count a refusal toward the client's ban (``ctx.ban_key`` is set when bans are on)."""
        bans = ctx.runtime.bans
        if bans is not None and ctx.ban_key is not None:
            try:
                await bans.strike(self.limiter, ctx.ban_key)
            except Exception as exc:
                log.warning("ban strike failed: %s: %s", type(exc).__name__, exc)

    async def _serve(self, ctx: PolicyContext, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app, adding rate-limit and shadow headers, then settle after-response charges."""
        extra, settle = self._answer_headers(ctx)
        if not extra and not ctx.plan.charged:
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
                key = await _key(rule, scope)
                await adjust(self.limiter.store, rule.storage_keys(key), rule.limits, refund_amounts(rule, scope))
            except NotImplementedError as exc:
                name = type(self.limiter.store).__name__
                if name not in _refund_warned:
                    _refund_warned.add(name)
                    log.warning("after-response charging unavailable: %s", exc)
            except Exception as exc:
                log.warning("refund failed rule=%s: %s: %s", rule.rule.name, type(exc).__name__, exc)
