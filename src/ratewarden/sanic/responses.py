"""The core's answers (``ratewarden.enforcement.outcome``) as Sanic responses."""

from __future__ import annotations

from sanic.response import BaseHTTPResponse, HTTPResponse

from ..enforcement.outcome import Outcome

__all__ = ["add_headers", "answer_response", "outcome_response"]


def answer_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> HTTPResponse:
    """One of the limiter's own answers (the 429, the 503, the 400) with its body and complete
    header list, as given.

    Args:
        status: The HTTP status.
        body: The body.
        headers: The complete header list (content type and length included).
    """
    response = HTTPResponse(body, status=status, content_type=None)
    add_headers(response, headers)
    return response


def outcome_response(outcome: Outcome) -> HTTPResponse:
    """A refusal ``Outcome`` (the 429, the 503, the 400) as a Sanic response (``answer_response``).

    Args:
        outcome: The core's refusal.
    """
    return answer_response(outcome.status, outcome.body, outcome.headers)


def add_headers(response: BaseHTTPResponse, headers: list[tuple[bytes, bytes]]) -> None:
    """Add ``headers`` to ``response`` (a header may repeat).

    Args:
        response: The response.
        headers: The headers, as the check layer writes them.
    """
    for name, value in headers:
        response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
