"""The core's answers (``ratewarden.enforcement.outcome``) sent straight over ASGI.

Every answer the limiter writes itself goes out through ``send_answer``: an ``Outcome``'s refusal
through ``send_outcome``, a custom ``on_limit`` answer through ``answer_on_limit``, an allowed
request's headers through ``SendWithHeaders``; the middleware, the edge and the policy middleware
share them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..enforcement.answers import problem_headers
from ..enforcement.outcome import Outcome
from ..scopes import value_of
from ..types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LimitHandler",
    "SendWithHeaders",
    "adding_missing_headers",
    "answer_on_limit",
    "send_answer",
    "send_outcome",
    "send_problem",
]

LimitHandler = Callable[[Scope, Decision], "ASGIApp | Awaitable[ASGIApp]"]
"""Custom 429 handler: returns an ASGI app (e.g. a Starlette ``Response``) to send."""


def send_outcome(send: Send, outcome: Outcome, websocket: bool = False) -> Awaitable[None]:
    """Send a refusal ``Outcome`` as it is: its status, complete header list and body.

    Args:
        send: The ASGI ``send`` callable.
        outcome: The core's refusal.
        websocket: Refuse a WebSocket handshake (see ``send_answer``).
    """
    return send_answer(send, outcome.status, outcome.body, outcome.headers, websocket)


async def send_answer(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], websocket: bool = False
) -> None:
    """Write one of the limiter's own answers: the one place a 429 or 503 is sent.

    Args:
        send: The ASGI ``send`` callable.
        status: The HTTP status.
        body: The body.
        headers: The complete header list (content type and length included).
        websocket: Refuse a WebSocket handshake (the ``websocket.http.response`` extension's messages).
    """
    if websocket:
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def answer_on_limit(
    answer: ASGIApp | Awaitable[ASGIApp | None] | None, scope: Scope, receive: Receive, send: Send, outcome: Outcome,
    added: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a custom ``on_limit`` answer to the refusal ``outcome``, adding its ``Retry-After`` and
    rate-limit headers where the answer set none of that name; no answer (``None``) sends ``outcome``.

    Args:
        answer: What ``on_limit`` returned: an ASGI app, an awaitable of one, or ``None``.
        scope: The ASGI connection scope.
        receive: The ASGI ``receive`` callable.
        send: The ASGI ``send`` callable.
        outcome: The core's refusal of the request.
        added: ``outcome.added_headers()`` already taken (taken here when ``None``).
    """
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        await send_outcome(send, outcome)
        return
    await answer(scope, receive, adding_missing_headers(send, outcome.added_headers() if added is None else added))


def send_problem(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> Awaitable[None]:
    """Send an ``application/problem+json`` response.

    Args:
        send: The ASGI ``send`` callable.
        status: The HTTP status.
        body: The JSON body.
        headers: More headers; content type and length are added.
    """
    return send_answer(send, status, body, problem_headers(body, headers))


def adding_missing_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` that adds ``headers`` to the response start, except those whose name the app
    already set (so a custom ``on_limit`` answer keeps ``Retry-After`` and the rate-limit headers
    without getting a second copy of any it wrote itself).

    Args:
        send: The ASGI ``send`` callable.
        headers: Headers for the response start.
    """

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and headers:
            own = message.get("headers") or []
            present = {bytes(name).lower() for name, _ in own}
            message["headers"] = [*own, *(h for h in headers if h[0] not in present)]
        await send(message)

    return send_with_headers


@mypyc_attr(allow_interpreted_subclasses=True)
class SendWithHeaders:
    """An ASGI ``send`` that adds ``headers`` (an allowed ``Outcome``'s) to the response start.

    One small object per allowed request instead of a closure, and no coroutine of its own: calling
    it returns the wrapped ``send``'s awaitable.

    Args:
        send: The ASGI ``send`` to wrap.
        headers: The headers to add (never changed).
    """

    __slots__ = ("headers", "send")

    def __init__(self, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        self.send = send
        self.headers = headers

    def __call__(self, message: Message) -> Awaitable[None]:
        kind: str = message["type"]
        if kind == "http.response.start":
            message["headers"] = [*value_of(message, "headers", ()), *self.headers]
        return self.send(message)
