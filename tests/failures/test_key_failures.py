"""Issue 28, finding 5: a key function that raises never lifts the limit, on any door. Under
fail-open the request is charged to ``key-error:<client address>`` per rule (so the failing
requests of one client together get the rule's limit), under fail-closed it is refused (503); a key
function whose signature the door cannot call is a ``ConfigurationError`` where it is declared."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from flask import Flask, request

from ratewarden import ConfigurationError, Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.enforcement.core import failure_counts
from ratewarden.fastapi import RateLimit, install
from ratewarden.flask import RateLimiter
from ratewarden.metrics import Metrics
from ratewarden.policy import WSGIPolicyMiddleware
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.core.asgi import request as asgi_request
from tests.failures.harness import INTEGRATIONS, LIMIT
from tests.policy.test_wsgi_policy import hello, statuses


@pytest.fixture(autouse=True)
def unthrottled_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)


def broken(scope: Any) -> str:
    raise RuntimeError("auth service down")


@pytest.mark.parametrize("integration", sorted(INTEGRATIONS))
async def test_asgi_doors_charge_the_client_address_when_the_key_raises(
    integration: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = INTEGRATIONS[integration](Limiter(MemoryStore()), Metrics(otel=False))
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            seen = [await driver.attempt("client-a", boom=True) for _ in range(LIMIT + 2)]
    finally:
        await driver.close()
    assert seen == ["served"] * LIMIT + ["limited"] * 2, seen
    assert driver.calls == LIMIT
    assert any("RuntimeError: key service down" in r.getMessage() for r in caplog.records)


async def test_the_fastapi_edge_charges_the_client_address_when_the_key_raises() -> None:
    app = FastAPI()
    install(app)

    @app.get("/x", dependencies=[Depends(RateLimit("2/min", key=broken, limiter=Limiter(MemoryStore())))])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    assert [(await asgi_request(app, "/x")).status for _ in range(4)] == [200, 200, 429, 429]
    other = await asgi_request(app, "/x", client=("198.51.100.9", 1))
    assert other.status == 200  # another address: its own count


async def test_a_failing_key_is_logged_counted_and_the_address_counts_apart(caplog: pytest.LogCaptureFixture) -> None:
    before = failure_counts().get(("key function", "RuntimeError"), 0)
    app = RateLimitMiddleware(hello_asgi, Limiter(MemoryStore()), [Rule("/**", "2/min", key=broken, name="api")])
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        assert [(await asgi_request(app, "/x")).status for _ in range(3)] == [200, 200, 429]
    assert (
        "rate limit check failed (key function): RuntimeError: auth service down; "
        "rule 'api' charges key-error:203.0.113.7 instead"
    ) in [r.getMessage() for r in caplog.records]
    assert (await asgi_request(app, "/x", client=("198.51.100.9", 1))).status == 200
    assert failure_counts()[("key function", "RuntimeError")] - before == 4


async def hello_asgi(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("door", ["wsgi", "wsgi-policy"])
def test_wsgi_doors_charge_the_client_address_when_the_key_raises(door: str) -> None:
    rules = [Rule("/api/**", "2/min", key=broken), Rule("/api/**", "100/min", name="wide")]
    for matched in (rules[:1], rules):  # one rule (the inline path), several rules
        limiter = Limiter(MemoryStore())
        app: Any = WSGIRateLimitMiddleware(hello, limiter, matched) if door == "wsgi" else (
            WSGIPolicyMiddleware(hello, limiter, matched)
        )
        assert statuses(app, "/api/x", 4) == [200, 200, 429, 429]
        assert statuses(app, "/api/x", 1, ip="10.0.0.2") == [200]


def test_flask_charges_the_client_address_when_the_key_raises() -> None:
    app = Flask(__name__)
    limiter = RateLimiter(app, limiter=Limiter(MemoryStore()))

    @app.get("/f")
    @limiter.limit("2/min", key=broken)
    def f() -> str:
        return "ok"

    client = app.test_client()
    assert [client.get("/f").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert app.test_client().get("/f", environ_base={"REMOTE_ADDR": "10.9.9.9"}).status_code == 200


def test_flask_accepts_flask_limiters_zero_argument_key_functions() -> None:
    """The issue's case: ``key=get_user`` without arguments served 5 of 5 with a TypeError logged."""
    app = Flask(__name__)

    def get_user() -> str:
        return request.args.get("user", "anonymous")

    limiter = RateLimiter(app, limiter=Limiter(MemoryStore()), key=get_user)

    @app.get("/own")
    @limiter.limit("2/min", key=get_user)
    def own() -> str:
        return "ok"

    @app.get("/default")
    @limiter.limit("2/min")
    def default() -> str:
        return "ok"

    client = app.test_client()
    for path in ("/own", "/default"):
        assert [client.get(f"{path}?user=ann").status_code for _ in range(5)] == [200, 200, 429, 429, 429]
        assert client.get(f"{path}?user=bob").status_code == 200


def test_a_key_function_the_door_cannot_call_is_refused_where_it_is_declared() -> None:
    def two(a: Any, b: Any) -> str:
        return "k"

    def keyword_only(*, scope: Any) -> str:
        return "k"

    def get_user() -> str:
        return "u"

    for key in (two, keyword_only):
        with pytest.raises(ConfigurationError, match=rf"Rule\('/x'\) key: {key.__name__}\(.* cannot be called with one argument"):
            Rule("/x", "1/s", key=key)
        with pytest.raises(ConfigurationError, match=key.__name__):
            RateLimiter().limit("1/s", key=key)
        with pytest.raises(ConfigurationError, match=key.__name__):
            RateLimiter(key=key)
        with pytest.raises(ConfigurationError, match=key.__name__):
            RateLimit("1/s", key=key, limiter=Limiter(MemoryStore()))
    with pytest.raises(ConfigurationError, match=r"get_user\(\).* cannot be called with one argument, the request's scope"):
        Rule("/x", "1/s", key=get_user)  # zero arguments: only the Flask door calls it that way
    with pytest.raises(ConfigurationError, match="cost: two"):
        Rule("/x", "1/s", cost=two)  # type: ignore[arg-type]


def broken_cost(scope: Any) -> float:
    raise RuntimeError("pricing service down")


async def test_a_cost_function_that_raises_charges_the_rules_own_cost_on_asgi(caplog: pytest.LogCaptureFixture) -> None:
    app = RateLimitMiddleware(hello_asgi, Limiter(MemoryStore()), [Rule("/**", "2/min", cost=broken_cost, name="api")])
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        assert [(await asgi_request(app, "/x")).status for _ in range(4)] == [200, 200, 429, 429]
    assert any("rule 'api' charges cost 1 instead" in r.getMessage() for r in caplog.records)


def test_a_cost_function_that_raises_charges_the_rules_own_cost_on_wsgi() -> None:
    app = WSGIRateLimitMiddleware(hello, Limiter(MemoryStore()), [Rule("/**", "2/min", cost=broken_cost)])
    assert statuses(app, "/x", 4) == [200, 200, 429, 429]
