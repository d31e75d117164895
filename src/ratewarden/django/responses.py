"""The core's answers (``enforcement.outcome``) as Django responses: a refusal ``Outcome``'s 429,
503 or 400, byte for byte, and an allowed one's headers added to the view's response."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse  # type: ignore[import-untyped]

from ..enforcement.outcome import Outcome

__all__ = ["add_headers", "answer_response", "outcome_response"]


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


def outcome_response(outcome: Outcome) -> Any:
    """A refusal ``Outcome`` (the 429, the fail-closed 503, an ``AmbiguousRequest``'s 400) as an
    ``HttpResponse`` (``answer_response``).

    Args:
        outcome: The core's refusal.
    """
    return answer_response(outcome.status, outcome.body, outcome.headers)


def add_headers(response: Any, headers: list[tuple[bytes, bytes]]) -> None:
    """Add an allowed ``Outcome``'s headers to the view's response.

    Args:
        response: The view's ``HttpResponse`` (anything with ``headers``; others are left alone).
        headers: The headers to add.
    """
    present = getattr(response, "headers", None)
    if present is None:
        return
    for name, value in headers:
        present[name.decode("latin-1")] = value.decode("latin-1")
