"""WebSocket limits: on connect (rejected before accept) and per received message.

A denied connection is answered with an HTTP 429 when the server supports the ASGI
``websocket.http.response`` extension, otherwise closed with code 1008 (policy violation).
A limited message is dropped (the app never sees it); by default the client is told with a JSON
message ``{"type": "rate_limit", "retry_after": ...}`` and the connection stays open; with
``on_message_limit="close"`` the connection is closed with 1008 instead. When the limiter is
unavailable under ``on_error="closed"``, the connection is closed with 1013 (try again later) and
the app sees a disconnect: no message reaches it unchecked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Literal

from .._mypyc import mypyc_attr
from ..enforcement.answers import HeaderOptions
from ..enforcement.check import LimitUnavailable, check_rules
from ..enforcement.outcome import REFUSE, Outcome, outcome_of
from ..errors import ConfigurationError
from ..limiter import Limiter
from ..rules import CompiledRule
from ..types import ASGIApp, Message, Receive, Scope, Send
from .responses import send_outcome

__all__ = ["MessageLimitAction", "WebSocketDeny", "WebSocketLimits"]

WebSocketDeny = Literal["auto", "http", "close"]
"""How a refused connection is answered: an HTTP 429 before the handshake (``"http"``, the ASGI
``websocket.http.response`` extension), a close frame after accepting (``"close"``), or the first
one the server supports (``"auto"``)."""
MessageLimitAction = Literal["notify", "close"]
"""What a message over its limit does: a JSON ``rate_limit`` notice (``"notify"``) or closing the
connection with code 1008 (``"close"``)."""


POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
_NO_RATE_HEADERS = HeaderOptions("off")  # a refused handshake: content type, length, Retry-After
_UNAVAILABLE_HEADERS = ((b"content-type", b"application/problem+json"), (b"content-length", b"0"))
"""The fail-closed HTTP refusal of a handshake: an empty body."""


@mypyc_attr(allow_interpreted_subclasses=True)
class WebSocketLimits:
    """Connection and message limiting for the WebSocket rules of a middleware.

    Args:
        limiter: Checks the limits on its store.
        deny: How a refused connection is answered: ``"http"`` (a 429), ``"close"`` (a close frame after
            accepting) or ``"auto"`` (the first the server supports).
        on_message_limit: A message over its limit gets a JSON notice (``"notify"``) or closes the
            connection with 1008 (``"close"``).
    """

    def __init__(
        self, limiter: Limiter, deny: WebSocketDeny = "auto", on_message_limit: MessageLimitAction = "notify"
    ) -> None:
        if deny not in ("auto", "http", "close"):
            raise ConfigurationError(f"websocket_deny must be 'auto', 'http' or 'close', got {deny!r}")
        if on_message_limit not in ("notify", "close"):
            raise ConfigurationError(
                f"websocket_on_message_limit must be 'notify' or 'close', got {on_message_limit!r}"
            )
        self.limiter = limiter
        self.deny = deny
        self.on_message_limit = on_message_limit

    async def handle(
        self, app: ASGIApp, rules: Sequence[CompiledRule], scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve one WebSocket connection under ``rules``: check the connection, then each message.

        Args:
            app: The ASGI app serving it.
            rules: The WebSocket rules it matched.
            scope: The ASGI connection scope.
            receive: The ASGI ``receive`` callable.
            send: The ASGI ``send`` callable.
        """
        connect_rules = [r for r in rules if r.limits]
        if connect_rules:
            try:
                decision = await check_rules(self.limiter, connect_rules, scope)
            except LimitUnavailable:
                unavailable = Outcome(REFUSE, 503, list(_UNAVAILABLE_HEADERS))
                await self._refuse(scope, receive, send, unavailable, TRY_AGAIN_LATER)
                return
            if decision is not None and not decision.allowed:
                await self._refuse(scope, receive, send, outcome_of(decision, _NO_RATE_HEADERS), POLICY_VIOLATION)
                return
        message_rules = [r for r in rules if r.message_limits]
        if not message_rules:
            await app(scope, receive, send)
            return

        limiter = self.limiter
        close = self.on_message_limit == "close"

        async def limited_receive() -> Message:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                try:
                    decision = await check_rules(limiter, message_rules, scope, message=True)
                except LimitUnavailable:
                    # Fail-closed: no message may reach the app unchecked; the client may reconnect later.
                    await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": "rate limiter unavailable"})
                    return {"type": "websocket.disconnect", "code": TRY_AGAIN_LATER}
                if decision is None or decision.allowed:
                    return message
                if close:
                    await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": "rate limited"})
                    return {"type": "websocket.disconnect", "code": POLICY_VIOLATION}
                retry = decision.retry_after
                notice = {
                    "type": "rate_limit",
                    "retry_after": None if math.isinf(retry) else round(retry, 3),
                    "limit": decision.limit,
                    "policy": decision.policy,
                }
                await send({"type": "websocket.send", "text": json.dumps(notice)})

        await app(scope, limited_receive, send)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        refusal: Outcome,
        code: int,
    ) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        extensions = scope.get("extensions") or {}
        use_http = self.deny == "http" or (self.deny == "auto" and "websocket.http.response" in extensions)
        if use_http and "websocket.http.response" in extensions:
            await send_outcome(send, refusal, websocket=True)
            return
        await send({"type": "websocket.close", "code": code, "reason": "rate limited"})
