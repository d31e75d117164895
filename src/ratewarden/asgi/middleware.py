"""``RateLimitMiddleware``: a pure ASGI middleware (no ``BaseHTTPMiddleware``), streaming-safe.

It touches only the ``http.response.start`` message (to add headers) and passes every body chunk
through untouched, so streaming and server-sent responses are unaffected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from .._mypyc import mypyc_attr
from ..context import context_for
from ..decision import Decision
from ..enforcement.answers import HeaderOptions
from ..enforcement.check import LimitUnavailable, check
from ..enforcement.outcome import ALLOW, failed, outcome_of
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..rules import CompiledRule, Rule, RuleSet, policy_of
from ..types import ASGIApp, Receive, Scope, Send
from .responses import LimitHandler, SendWithHeaders, answer_on_limit, send_outcome
from .websocket import MessageLimitAction, WebSocketDeny, WebSocketLimits

__all__ = ["RateLimitMiddleware"]


@mypyc_attr(allow_interpreted_subclasses=True)
class RateLimitMiddleware:
    """Applies ``rules`` to every HTTP request and WebSocket connection.

    Args:
        app: The ASGI app to protect.
        limiter: Checks the limits on its store.
        rules: A list, or a ``RuleSet`` (whose ``replace`` swaps rules at run time).
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` (429 answers only) or
            ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` (draft-10
            ``RateLimit``/``RateLimit-Policy``) or ``"legacy"`` (``X-RateLimit-*``).
        on_limit: Replaces the problem+json 429: receives the scope and the decision and returns an ASGI
            app (e.g. a Starlette ``Response``); ``None`` keeps the default answer.
        websocket_deny: How a refused WebSocket connection is answered: an HTTP 429 (``"http"``, needs the
            ``websocket.http.response`` extension), a close frame after accepting (``"close"``), or the
            first the server supports (``"auto"``).
        websocket_on_message_limit: What a message over its limit does: a JSON ``rate_limit`` notice
            (``"notify"``) or closing the connection with code 1008 (``"close"``).
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rules: Sequence[Rule] | RuleSet = (),
        *,
        headers: HeaderMode = "always",
        header_style: HeaderStyle = "both",
        on_limit: LimitHandler | None = None,
        websocket_deny: WebSocketDeny = "auto",
        websocket_on_message_limit: MessageLimitAction = "notify",
    ) -> None:
        self.answers = HeaderOptions(headers, header_style)
        self.app = app
        self.limiter = limiter
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(rules, limiter.prefix)
        self.headers = headers
        self.header_style = header_style
        self.on_limit = on_limit
        self.websockets = WebSocketLimits(limiter, websocket_deny, websocket_on_message_limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle(scope, receive, send)

    def handle(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """What answers this connection, as an awaitable: on the usual paths the app's own (the check
        runs here, synchronously), so the coroutine of ``__call__`` stays one ``await`` long.

        Args:
            scope: The ASGI connection scope.
            receive: The ASGI ``receive``.
            send: The ASGI ``send``.
        """
        kind: str = scope["type"]
        if kind == "http":
            matched = self.rules.match(scope["method"], scope["path"])
            if not matched:
                return self.app(scope, receive, send)
            limiter = self.limiter
            if not limiter.enabled:
                return self.app(scope, receive, send)
            try:
                checked = check(limiter, matched, scope)
            except LimitUnavailable as exc:
                return send_outcome(send, failed(exc))
            if checked is None or isinstance(checked, Decision):
                return self._answer(checked, matched, scope, receive, send)
            return self._answer_later(checked, matched, scope, receive, send)
        if kind == "websocket":
            matched = self.rules.match("GET", scope["path"], websocket=True)
            if matched and self.limiter.enabled:
                return self.websockets.handle(self.app, matched, scope, receive, send)
        elif kind == "lifespan":
            return self._lifespan(scope, receive, send)
        return self.app(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The server starts the app: ask the store first (``Limiter.check_store``: a store that
        does not answer is logged once, at ERROR, and nothing is raised, so the app starts and the
        failure policy applies), then hand the lifespan to the app."""
        if self.limiter.enabled:
            await self.limiter.check_store()
        await self.app(scope, receive, send)

    async def _answer_later(
        self,
        checked: Awaitable[Decision | None],
        matched: tuple[CompiledRule, ...],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """The check had to wait (an async key, a remote store, several rules): await it, then answer."""
        try:
            decision = await checked
        except LimitUnavailable as exc:
            await send_outcome(send, failed(exc))
            return
        await self._answer(decision, matched, scope, receive, send)

    def _answer(
        self, decision: Decision | None, matched: tuple[CompiledRule, ...], scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        """Send the core's ``Outcome``: the app with its headers added, the 429, or ``on_limit``'s answer."""
        if decision is None:
            return self.app(scope, receive, send)
        context_for(scope).decision = decision
        outcome = outcome_of(decision, self.answers, policy_of(matched))
        if outcome.verdict == ALLOW:
            headers = outcome.headers
            return self.app(scope, receive, SendWithHeaders(send, headers) if headers else send)
        on_limit = self.on_limit
        if on_limit is None:
            return send_outcome(send, outcome)
        return answer_on_limit(on_limit(scope, decision), scope, receive, send, outcome)
