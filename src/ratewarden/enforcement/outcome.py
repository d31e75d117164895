"""The one answer the core makes for a request, whichever door asked: the ``Outcome``.

A door translates its request, makes one call to the core and sends the ``Outcome`` in its
framework's idiom: a refusal's status, complete header list and body as they are, or an allowed
request's headers added to the app's response. Plain rules get theirs from ``outcome_of`` (a
``Decision``) and ``failed`` (a ``LimitUnavailable``); the policy (``policy.decider``) makes
its refusals and rate-limit headers with the same ``outcome_of``.
"""

from __future__ import annotations

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..headers import add_rate_limit_headers, rate_limit_headers
from .answers import HeaderOptions, rejection, unavailable_answer

__all__ = ["ALLOW", "ALLOWED", "REFUSE", "SHADOW", "Outcome", "failed", "outcome_of", "served"]

ALLOW = "allow"
"""The request is served (it was allowed, or nothing was decided)."""
REFUSE = "refuse"
"""The request is answered with ``Outcome.status`` (429, a ban's 403/429, 400 or 503) and not served."""
SHADOW = "shadow"
"""A limit would have refused the request, but the policy is in shadow mode: it is served."""

_Headers = list[tuple[bytes, bytes]]


@mypyc_attr(allow_interpreted_subclasses=True)
class Outcome:
    """What a door does with a request once the store answered.

    ``verdict`` is ``ALLOW``, ``SHADOW`` or ``REFUSE``. A refusal carries its complete answer
    (``status``, ``headers`` with content type and length first, ``body``); a served request carries
    the headers to add to the app's response (rate-limit and ``RateLimit-Shadow``) with ``status``
    200 and an empty ``body``. ``headers`` is never changed in place (``ALLOWED``'s is shared).
    """

    __slots__ = ("body", "decision", "headers", "settle", "status", "strike", "verdict")

    def __init__(
        self, verdict: str, status: int, headers: _Headers, body: bytes = b"",
        decision: Decision | None = None, strike: bool = False, settle: bool = False,
    ) -> None:
        self.verdict = verdict
        self.status = status
        self.headers = headers
        self.body = body
        self.decision = decision  # the limits' decision (None: a ban, a failure, nothing to add)
        self.strike = strike  # count this refusal toward the client's ban (``ctx.ban_key``)
        self.settle = settle  # refund after-response charges once the response's status is known

    def added_headers(self) -> _Headers:
        """What a custom answer to this refusal (an ``on_limit``, an error handler) gets where it set
        none of that name: ``Retry-After`` and the rate-limit headers, without content type and length."""
        return self.headers[2:]


ALLOWED = Outcome(ALLOW, 200, [])
"""Served with nothing to add: shared, so an allowed request without headers allocates nothing."""


def outcome_of(
    decision: Decision | None, answers: HeaderOptions, policy: bytes | None = None, group: str | None = None
) -> Outcome:
    """The ``Outcome`` of a plain rule check: a refusal's complete 429 (``rejection``: problem+json
    body, headers in ``answers``' style with ``Retry-After``), or an allowed request's rate-limit
    headers to add (``ALLOWED`` when ``answers`` adds none, or nothing was decided).

    Args:
        decision: The check's decision (``None``: no limit applied).
        answers: When and which rate-limit headers are sent.
        policy: The ``RateLimit-Policy`` value listing every limit that applied; ``None`` uses the
            deciding limit's.
        group: The 429 body's (``too_many_requests_problem``): ``None`` for the default, a string
            for the policy's.
    """
    if decision is None:
        return ALLOWED
    if decision.allowed:  # ``served``, written out: the middleware's hot path makes one call
        if not answers.always:
            return ALLOWED
        headers: _Headers = []
        add_rate_limit_headers(headers, decision, answers.style, policy)
        return Outcome(ALLOW, 200, headers, b"", decision)
    body, headers = rejection(decision, answers, policy, group)
    return Outcome(REFUSE, 429, headers, body, decision)


def served(decision: Decision, answers: HeaderOptions, policy: bytes | None = None) -> Outcome:
    """The ``Outcome`` of a request served whatever ``decision`` says (allowed, or refused by a
    limit in shadow mode): its rate-limit headers to add (``ALLOWED`` when ``answers`` adds none).

    Args:
        decision: The decision the headers describe.
        answers: When and which rate-limit headers are sent.
        policy: The ``RateLimit-Policy`` value listing every limit that applied.
    """
    if not answers.always:
        return ALLOWED
    return Outcome(ALLOW, 200, rate_limit_headers(decision, answers.style, policy), b"", decision)


def failed(exc: BaseException) -> Outcome:
    """The outcome of a check that raised ``LimitUnavailable``: 400 for an ``AmbiguousRequest``,
    else the fail-closed 503 (``unavailable_answer``).

    Args:
        exc: What the check raised.
    """
    status, body, headers = unavailable_answer(exc)
    return Outcome(REFUSE, status, headers, body)
