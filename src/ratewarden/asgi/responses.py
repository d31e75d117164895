"""The 429 and 503 answers, as RFC 9457 ``application/problem+json``, sent straight over ASGI.

Every answer the limiter writes itself goes out through ``send_answer`` (``send_limited`` for a 429,
``send_unavailable`` for a 503, ``send_problem`` for a ban), and a custom ``on_limit`` answer through
``send_on_limit``: the middleware, the edge and the policy middleware share them.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ..caches import remember
from ..decision import Decision
from ..headers import HeaderStyle, rate_limit_headers, retry_after_header
from ..types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "UNAVAILABLE_BODY",
    "LimitHandler",
    "adding_missing_headers",
    "limited_headers",
    "problem",
    "problem_body",
    "rejection",
    "send_answer",
    "send_limited",
    "send_on_limit",
    "send_problem",
    "send_unavailable",
    "too_many_requests_body",
    "too_many_requests_problem",
]

LimitHandler = Callable[[Scope, Decision], "ASGIApp | Awaitable[ASGIApp]"]
"""Custom 429 handler: returns an ASGI app (e.g. a Starlette ``Response``) to send."""


def problem(status: int, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    """An RFC 9457 problem object.

    Args:
        status: The HTTP status.
        title: A short summary of the problem type.
        detail: This occurrence, explained.
        **extra: Further members (e.g. ``retry_after``).
    """
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}


def problem_body(status: int, title: str, detail: str, **extra: Any) -> bytes:
    """``problem`` encoded as JSON.

    Args:
        status: The HTTP status.
        title: A short summary of the problem type.
        detail: This occurrence, explained.
        **extra: Further members.
    """
    return json.dumps(problem(status, title, detail, **extra)).encode()


UNAVAILABLE_BODY = problem_body(503, "Service Unavailable", "The rate limiter is unavailable; try again shortly.")
"""The fail-closed answer's body (the store or a key function failed)."""


_UNAVAILABLE_HEADERS = (
    (b"content-type", b"application/problem+json"),
    (b"content-length", b"%d" % len(UNAVAILABLE_BODY)),
    (b"retry-after", b"1"),
)


def send_unavailable(send: Send) -> Awaitable[None]:
    """Answer 503 with ``Retry-After: 1``: the fail-closed policy.

    Args:
        send: The ASGI ``send`` callable.
    """
    return send_answer(send, 503, UNAVAILABLE_BODY, list(_UNAVAILABLE_HEADERS))


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
    style: HeaderStyle,
    with_rate_headers: bool,
    policy: bytes | None = None,
    group: str | None = None,
) -> Awaitable[None]:
    """Answer the default 429 for ``decision`` (``rejection``'s body and headers).

    No coroutine of its own: it returns ``send_answer``'s, so the 429 path awaits one coroutine as
    when each caller wrote its own.

    Args:
        send: The ASGI ``send`` callable.
        decision: The denying decision.
        style: Which rate-limit headers.
        with_rate_headers: Whether the rate-limit headers are sent too.
        policy: The ``RateLimit-Policy`` value; ``None`` uses the deciding limit's.
        group: The policy middleware's body (see ``too_many_requests_problem``); ``None`` for the default.
    """
    body, headers = rejection(decision, style, with_rate_headers, policy, group)
    return send_answer(send, 429, body, headers)


async def send_on_limit(
    answer: ASGIApp | Awaitable[ASGIApp | None] | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    decision: Decision,
    style: HeaderStyle,
    with_rate_headers: bool,
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
        style: Which rate-limit headers.
        with_rate_headers: Whether the rate-limit headers are sent too.
        policy: The ``RateLimit-Policy`` value; ``None`` uses the deciding limit's.
        headers: ``limited_headers`` already built for these arguments (built here when ``None``).
    """
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        await send_limited(send, decision, style, with_rate_headers, policy)
        return
    if headers is None:
        headers = limited_headers(decision, style, with_rate_headers, policy)
    await answer(scope, receive, adding_missing_headers(send, headers))


def too_many_requests_body(decision: Decision, group: str | None = None) -> bytes:
    """The 429 problem as JSON bytes.

    Args:
        decision: The denying decision.
        group: See ``too_many_requests_problem``.
    """
    return json.dumps(too_many_requests_problem(decision, group)).encode()


_Headers = list[tuple[bytes, bytes]]
_rejections: dict[tuple[object, ...], tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = {}
_REJECTIONS_LIMIT = 4096


def rejection(
    decision: Decision,
    style: HeaderStyle,
    with_rate_headers: bool,
    policy: bytes | None = None,
    group: str | None = None,
) -> tuple[bytes, _Headers]:
    """The 429 body and its complete header list (content type and length included).

    Both depend only on a few small integers of the decision, so they are built once and reused:
    a flood of rejections costs a dictionary lookup each, not a JSON encoding. The header list is a
    fresh copy every time, since outer middleware may append to it.

    Args:
        decision: The denying decision.
        style: Which rate-limit headers: ``"ietf"`` (``RateLimit``/``RateLimit-Policy``), ``"legacy"``
            (``X-RateLimit-*``) or ``"both"``.
        with_rate_headers: Whether the rate-limit headers are sent too.
        policy: The ``RateLimit-Policy`` value listing every limit that applied (``policy_of``); ``None``
            uses the deciding limit's.
        group: See ``too_many_requests_problem``.
    """
    retry = None if math.isinf(decision.retry_after) else max(1, math.ceil(decision.retry_after))
    cache_key = (
        decision.policy, decision.limit, decision.period, decision.remaining,
        math.ceil(decision.reset_after), retry, style, with_rate_headers, policy, group,
    )
    found = _rejections.get(cache_key)
    if found is None:
        body = too_many_requests_body(decision, group)
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", b"%d" % len(body)),
            *limited_headers(decision, style, with_rate_headers, policy),
        ]
        found = (body, tuple(headers))
        remember(_rejections, cache_key, found, _REJECTIONS_LIMIT)
    return found[0], list(found[1])


def too_many_requests_problem(decision: Decision, group: str | None = None) -> dict[str, Any]:
    """The 429 problem object: what was exceeded and when to retry.

    Args:
        decision: The denying decision.
        group: ``None`` for the default body; a string for the policy middleware's, which adds
            ``remaining`` and, when not empty, the caller's ``group`` (named in ``detail`` too).
    """
    if math.isinf(decision.retry_after):
        detail = f"This request costs more than the limit of {decision.limit} allows; it can never be served."
        retry: int | None = None
    else:
        retry = max(1, math.ceil(decision.retry_after))
        detail = f"Rate limit of {decision.limit} per {decision.period:g}s exceeded; retry after {retry}s."
    if group is None:
        return problem(429, "Too Many Requests", detail, policy=decision.policy, limit=decision.limit, retry_after=retry)
    extra: dict[str, Any] = {
        "policy": decision.policy,
        "limit": decision.limit,
        "remaining": decision.remaining,
        "retry_after": retry,
    }
    if group:
        extra["group"] = group
        detail = f"{detail[:-1]} (group {group!r})."
    return problem(429, "Too Many Requests", detail, **extra)


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
    raw = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", b"%d" % len(body)),
        *(headers or ()),
    ]
    return send_answer(send, status, body, raw)


def limited_headers(
    decision: Decision, style: HeaderStyle, with_rate_headers: bool, policy: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    """Headers for a 429: the rate-limit headers (if on) and ``Retry-After``.

    Args:
        decision: The denying decision.
        style: Which rate-limit headers: ``"ietf"`` (``RateLimit``/``RateLimit-Policy``), ``"legacy"``
            (``X-RateLimit-*``) or ``"both"``.
        with_rate_headers: Whether the rate-limit headers are sent too.
        policy: The ``RateLimit-Policy`` value listing every limit that applied (``policy_of``); ``None``
            uses the deciding limit's.
    """
    headers = rate_limit_headers(decision, style, policy) if with_rate_headers else []
    retry = retry_after_header(decision)
    if retry is not None:
        headers.append(retry)
    return headers


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
