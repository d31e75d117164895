"""One request's check, shared by the middleware and ``@limit``: the request's scope, the check
(``enforcement.blocking.check_blocking`` in sync code, ``enforcement.check.check_rules`` in async
code), and the answer: a response to send instead of the view's, or ``None`` to go on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..decision import Decision
from ..enforcement.blocking import check_blocking
from ..enforcement.check import LimitUnavailable, check_rules
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..rules import CompiledRule
from .responses import too_many_requests, unavailable
from .scope import REQUEST_KEY, request_scope

__all__ = ["Outcome", "check_async", "check_sync", "outcome_async", "outcome_sync", "refusal"]

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


def refusal(decision: Decision | None, headers: HeaderMode, style: HeaderStyle, policy: bytes | None) -> Any:
    """The 429 for a denying decision; ``None`` otherwise.

    Args:
        decision: The check's decision (``None``: none made).
        headers: When rate-limit headers are sent (``"off"``: not even on the 429).
        style: Which rate-limit headers.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    if decision is None or decision.allowed:
        return None
    return too_many_requests(decision, style, headers != "off", policy)


def outcome_sync(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, headers: HeaderMode,
                 style: HeaderStyle, policy: bytes | None) -> Outcome:
    """The check of ``check_sync`` and what to answer: the 429, the fail-closed 503, or ``None``.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
        headers: When rate-limit headers are sent.
        style: Which rate-limit headers.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    try:
        decision = check_sync(limiter, rules, request)
    except LimitUnavailable as exc:
        return None, unavailable(exc)
    return decision, refusal(decision, headers, style, policy)


async def outcome_async(limiter: Limiter, rules: Sequence[CompiledRule], request: Any, headers: HeaderMode,
                        style: HeaderStyle, policy: bytes | None) -> Outcome:
    """``outcome_sync`` for async code.

    Args:
        limiter: Checks the limits on its store.
        rules: The rules the request matched.
        request: The Django request.
        headers: When rate-limit headers are sent.
        style: Which rate-limit headers.
        policy: The ``RateLimit-Policy`` value of every limit that applied.
    """
    try:
        decision = await check_async(limiter, rules, request)
    except LimitUnavailable as exc:
        return None, unavailable(exc)
    return decision, refusal(decision, headers, style, policy)
