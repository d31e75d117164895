"""The limiter's answers as Flask responses: the 429 (``RateLimitExceeded``, a werkzeug
``TooManyRequests`` carrying ``enforcement.answers.rejection``'s bytes), the fail-closed 503, and
the rate-limit headers added to a response."""

from __future__ import annotations

import inspect
from typing import Any

from flask import Flask, Response, current_app
from werkzeug.datastructures import Headers
from werkzeug.exceptions import TooManyRequests
from werkzeug.wrappers import Response as BaseResponse

from ..decision import Decision
from ..enforcement.answers import (
    UNAVAILABLE_BODY,
    UNAVAILABLE_HEADERS,
    limited_headers,
    rejection,
    unavailable_answer,
)
from ..errors import RateLimitExceeded as _RateLimitExceeded
from ..headers import HeaderStyle, rate_limit_headers

__all__ = ["RateLimitExceeded", "add_headers", "answer_response", "unavailable_response"]


def answer_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
    """One of the limiter's own answers as the app's response class: the body and the complete
    header list (content type and length included) exactly as given.

    Args:
        status: The HTTP status.
        body: The body.
        headers: The complete header list.
    """
    response: Response = current_app.response_class(body, status)
    response.headers = Headers([(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers])
    return response


def unavailable_response(exc: BaseException | None = None) -> Response:
    """The fail-closed 503 (``on_error="closed"`` and the store or a key function failed), or the
    400 of an ``AmbiguousRequest`` (``unavailable_answer``).

    Args:
        exc: The ``LimitUnavailable`` the check raised.
    """
    if exc is not None:
        return answer_response(*unavailable_answer(exc))
    return answer_response(503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS))


class RateLimitExceeded(_RateLimitExceeded, TooManyRequests):
    """Raised on a denied request (a werkzeug ``TooManyRequests`` and a
    ``ratewarden.errors.RateLimitExceeded``); Flask answers it with ``response``, the problem+json 429, unless
    the app has an ``errorhandler(429)`` (or for ``RateLimitExceeded``), which receives it with
    ``decision`` to build its own answer (``Retry-After`` and the rate-limit headers are added to that
    answer if it lacks them).

    Args:
        decision: The denying decision.
        style: Which rate-limit headers the 429 carries: ``"both"``, ``"ietf"`` or ``"legacy"``.
        with_rate_headers: Whether it carries them at all (``Retry-After`` always).
        policy: The ``RateLimit-Policy`` value listing every limit that applied.
    """

    def __init__(self, decision: Decision, style: HeaderStyle, with_rate_headers: bool, policy: bytes | None) -> None:
        body, headers = rejection(decision, style, with_rate_headers, policy)
        super().__init__(description=body.decode(), response=answer_response(429, body, headers))
        self.decision = decision


def add_headers(response: BaseResponse, headers: list[tuple[bytes, bytes]], missing_only: bool = False) -> None:
    """Add ``headers`` to ``response``.

    Args:
        response: The response.
        headers: The headers, as the check layer writes them.
        missing_only: Leave out each header the response already has.
    """
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1")
        if not missing_only or name not in response.headers:
            response.headers.add(name, raw_value.decode("latin-1"))


def allowed_headers(decision: Decision, style: HeaderStyle, policy: bytes | None) -> list[tuple[bytes, bytes]]:
    """The rate-limit headers of an allowed request.

    Args:
        decision: The allowing decision.
        style: Which rate-limit headers.
        policy: The ``RateLimit-Policy`` value.
    """
    return rate_limit_headers(decision, style, policy)


def denied_headers(decision: Decision, style: HeaderStyle, with_rate_headers: bool, policy: bytes | None) -> list[tuple[bytes, bytes]]:
    """``Retry-After`` and (if on) the rate-limit headers of a denied request.

    Args:
        decision: The denying decision.
        style: Which rate-limit headers.
        with_rate_headers: Whether the rate-limit headers are included.
        policy: The ``RateLimit-Policy`` value.
    """
    return limited_headers(decision, style, with_rate_headers, policy)


# Flask 3 looks an error handler up with the blueprints given; Flask 2 reads them from the request
# being handled, so it can only be asked inside a request context.
_FIND_TAKES_BLUEPRINTS = len(inspect.signature(Flask._find_error_handler).parameters) >= 3


def unhandled(app: Flask, error: Exception, blueprints: list[str], in_request: bool) -> bool:
    """Whether no error handler of ``app`` or of ``blueprints`` would receive ``error`` (Flask's own
    lookup). ``False`` when that cannot be told here (Flask 2 outside a request): Flask decides.

    Args:
        app: The Flask app.
        error: The error that would be raised.
        blueprints: The names of the blueprints handling the request, innermost first.
        in_request: Whether this runs inside the request's context.
    """
    find: Any = getattr(app, "_find_error_handler", None)
    if find is None:
        return False
    if _FIND_TAKES_BLUEPRINTS:
        return find(error, blueprints) is None
    return in_request and find(error) is None
