"""The policy's decision core (``policy/decider.py``) decides without I/O: these tests are
plain functions (no event loop) that drive its plan and outcome with decisions made by hand, and
the door answers exactly what the core says."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ratewarden import Decision, Limiter, MemoryStore, Rule
from ratewarden.context import STATE_KEY
from ratewarden.errors import AmbiguousRequest, LimitUnavailable
from ratewarden.policy import Bans, PolicyMiddleware
from ratewarden.policy.decider import ALLOW, REFUSE, SHADOW, failed
from ratewarden.policy.request_context import PolicyContext
from tests.core.asgi import http_scope

REFUSED = Decision(False, 5, 0, 30.0, 12.2, 60.0, "5-per-minute")
ALLOWED = Decision(True, 5, 4, 12.0, 0.0, 60.0, "5-per-minute")


async def _app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the core never calls the app")


def _middleware(**kwargs: Any) -> PolicyMiddleware:
    return PolicyMiddleware(_app, Limiter(MemoryStore()), [Rule("/api/**", "5/min")], **kwargs)


def _planned(mw: PolicyMiddleware, path: str = "/api/items") -> PolicyContext:
    ctx = mw._plan_request(http_scope(path))
    assert ctx is not None
    return ctx


def test_a_request_no_rule_limits_has_no_plan() -> None:
    assert _middleware()._plan_request(http_scope("/other")) is None


def test_the_plan_is_left_in_the_request_state() -> None:
    mw = _middleware()
    scope = http_scope("/api/items")
    ctx = mw._plan_request(scope)
    assert ctx is not None and scope["state"][STATE_KEY] is ctx
    assert [r.rule.path for r in mw._charged(ctx, scope)] == ["/api/**"]


def test_a_refusal_is_a_complete_429_that_strikes_a_ban() -> None:
    mw = _middleware()
    ctx = _planned(mw)
    ctx.ban_key = "203.0.113.7"
    outcome = mw._outcome(ctx, REFUSED)
    assert (outcome.verdict, outcome.status, outcome.strike, outcome.decision) == (REFUSE, 429, True, REFUSED)
    headers = dict(outcome.headers)
    assert headers[b"content-type"] == b"application/problem+json"
    assert headers[b"content-length"] == b"%d" % len(outcome.body)
    assert headers[b"retry-after"] == b"13"
    assert json.loads(outcome.body)["remaining"] == 0
    assert ctx.decision is REFUSED


def test_an_allowed_request_is_served_with_its_rate_limit_headers() -> None:
    mw = _middleware()
    outcome = mw._outcome(_planned(mw), ALLOWED)
    assert (outcome.verdict, outcome.status, outcome.body, outcome.strike) == (ALLOW, 200, b"", False)
    assert dict(outcome.headers)[b"x-ratelimit-remaining"] == b"4"


def test_shadow_mode_serves_what_a_limit_would_refuse_and_says_so() -> None:
    mw = _middleware(shadow=True)
    ctx = _planned(mw)
    outcome = mw._outcome(ctx, REFUSED)
    assert (outcome.verdict, outcome.status, outcome.body) == (SHADOW, 200, b"")
    assert dict(outcome.headers)[b"ratelimit-shadow"] == b'"5-per-minute";deny;r=0;t=13'
    assert ctx.would_deny is REFUSED


def test_a_ban_is_refused_with_its_status_and_the_seconds_left() -> None:
    mw = _middleware(bans=Bans(status=429))
    ctx = _planned(mw)
    assert mw._banned(ctx, 0.0) is None
    outcome = mw._banned(ctx, 2.2)
    assert outcome is not None
    assert (outcome.verdict, outcome.status, outcome.strike) == (REFUSE, 429, False)
    assert dict(outcome.headers)[b"retry-after"] == b"3"
    assert json.loads(outcome.body)["retry_after"] == 3


def test_a_failed_check_is_400_when_the_request_is_ambiguous_else_503() -> None:
    assert failed(AmbiguousRequest("two Forwarded headers disagree")).status == 400
    unavailable = failed(LimitUnavailable("store"))
    assert (unavailable.verdict, unavailable.status, dict(unavailable.headers)[b"retry-after"]) == (REFUSE, 503, b"1")


def test_the_door_answers_the_cores_outcome() -> None:
    mw = _middleware()
    scope = http_scope("/api/items")
    answers = [asyncio.run(mw.answer(http_scope("/api/items"))) for _ in range(5)]
    assert [status for status, _, _ in answers] == [200] * 5
    status, headers, body = asyncio.run(mw.answer(scope))
    ctx = scope["state"][STATE_KEY]
    assert ctx.decision is not None and not ctx.decision.allowed
    outcome = mw._outcome(ctx, ctx.decision)
    assert (status, headers, body) == (outcome.status, outcome.headers, outcome.body) and status == 429
