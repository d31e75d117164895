"""A custom 429 with ``install(app)`` (issue 21): the app's own ``RateLimitExceeded`` handler, or
``install(app, on_limit=...)``, answers a denied request at the edge and when a dependency checks for
itself, with ``Retry-After`` and the rate-limit headers kept; ``install`` never replaces a handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ratewarden import Limiter, MemoryStore
from ratewarden.decision import Decision
from ratewarden.errors import ConfigurationError
from ratewarden.fastapi import RateLimit, RateLimitExceeded, install
from tests.core.asgi import Reply, request
from tests.vectors.runner import FakeClock


@pytest.fixture
def limiter() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


class Seen:
    """What the handlers were given, and what ran past the edge."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, RateLimitExceeded]] = []
        self.answered: list[tuple[str, Decision]] = []
        self.endpoint = 0


def limited_app(limiter: Limiter, seen: Seen, rate: str = "1/min") -> tuple[FastAPI, RateLimit]:
    app = FastAPI()
    dep = RateLimit(rate, limiter=limiter)
    other = RateLimit("100/min", limiter=limiter, name="other")

    @app.get("/work", dependencies=[Depends(dep), Depends(other)])
    async def work() -> dict[str, bool]:
        seen.endpoint += 1
        return {"ok": True}

    return app, other


def async_handler(seen: Seen) -> Callable[[Request, Exception], Any]:
    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RateLimitExceeded)
        seen.handled.append((request.url.path, exc))
        return JSONResponse({"error": "slow down", "limit": exc.decision.limit}, 429, headers={"X-Custom": "yes"})

    return handler


def sync_handler(seen: Seen) -> Callable[[Request, Exception], Any]:
    def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RateLimitExceeded)
        seen.handled.append((request.url.path, exc))
        return JSONResponse({"error": "slow down", "limit": exc.decision.limit}, 429, headers={"X-Custom": "yes"})

    return handler


def on_limit(seen: Seen) -> Callable[[Any, Decision], PlainTextResponse]:
    def answer(scope: Any, decision: Decision) -> PlainTextResponse:
        seen.answered.append((scope["path"], decision))
        return PlainTextResponse("custom 429", 429, headers={"X-Custom": "yes"})

    return answer


def async_on_limit(seen: Seen) -> Callable[[Any, Decision], Any]:
    async def answer(scope: Any, decision: Decision) -> PlainTextResponse:
        seen.answered.append((scope["path"], decision))
        return PlainTextResponse("custom 429", 429, headers={"X-Custom": "yes"})

    return answer


def assert_rate_headers_once(reply: Reply) -> None:
    assert reply.headers_named("retry-after") == ["60"]
    assert len(reply.headers_named("ratelimit")) == 1 and len(reply.headers_named("ratelimit-policy")) == 1
    assert reply.headers_named("x-ratelimit-remaining") == ["0"]
    assert reply.headers_named("x-ratelimit-limit") == ["1"]


async def two_requests(app: FastAPI) -> Reply:
    assert (await request(app, "/work")).status == 200
    return await request(app, "/work")


# --- the app's own exception handler --------------------------------------------------------------


@pytest.mark.parametrize("make_handler", [async_handler, sync_handler])
@pytest.mark.parametrize("registered", ["before", "after"])
async def test_exception_handler_answers_the_edge_429(
    limiter: Limiter, make_handler: Callable[[Seen], Any], registered: str
) -> None:
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    handler = make_handler(seen)
    if registered == "before":
        app.add_exception_handler(RateLimitExceeded, handler)
    install(app)
    if registered == "after":
        app.add_exception_handler(RateLimitExceeded, handler)
    limited = await two_requests(app)
    assert limited.status == 429 and limited.json() == {"error": "slow down", "limit": 1}
    assert limited.header("x-custom") == "yes" and limited.header("content-type") == "application/json"
    assert_rate_headers_once(limited)
    assert seen.endpoint == 1  # answered at the edge
    [(path, exc)] = seen.handled
    assert path == "/work" and not exc.decision.allowed and exc.status_code == 429
    assert exc.headers is not None and exc.headers["retry-after"] == "60"


async def test_install_keeps_a_handler_registered_before_it(limiter: Limiter) -> None:
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    handler = async_handler(seen)
    app.add_exception_handler(RateLimitExceeded, handler)
    install(app)
    assert app.exception_handlers[RateLimitExceeded] is handler


async def test_handler_for_status_429_answers_as_fastapi_would_call_it(limiter: Limiter) -> None:
    """FastAPI calls a status handler before a class handler for an ``HTTPException``."""
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    install(app)
    app.add_exception_handler(429, async_handler(seen))
    limited = await two_requests(app)
    assert limited.json() == {"error": "slow down", "limit": 1}
    assert_rate_headers_once(limited)


async def test_headers_the_handler_sets_itself_win(limiter: Limiter) -> None:
    async def handler(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("no", 429, headers={"Retry-After": "99", "X-RateLimit-Limit": "mine"})

    seen = Seen()
    app, _ = limited_app(limiter, seen)
    app.add_exception_handler(RateLimitExceeded, handler)
    install(app)
    limited = await two_requests(app)
    assert limited.body == b"no"
    assert limited.headers_named("retry-after") == ["99"]
    assert limited.headers_named("x-ratelimit-limit") == ["mine"]
    assert limited.headers_named("x-ratelimit-remaining") == ["0"]


async def test_exception_handler_answers_when_the_dependency_checks_for_itself(limiter: Limiter) -> None:
    """While an override keeps the edge out of the route, the limit checks itself in FastAPI: the same
    handler answers, with the headers kept once."""
    seen = Seen()
    app, other = limited_app(limiter, seen)
    app.add_exception_handler(RateLimitExceeded, async_handler(seen))
    install(app)
    app.dependency_overrides[other] = lambda: None
    limited = await two_requests(app)
    assert limited.status == 429 and limited.json() == {"error": "slow down", "limit": 1}
    assert limited.header("x-custom") == "yes"
    assert_rate_headers_once(limited)
    assert len(seen.handled) == 1


@pytest.mark.parametrize("lift", [True, False])
async def test_exception_handler_answers_with_and_without_lifting(limiter: Limiter, lift: bool) -> None:
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    app.add_exception_handler(RateLimitExceeded, async_handler(seen))
    install(app, lift=lift)
    limited = await two_requests(app)
    assert limited.json() == {"error": "slow down", "limit": 1}
    assert_rate_headers_once(limited)


async def test_without_install_the_handler_answers_the_dependency(limiter: Limiter) -> None:
    """Plain FastAPI: the handler gets the exception, whose ``headers`` it sends or not."""
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    app.add_exception_handler(RateLimitExceeded, async_handler(seen))
    limited = await two_requests(app)
    assert limited.json() == {"error": "slow down", "limit": 1}
    [(_, exc)] = seen.handled
    assert exc.headers is not None and exc.headers["retry-after"] == "60"


# --- install(app, on_limit=...) -------------------------------------------------------------------


@pytest.mark.parametrize("make", [on_limit, async_on_limit])
async def test_install_on_limit_answers_the_edge_429(limiter: Limiter, make: Callable[[Seen], Any]) -> None:
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    install(app, on_limit=make(seen))
    limited = await two_requests(app)
    assert limited.status == 429 and limited.body == b"custom 429" and limited.header("x-custom") == "yes"
    assert_rate_headers_once(limited)
    assert seen.endpoint == 1
    [(path, decision)] = seen.answered
    assert path == "/work" and not decision.allowed


async def test_install_on_limit_answers_when_the_dependency_checks_for_itself(limiter: Limiter) -> None:
    seen = Seen()
    app, other = limited_app(limiter, seen)
    install(app, on_limit=on_limit(seen))
    app.dependency_overrides[other] = lambda: None
    limited = await two_requests(app)
    assert limited.status == 429 and limited.body == b"custom 429" and limited.header("x-custom") == "yes"
    assert_rate_headers_once(limited)
    assert len(seen.answered) == 1


async def test_install_on_limit_with_a_handler_already_registered_is_refused(limiter: Limiter) -> None:
    seen = Seen()
    for key in (RateLimitExceeded, 429):
        app, _ = limited_app(limiter, seen)
        handler = async_handler(seen)
        app.add_exception_handler(key, handler)
        with pytest.raises(ConfigurationError, match="already has an exception handler"):
            install(app, on_limit=on_limit(seen))
        assert app.exception_handlers[key] is handler


async def test_a_handler_registered_after_install_on_limit_replaces_it_everywhere(limiter: Limiter) -> None:
    """A later registration replaces ``install``'s handler, as in FastAPI: at the edge and in FastAPI."""
    seen = Seen()
    app, other = limited_app(limiter, seen, "1/min")
    install(app, on_limit=on_limit(seen))
    app.add_exception_handler(RateLimitExceeded, async_handler(seen))
    assert (await two_requests(app)).json() == {"error": "slow down", "limit": 1}
    app.dependency_overrides[other] = lambda: None
    assert (await request(app, "/work")).json() == {"error": "slow down", "limit": 1}
    assert seen.answered == [] and len(seen.handled) == 2


async def test_install_again_keeps_its_own_answer(limiter: Limiter) -> None:
    seen = Seen()
    app, _ = limited_app(limiter, seen)
    install(app)
    install(app, on_limit=on_limit(seen))  # replaces only what install() itself registered
    assert (await two_requests(app)).body == b"custom 429"


# --- the default stays as it was ------------------------------------------------------------------


@pytest.mark.parametrize("overridden", [False, True])
async def test_default_problem_json_keeps_each_header_once(limiter: Limiter, overridden: bool) -> None:
    seen = Seen()
    app, other = limited_app(limiter, seen)
    install(app)
    if overridden:
        app.dependency_overrides[other] = lambda: None
    limited = await two_requests(app)
    assert limited.header("content-type") == "application/problem+json" and limited.json()["status"] == 429
    assert_rate_headers_once(limited)
