"""``enforcement.outcome``: the one answer the core makes, for plain rules (``outcome_of``), failed
checks (``failed``) and the policy (re-exported by ``policy.decider``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.decision import Decision
from ratewarden.enforcement.answers import HeaderOptions, limited_headers, rejection
from ratewarden.enforcement.outcome import ALLOW, ALLOWED, REFUSE, Outcome, failed, outcome_of, served
from ratewarden.errors import AmbiguousRequest, LimitUnavailable
from ratewarden.headers import rate_limit_headers
from ratewarden.policy import PolicyRule, WSGIPolicyMiddleware, decider

ALLOWING = Decision(True, 10, 7, 30.0, 0.0, 60.0, "api")
DENYING = Decision(False, 10, 0, 30.0, 12.5, 60.0, "api")
POLICY = b'"api";q=10;w=60, "day";q=1000;w=86400'


@pytest.mark.parametrize("mode", ["on_limit", "off"])
def test_an_allowed_request_without_headers_to_add_shares_one_outcome(mode: str) -> None:
    answers = HeaderOptions(mode)  # type: ignore[arg-type]
    assert outcome_of(ALLOWING, answers) is ALLOWED
    assert outcome_of(None, HeaderOptions()) is ALLOWED
    assert (ALLOWED.verdict, ALLOWED.status, ALLOWED.headers, ALLOWED.body) == (ALLOW, 200, [], b"")


@pytest.mark.parametrize("style", ["both", "ietf", "legacy"])
def test_an_allowed_request_carries_its_headers_in_the_chosen_style(style: str) -> None:
    outcome = outcome_of(ALLOWING, HeaderOptions("always", style), POLICY)  # type: ignore[arg-type]
    assert (outcome.verdict, outcome.status, outcome.body) == (ALLOW, 200, b"")
    assert outcome.headers == rate_limit_headers(ALLOWING, style, POLICY)  # type: ignore[arg-type]
    assert outcome.decision is ALLOWING


@pytest.mark.parametrize(("mode", "group"), [("always", None), ("on_limit", ""), ("off", "gold")])
def test_a_refusal_is_the_complete_429(mode: str, group: str | None) -> None:
    answers = HeaderOptions(mode)  # type: ignore[arg-type]
    outcome = outcome_of(DENYING, answers, POLICY, group)
    body, headers = rejection(DENYING, answers, POLICY, group)
    assert (outcome.verdict, outcome.status, outcome.body, outcome.headers) == (REFUSE, 429, body, headers)
    assert outcome.headers[:2] == [(b"content-type", b"application/problem+json"), (b"content-length", b"%d" % len(body))]
    assert outcome.added_headers() == limited_headers(DENYING, answers, POLICY)
    assert (b"retry-after", b"13") in outcome.headers
    assert ("remaining" in json.loads(body)) is (group is not None)


def test_each_refusal_has_its_own_header_list() -> None:
    first = outcome_of(DENYING, HeaderOptions())
    first.headers.append((b"x-outer", b"1"))  # outer middleware may append to what it is sent
    assert (b"x-outer", b"1") not in outcome_of(DENYING, HeaderOptions()).headers


def test_a_failed_check_is_its_400_or_503() -> None:
    unavailable = failed(LimitUnavailable("store down"))
    assert (unavailable.verdict, unavailable.status) == (REFUSE, 503)
    assert unavailable.added_headers() == [(b"retry-after", b"1")]
    ambiguous = failed(AmbiguousRequest("two Host headers"))
    assert (ambiguous.status, json.loads(ambiguous.body)["detail"]) == (400, "two Host headers")
    assert ambiguous.added_headers() == []


def test_the_policy_uses_the_same_outcome() -> None:
    assert decider.Outcome is Outcome
    assert decider.failed is failed
    assert (decider.ALLOW, decider.REFUSE) == (ALLOW, REFUSE)


def test_a_request_served_despite_its_decision_gets_the_allowed_headers() -> None:
    """A shadow limit's refusal is served: its rate-limit headers, never the 429's."""
    shadowed = served(DENYING, HeaderOptions(), POLICY)
    assert (shadowed.verdict, shadowed.status, shadowed.body) == (ALLOW, 200, b"")
    assert shadowed.headers == rate_limit_headers(DENYING, "both", POLICY)
    assert served(DENYING, HeaderOptions("on_limit")) is ALLOWED


def test_a_shadow_policy_serves_its_refusals_with_the_allowed_headers() -> None:
    """``Decider._outcome`` through a door: the shadow refusal's response is the app's, with the
    rate-limit headers (``r=0``) and ``RateLimit-Shadow``, not the 429's content type and length."""

    def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]

    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), [PolicyRule("/api/**", "1/min", name="api")], shadow=True)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "QUERY_STRING": "", "SCRIPT_NAME": "",
               "SERVER_NAME": "test", "SERVER_PORT": "80", "REMOTE_ADDR": "10.0.0.1", "wsgi.url_scheme": "http"}
    started: list[Any] = []
    for _ in range(2):
        started.clear()
        body = b"".join(app(dict(environ), lambda status, headers, exc_info=None: started.append((status, headers))))
    status, headers = started[0]
    names = [name.lower() for name, _ in headers]
    assert (status, body) == ("200 OK", b"hello")
    assert names.count("content-type") == 1 and "content-length" not in names
    assert dict(headers)["ratelimit"].startswith('"api";r=0;t=')
    assert "ratelimit-shadow" in names
