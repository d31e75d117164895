"""One request's check, shared by the middleware and ``@limit``: the request's scope, the check
(``enforcement.sync_check.check_blocking`` in sync code, ``enforcement.check.check_rules`` in async
code), and the answer: a response to send instead of the view's, or ``None`` to go on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..decision import Decision
from ..enforcement.answers import HeaderOptions
from ..enforcement.check import LimitUnavailable
from ..enforcement.core import check_steps
from ..enforcement.outcome import ALLOWED, REFUSE, Outcome, failed, outcome_of
from ..limiter import Limiter
from ..rules import CompiledRule
from ..steps import Await, Machine, drive_blocking, driven
from .config import OnLimit
from .responses import outcome_response
from .scope import REQUEST_KEY, request_scope

__all__ = ["Answered", "check_async", "check_sync", "custom_refusal", "outcome_async", "outcome_sync"]

Answered = tuple[Decision | None, Any, Outcome]
"""The decision (``None``: none made), the response to send instead of the view's (``None``: call
it) and the core's ``Outcome`` (an allowed one's ``headers`` go on the view's response)."""


def check_sync(limiter: Limiter, rules: Sequence[CompiledRule], request: Any) -> Decision | None:
    """Charge ``request`` to ``rules`` without an event loop (raises ``LimitUnavailable`` under the
    fail-closed policy).

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
    """
    return drive_blocking(_check_steps(limiter, rules, request))


async def check_async(limiter: Limiter, rules: Sequence[CompiledRule], request: Any) -> Decision | None:
    """``check_sync`` for async code (async views, ASGI), with its arguments: the store asked
    without blocking the loop."""
    return await driven(_check_steps(limiter, rules, request))


def _check_steps(limiter: Limiter, rules: Sequence[CompiledRule], request: Any) -> Machine[Decision | None]:
    """The core's check of ``request`` (``check_steps``), its scope carrying the request for key
    functions that read it."""
    scope = request_scope(request)
    scope[REQUEST_KEY] = request
    try:
        return (yield from check_steps(limiter, rules, scope))
    finally:
        scope.pop(REQUEST_KEY, None)


def custom_refusal(answer: Any, outcome: Outcome) -> Any:
    """``ON_LIMIT``'s response with the refusal ``outcome``'s ``Retry-After`` and rate-limit headers
    added where it has none of that name; ``None`` when it answered ``None`` (the 429 is sent).

    Args:
        answer: What ``ON_LIMIT`` returned.
        outcome: The core's refusal.
    """
    if answer is None:
        return None
    present = getattr(answer, "headers", None)
    if present is not None:
        for name, value in outcome.added_headers():
            text = name.decode("latin-1")
            if text not in present:
                present[text] = value.decode("latin-1")
    return answer


def outcome_sync(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, answers: HeaderOptions,
                 policy: bytes | None, on_limit: OnLimit | None = None) -> Answered:
    """The check of ``check_sync`` and the core's ``Outcome`` of it, with the response it sends: the
    429 (or ``ON_LIMIT``'s answer), the fail-closed 503, or ``None``.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
        answers: When and which rate-limit headers are sent.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
        on_limit: Answers instead of the 429 (``ON_LIMIT``); ``None``: the 429.
    """
    return drive_blocking(_outcome_steps(limiter, rules, request, answers, policy, on_limit))


async def outcome_async(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, answers: HeaderOptions,
                        policy: bytes | None, on_limit: OnLimit | None = None) -> Answered:
    """``outcome_sync`` for async code, with its arguments; ``on_limit`` may be ``async def`` here."""
    return await driven(_outcome_steps(limiter, rules, request, answers, policy, on_limit))


def _outcome_steps(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, answers: HeaderOptions,
                   policy: bytes | None, on_limit: OnLimit | None) -> Machine[Answered]:
    """``outcome_sync`` as a step machine: an ``async def`` ``ON_LIMIT`` is awaited by the async
    driver and refused by the blocking one."""
    try:
        decision = yield from _check_steps(limiter, rules, request)
    except LimitUnavailable as exc:
        return None, outcome_response(failed(exc)), ALLOWED
    outcome = outcome_of(decision, answers, policy)
    if outcome.verdict != REFUSE:
        return decision, None, outcome
    if on_limit is not None and decision is not None:
        answer = on_limit(request, decision)
        if hasattr(answer, "__await__"):
            answer = yield Await(answer, "RATEWARDEN['ON_LIMIT'] (async def works under ASGI only)")
        answer = custom_refusal(answer, outcome)
        if answer is not None:
            return decision, answer, outcome
    return decision, outcome_response(outcome), outcome
