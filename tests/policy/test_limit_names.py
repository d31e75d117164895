"""Issue 39: limit names in headers, 429 bodies and logs are the rates as the policy (or the code)
wrote them (``api.premium-100/s``), not the period in milliseconds (``api.premium-100/1000``); a
per-route decorator never shows a client the endpoint's module path."""

from __future__ import annotations

import logging

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.limits import Limit, make_limits
from ratewarden.policy import PolicyMiddleware, parse_policy
from ratewarden.rates import Rate
from ratewarden.starlette import limit
from tests.vectors.runner import FakeClock

from .apps import build_app, client, tiered_policy


@pytest.mark.parametrize(
    ("rates", "name", "names"),
    [
        ("100/s; 5000/hour", "api.premium", ["api.premium-100/s", "api.premium-5000/hour"]),
        ("10/second, 1000/day", "", ["10/second", "1000/day"]),
        (["2/min", Rate(100, 3600.0)], "api", ["api-2/min", "api-100/hour"]),
        ("5 per 30 seconds", "", ["5-per-30-seconds"]),
        ("200/500ms", "", ["200/500ms"]),
        ("100/min", "api", ["api"]),  # one rate: the name alone, as before
    ],
)
def test_limits_are_named_with_their_rates_as_written(rates: object, name: str, names: list[str]) -> None:
    assert [limit.name for limit in make_limits(rates, "fixed_window", name)] == names  # type: ignore[arg-type]


def test_a_limit_of_a_rate_object_is_named_by_its_text() -> None:
    assert Limit(Rate(100, 60.0)).name == "100/minute"
    assert Limit(Rate(5, 0.25)).name == "5/250ms"


def test_storage_keys_do_not_change_with_the_names() -> None:
    """Only what clients see changes: counters kept in a store across the upgrade still count."""
    (limit_,) = make_limits("10/s")
    assert limit_.suffix == "fixed_window:10/1000"


async def test_a_tiered_policys_headers_and_429_name_the_rates_as_written(caplog: pytest.LogCaptureFixture) -> None:
    text = tiered_policy(basic=2).replace('limits = ["2/min"]', 'limits = ["2/min", "50/hour"]')
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(text))
    caplog.set_level(logging.INFO, logger="ratewarden")
    async with client(app) as http:
        replies = [await http.get("/api/x", headers={"X-API-Key": "trial-1"}) for _ in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    assert replies[0].headers["ratelimit-policy"] == '"api.basic-2/min";q=2;w=60, "api.basic-50/hour";q=50;w=3600'
    assert replies[2].json()["policy"] == "api.basic-2/min"
    assert "60000" not in caplog.text and "3600000" not in caplog.text


def test_the_starlette_decorator_names_its_rate_not_the_endpoints_module_path() -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))

    @limit("1/min", limiter=limiter)
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    @limit("1/min", limiter=limiter)
    async def other(request: Request) -> PlainTextResponse:
        return PlainTextResponse("other")

    @limit("1/min", limiter=limiter, name="reports")
    async def report(request: Request) -> PlainTextResponse:
        return PlainTextResponse("report")

    app = Starlette(routes=[Route("/hello", hello), Route("/other", other), Route("/report", report)])
    with TestClient(app) as http:
        first, denied = http.get("/hello"), http.get("/hello")
        assert http.get("/other").status_code == 200  # each endpoint still counts on its own
        named = http.get("/report")
    assert denied.status_code == 429
    assert denied.json()["policy"] == "1/min" and first.headers["ratelimit-policy"] == '"1/min";q=1;w=60'
    assert __name__ not in denied.text and "hello" not in denied.headers["ratelimit"]
    assert named.headers["ratelimit-policy"] == '"reports";q=1;w=60'


def test_a_rule_label_names_what_clients_see_and_keeps_the_storage_name() -> None:
    rule = Rule("/x", "1/s; 10/min", name="internal.module.view", label="")
    assert [limit.name for limit in rule.limits] == ["1/s", "10/min"]
    assert rule.name == "internal.module.view"
