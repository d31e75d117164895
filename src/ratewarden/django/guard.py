"""One request's check, shared by the middleware and ``@limit``: the request's scope, the check
(``enforcement.sync_check.check_blocking`` in sync code, ``enforcement.check.check_rules`` in async
code), and the answer: a response to send instead of the view's, or ``None`` to go on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..decision import Decision
from ..enforcement.answers import HeaderOptions, limited_headers
from ..enforcement.check import LimitUnavailable, check_rules
from ..enforcement.sync_check import check_blocking
from ..limiter import Limiter
from ..rules import CompiledRule
from .config import OnLimit
from .responses import too_many_requests, unavailable
from .scope import REQUEST_KEY, request_scope

__all__ = ["Outcome", "check_async", "check_sync", "custom_refusal", "outcome_async", "outcome_sync", "refusal"]

Outcome = tuple[Decision | None, Any]
"""The decision (``None``: none made) and the response to send instead of the view's (``None``: call it)."""


def check_sync(limiter: Limiter, rules: Sequence[CompiledRule], request: Any) -> Decision | None:
    """Charge ``request`` to ``rules`` without an event loop (raises ``LimitUnavailable`` under the
    fail-closed policy).

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
    """
    scope = request_scope(request)
    scope[REQUEST_KEY] = request
    try:
        return check_blocking(limiter, rules, scope)
    finally:
        scope.pop(REQUEST_KEY, None)


async def check_async(limiter: Limiter, rules: Sequence[CompiledRule], request: Any) -> Decision | None:
    """``check_sync`` for async code (async views, ASGI): the store asked without blocking the loop.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
    """
    scope = request_scope(request)
    scope[REQUEST_KEY] = request
    try:
        return await check_rules(limiter, rules, scope)
    finally:
        scope.pop(REQUEST_KEY, None)


def refusal(decision: Decision | None, answers: HeaderOptions, policy: bytes | None) -> Any:
    """The 429 for a denying decision; ``None`` otherwise.

    Args:
        decision: The check's decision (``None``: none made).
        answers: Which rate-limit headers go on the 429, if any.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    if decision is None or decision.allowed:
        return None
    return too_many_requests(decision, answers, policy)


def custom_refusal(answer: Any, decision: Decision, answers: HeaderOptions, policy: bytes | None) -> Any:
    """``ON_LIMIT``'s response with the 429's ``Retry-After`` and rate-limit headers added where it
    has none of that name; ``None`` when it answered ``None`` (the 429 is sent).

    Args:
        answer: What ``ON_LIMIT`` returned.
        decision: The denying decision.
        answers: Which rate-limit headers go with ``Retry-After``, if any.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    if answer is None:
        return None
    if hasattr(answer, "__await__"):
        getattr(answer, "close", lambda: None)()
        raise TypeError(
            "RATEWARDEN['ON_LIMIT'] returned an awaitable in a sync request: give a plain function "
            "(async def works under ASGI only)"
        )
    present = getattr(answer, "headers", None)
    if present is not None:
        for name, value in limited_headers(decision, answers, policy):
            text = name.decode("latin-1")
            if text not in present:
                present[text] = value.decode("latin-1")
    return answer


def outcome_sync(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, answers: HeaderOptions,
                 policy: bytes | None, on_limit: OnLimit | None = None) -> Outcome:
    """The check of ``check_sync`` and what to answer: the 429, the fail-closed 503, or ``None``.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
        answers: When and which rate-limit headers are sent.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
        on_limit: Answers instead of the 429 (``ON_LIMIT``); ``None``: the 429.
    """
    try:
        decision = check_sync(limiter, rules, request)
    except LimitUnavailable as exc:
        return None, unavailable(exc)
    if on_limit is not None and decision is not None and not decision.allowed:
        answer = custom_refusal(on_limit(request, decision), decision, answers, policy)
        if answer is not None:
            return decision, answer
    return decision, refusal(decision, answers, policy)


async def outcome_async(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, answers: HeaderOptions,
                        policy: bytes | None, on_limit: OnLimit | None = None) -> Outcome:
    """``outcome_sync`` for async code.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
        answers: When and which rate-limit headers are sent.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
        on_limit: Answers instead of the 429 (``ON_LIMIT``; may be ``async def``); ``None``: the 429.
    """
    try:
        decision = await check_async(limiter, rules, request)
    except LimitUnavailable as exc:
        return None, unavailable(exc)
    if on_limit is not None and decision is not None and not decision.allowed:
        answer = on_limit(request, decision)
        if hasattr(answer, "__await__"):
            answer = await answer
        answer = custom_refusal(answer, decision, answers, policy)
        if answer is not None:
            return decision, answer
    return decision, refusal(decision, answers, policy)
