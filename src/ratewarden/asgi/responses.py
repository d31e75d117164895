"""The 429 and 503 answers (``ratewarden.enforcement.answers``) sent straight over ASGI.

Every answer the limiter writes itself goes out through ``send_answer`` (``send_limited`` for a 429,
``send_unavailable`` for a 503, ``send_problem`` for a ban), and a custom ``on_limit`` answer through
``send_on_limit``: the middleware, the edge and the policy middleware share them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from ..decision import Decision
from ..enforcement.answers import (
    UNAVAILABLE_BODY,
    UNAVAILABLE_HEADERS,
    HeaderOptions,
    limited_headers,
    problem_headers,
    rejection,
    unavailable_answer,
)
from ..types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LimitHandler",
    "adding_missing_headers",
    "send_answer",
    "send_limited",
    "send_on_limit",
    "send_problem",
    "send_unavailable",
]

LimitHandler = Callable[[Scope, Decision], "ASGIApp | Awaitable[ASGIApp]"]
"""Custom 429 handler: returns an ASGI app (e.g. a Starlette ``Response``) to send."""


def send_unavailable(send: Send, exc: BaseException | None = None) -> Awaitable[None]:
    """Answer 503 with ``Retry-After: 1``: the fail-closed policy (400 for an ``AmbiguousRequest``:
    ``unavailable_answer``).

    Args:
        send: The ASGI ``send`` callable.
        exc: The ``LimitUnavailable`` the check raised.
    """
    if exc is not None:
        status, body, headers = unavailable_answer(exc)
        return send_answer(send, status, body, headers)
    return send_answer(send, 503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS))


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


def send_limited(
    send: Send,
    decision: Decision,
    options: HeaderOptions,
    policy: bytes | None = None,
    group: str | None = None,
) -> Awaitable[None]:
    """Answer the default 429 for ``decision`` (``rejection``'s body and headers).

    No coroutine of its own: it returns ``send_answer``'s, so the 429 path awaits one coroutine as
    when each caller wrote its own.

    Args:
        send: The ASGI ``send`` callable.
        decision: The denying decision.
        options: Which rate-limit headers, if any.
        policy: The ``RateLimit-Policy`` value; ``None`` uses the deciding limit's.
        group: The policy middleware's body (see ``too_many_requests_problem``); ``None`` for the default.
    """
    body, headers = rejection(decision, options, policy, group)
    return send_answer(send, 429, body, headers)


async def send_on_limit(
    answer: ASGIApp | Awaitable[ASGIApp | None] | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    decision: Decision,
    options: HeaderOptions,
    policy: bytes | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a custom ``on_limit`` answer, adding the 429's ``Retry-After`` and rate-limit headers it
    did not set itself; no answer (``None``) sends the default 429.

    Args:
        answer: What ``on_limit`` returned: an ASGI app, an awaitable of one, or ``None``.
        scope: The ASGI connection scope.
        receive: The ASGI ``receive`` callable.
        send: The ASGI ``send`` callable.
        decision: The denying decision.
        options: Which rate-limit headers, if any.
        policy: The ``RateLimit-Policy`` value; ``None`` uses the deciding limit's.
        headers: ``limited_headers`` already built for these arguments (built here when ``None``).
    """
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        await send_limited(send, decision, options, policy)
        return
    if headers is None:
        headers = limited_headers(decision, options, policy)
    await answer(scope, receive, adding_missing_headers(send, headers))


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
