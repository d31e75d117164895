"""``PolicyMiddleware``: ``RateLimitMiddleware`` plus the operational features — a reloadable
policy file, tiers, global shadow mode, bans, delays, after-response charging and metrics.

A request is decided by the policy core's step machine (``Decider.decide_steps``: refuse if
banned, choose the caller's group, check, delay, record), run here by the async driver
(``steps.drive``), which answers at once whatever a local store answers; the door then
refuses or serves (and settles after-response charges). It is a separate class so the plain
middleware's hot path carries none of this; features left off here cost a few attribute checks
per request. WebSocket traffic is
handled exactly as by ``RateLimitMiddleware``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..asgi.middleware import RateLimitMiddleware
from ..asgi.responses import answer_on_limit, send_outcome
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import Rule, RuleSet
from ..steps import drive, driven
from ..types import ASGIApp, Message, Receive, Scope, Send
from .bans import Bans
from .core import PolicyCore, policy_in_rules, settle_steps
from .decider import REFUSE, Outcome
from .request_context import PolicyContext
from .schema import Policy

__all__ = ["PolicyMiddleware"]

log = logging.getLogger("ratewarden")


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

    # -- request path: the decision core's step machine, driven awaiting ---------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        ctx = self._plan_request(scope)
        if ctx is None:
            await self.app(scope, receive, send)
            return
        outcome = drive(self.decide_steps(ctx, scope))
        if not isinstance(outcome, Outcome):
            outcome = await outcome
        if outcome.verdict is not REFUSE:
            await self._serve(ctx, outcome, scope, receive, send)
            return
        if outcome.strike:
            await driven(self.strike_steps(ctx))
        decision = outcome.decision
        if decision is not None and self.on_limit is not None:
            await answer_on_limit(self.on_limit(scope, decision), scope, receive, send, outcome)
            return
        await send_outcome(send, outcome)

    async def answer(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """What this middleware answers an HTTP request when the app behind it answers ``200`` with an
        empty body: ``(status, complete header list, body)``, returned rather than sent, and the app
        not called (``answer_steps``, awaited). The decision is ``__call__``'s (``decide_steps``); a
        refusal is the default 429 (``on_limit`` answers with an app, so it is not used here).

        Args:
            scope: An HTTP scope; its ``state`` receives the request's context, as in ``__call__``.
        """
        return await driven(self.answer_steps(scope))

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
                await driven(settle_steps(self.limiter, scope, ctx.rules, status))
