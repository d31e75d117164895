"""The core's answers (``enforcement.outcome``) as Flask responses: the 429 (``RateLimitExceeded``,
a werkzeug ``TooManyRequests`` carrying the ``Outcome``'s bytes), the fail-closed 503, and the
rate-limit headers added to a response."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable
from typing import Any

from flask import Flask, Response, current_app
from werkzeug.datastructures import Headers
from werkzeug.exceptions import TooManyRequests
from werkzeug.wrappers import Response as BaseResponse

from ..decision import Decision
from ..enforcement.answers import UNAVAILABLE_BODY, UNAVAILABLE_HEADERS, HeaderOptions
from ..enforcement.outcome import Outcome, failed, outcome_of
from ..errors import RateLimitExceeded as _RateLimitExceeded
from ..limits import Limit
from ..rates import Rate
from ..rules import CompiledRule
from .settings import ResetFormat

__all__ = [
    "RateLimitExceeded",
    "add_headers",
    "answer_response",
    "epoch_reset",
    "limit_text",
    "outcome_for",
    "outcome_response",
    "unavailable_response",
]

# flask-limiter's (the limits library's) granularities that ratewarden's periods can be: "N per M <unit>".
_GRANULARITIES = (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0))


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
        return outcome_response(failed(exc))
    return answer_response(503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS))


def outcome_response(outcome: Outcome) -> Response:
    """A refusal ``Outcome`` as the app's response class, byte for byte (``answer_response``).

    Args:
        outcome: The core's refusal.
    """
    return answer_response(outcome.status, outcome.body, outcome.headers)


def outcome_for(decision: Decision, options: HeaderOptions, policy: bytes | None, reset: ResetFormat) -> Outcome:
    """The core's ``Outcome`` for ``decision`` (``outcome_of``) with ``X-RateLimit-Reset`` as ``reset``
    says: seconds left, or the ``"epoch"`` time (``epoch_reset``).

    Args:
        decision: The check's decision.
        options: Which rate-limit headers, if any.
        policy: The ``RateLimit-Policy`` value listing every limit that applied.
        reset: What ``X-RateLimit-Reset`` holds.
    """
    outcome = outcome_of(decision, options, policy)
    if reset != "epoch" or not outcome.headers:
        return outcome
    return Outcome(outcome.verdict, outcome.status, epoch_reset(outcome.headers), outcome.body, decision)


def limit_text(rate: Rate) -> str:
    """``rate`` as flask-limiter writes a limit (``str`` of a ``limits`` item, its 429's
    description): ``5 per 1 minute``, ``10 per 1 second``, ``100 per 30 minute``.

    Args:
        rate: The rate.
    """
    period = rate.period
    for unit, seconds in _GRANULARITIES:
        if period >= seconds and period % seconds == 0:
            return f"{rate.limit} per {int(period // seconds)} {unit}"
    return f"{rate.limit} per {round(period * 1000)} millisecond"  # no such limits granularity


def denying_limit(decision: Decision, rules: Iterable[CompiledRule]) -> Limit | None:
    """The limit of ``rules`` that made ``decision`` (its name, quota and period), or ``None``.

    Args:
        decision: The denying decision.
        rules: The rules the request was charged to.
    """
    for rule in rules:
        for limit in rule.limits:
            if limit.name == decision.policy and limit.period == decision.period:
                return limit
    return None


def epoch_reset(headers: list[tuple[bytes, bytes]], now: float | None = None) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``X-RateLimit-Reset`` as a Unix time (flask-limiter's) instead of seconds
    left: the moment more quota is made available, in whole seconds.

    Args:
        headers: The headers, as the check layer writes them (a new list is returned).
        now: The current Unix time (default: ``time.time()``).
    """
    base = int(time.time() if now is None else now)
    return [
        (name, b"%d" % (base + int(value))) if name == b"x-ratelimit-reset" else (name, value)
        for name, value in headers
    ]


class RateLimitExceeded(_RateLimitExceeded, TooManyRequests):
    """Raised on a denied request (a werkzeug ``TooManyRequests`` and a
    ``ratewarden.errors.RateLimitExceeded``); Flask answers it with ``response``, the problem+json 429, unless
    the app has an ``errorhandler(429)`` (or for ``RateLimitExceeded``), which receives it with
    ``decision`` to build its own answer (``Retry-After`` and the rate-limit headers are added to that
    answer if it lacks them).

    ``description`` is flask-limiter's text for the limit that was hit (``5 per 1 minute``), as
    flask-limiter's handlers expect; ``body`` is the problem+json text the default 429 sends.

    Args:
        decision: The denying decision.
        options: Which rate-limit headers the 429 carries, if any (``Retry-After`` always).
        policy: The ``RateLimit-Policy`` value listing every limit that applied.
        limit: The limit that was hit (``None``: described from the decision's quota and period).
        reset: What ``X-RateLimit-Reset`` holds: ``"seconds"`` left or the ``"epoch"`` time.
    """

    def __init__(
        self,
        decision: Decision,
        options: HeaderOptions,
        policy: bytes | None,
        limit: Limit | None = None,
        reset: ResetFormat = "seconds",
    ) -> None:
        outcome = outcome_for(decision, options, policy, reset)
        rate = limit.rate if limit is not None else Rate(max(1, decision.limit), decision.period or 1.0)
        super().__init__(description=limit_text(rate), response=outcome_response(outcome))
        self.decision = decision
        #: The core's refusal this 429 sends (its ``added_headers()`` go on a handler's own answer).
        self.outcome = outcome
        #: The problem+json text of the default 429 (``application/problem+json``).
        self.body = outcome.body.decode()


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
