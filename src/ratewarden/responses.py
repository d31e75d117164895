"""The 429 and 503 answers, as RFC 9457 ``application/problem+json``, sent straight over ASGI."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from .caches import remember
from .decision import Decision
from .headers import HeaderStyle, rate_limit_headers, retry_after_header
from .types import ASGIApp, Message, Scope, Send

__all__ = [
    "UNAVAILABLE_BODY",
    "LimitHandler",
    "adding_missing_headers",
    "limited_headers",
    "problem",
    "problem_body",
    "rejection",
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


async def send_unavailable(send: Send) -> None:
    """Answer 503 with ``Retry-After: 1``: the fail-closed policy.

    Args:
        send: The ASGI ``send`` callable.
    """
    await send_problem(send, 503, UNAVAILABLE_BODY, [(b"retry-after", b"1")])


def too_many_requests_body(decision: Decision) -> bytes:
    """The 429 problem as JSON bytes.

    Args:
        decision: The denying decision.
    """
    return json.dumps(too_many_requests_problem(decision)).encode()


_Headers = list[tuple[bytes, bytes]]
_rejections: dict[tuple[object, ...], tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = {}
_REJECTIONS_LIMIT = 4096


def rejection(
    decision: Decision, style: HeaderStyle, with_rate_headers: bool, policy: bytes | None = None
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
            leaves that header out.
    """
    retry = None if math.isinf(decision.retry_after) else max(1, math.ceil(decision.retry_after))
    cache_key = (
        decision.policy, decision.limit, decision.period, decision.remaining,
        math.ceil(decision.reset_after), retry, style, with_rate_headers, policy,
    )
    found = _rejections.get(cache_key)
    if found is None:
        body = too_many_requests_body(decision)
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", b"%d" % len(body)),
            *limited_headers(decision, style, with_rate_headers, policy),
        ]
        found = (body, tuple(headers))
        remember(_rejections, cache_key, found, _REJECTIONS_LIMIT)
    return found[0], list(found[1])


def too_many_requests_problem(decision: Decision) -> dict[str, Any]:
    """The 429 problem object: what was exceeded and when to retry.

    Args:
        decision: The denying decision.
    """
    if math.isinf(decision.retry_after):
        detail = f"This request costs more than the limit of {decision.limit} allows; it can never be served."
        retry: int | None = None
    else:
        retry = max(1, math.ceil(decision.retry_after))
        detail = f"Rate limit of {decision.limit} per {decision.period:g}s exceeded; retry after {retry}s."
    return problem(429, "Too Many Requests", detail, policy=decision.policy, limit=decision.limit, retry_after=retry)


async def send_problem(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
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
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


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
            leaves that header out.
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
