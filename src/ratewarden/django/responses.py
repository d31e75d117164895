"""The limiter's answers as Django responses: the 429 and 503 of ``enforcement.answers``, byte for
byte, and the rate-limit headers added to an allowed response."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse  # type: ignore[import-untyped]

from ..decision import Decision
from ..enforcement.answers import (
    UNAVAILABLE_BODY,
    UNAVAILABLE_HEADERS,
    HeaderOptions,
    rejection,
    unavailable_answer,
)
from ..headers import HeaderStyle, rate_limit_headers

__all__ = ["add_headers", "answer_response", "too_many_requests", "unavailable"]


def answer_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    """One of the limiter's own answers as an ``HttpResponse``: the body and the complete header
    list (content type and length included) as given.

    Args:
        status: The HTTP status.
        body: The body.
        headers: The complete header list.
    """
    response = HttpResponse(body, status=status)
    for name, value in headers:
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    return response


def too_many_requests(decision: Decision, options: HeaderOptions, policy: bytes | None) -> Any:
    """The 429: RFC 9457 problem+json with ``Retry-After`` (``enforcement.answers.rejection``).

    Args:
        decision: The denying decision.
        options: Which rate-limit headers, if any.
        policy: The ``RateLimit-Policy`` value of every limit that applied; ``None`` uses the
            deciding limit's.
    """
    body, headers = rejection(decision, options, policy)
    return answer_response(429, body, headers)


def unavailable(exc: BaseException | None = None) -> Any:
    """The fail-closed 503 (the store or a key function failed under ``ON_ERROR = "closed"``), or
    the 400 of an ``AmbiguousRequest`` (``unavailable_answer``).

    Args:
        exc: The ``LimitUnavailable`` the check raised.
    """
    if exc is not None:
        return answer_response(*unavailable_answer(exc))
    return answer_response(503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS))


def add_headers(response: Any, decision: Decision, style: HeaderStyle, policy: bytes | None) -> None:
    """Add the rate-limit headers describing ``decision`` to an allowed response.

    Args:
        response: The view's ``HttpResponse`` (anything with ``headers``; others are left alone).
        decision: The allowing decision.
        style: Which rate-limit headers: ``"ietf"``, ``"legacy"`` or ``"both"``.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    headers = getattr(response, "headers", None)
    if headers is None:
        return
    for name, value in rate_limit_headers(decision, style, policy):
        headers[name.decode("latin-1")] = value.decode("latin-1")
