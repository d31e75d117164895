"""One error hierarchy: everything ratewarden raises on purpose is a RatewardenError."""

from __future__ import annotations

import pytest

import ratewarden
from ratewarden import ConfigurationError, LimitUnavailable, RatewardenError, StoreError, parse_rate
from ratewarden.errors import ConfigurationError as FromErrors
from ratewarden.fastapi import RateLimitExceeded
from ratewarden.limits import Limit
from ratewarden.stores.base import StoreError as FromStores


def test_every_error_has_the_common_base() -> None:
    for cls in (ConfigurationError, StoreError, LimitUnavailable, RateLimitExceeded):
        assert issubclass(cls, RatewardenError), cls
    from ratewarden.policy import PolicyError

    assert issubclass(PolicyError, ConfigurationError)
    assert issubclass(ConfigurationError, ValueError)  # code catching ValueError keeps working
    assert FromErrors is ConfigurationError and FromStores is StoreError
    assert {"RatewardenError", "ConfigurationError", "StoreError", "LimitUnavailable"} <= set(ratewarden.__all__)


@pytest.mark.parametrize("make", [lambda: parse_rate("10 per fortnight"), lambda: Limit(parse_rate("1/s"), "nope")])
def test_bad_configuration_is_a_configuration_error(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as info:
        make()
    assert "fortnight" in str(info.value) or "unknown algorithm 'nope'" in str(info.value)


async def test_an_unreachable_store_is_a_store_error_that_keeps_its_cause() -> None:
    from redis.exceptions import RedisError

    from ratewarden.stores.redis import RedisStore

    store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)  # nothing listens on port 1
    try:
        with pytest.raises(StoreError) as info:
            await store.hit(["rw:errors:k"], [Limit(parse_rate("1/s"))], [1.0])
        assert isinstance(info.value, RatewardenError)
        assert isinstance(info.value.__cause__, RedisError | OSError), repr(info.value.__cause__)
    finally:
        await store.close()


def test_every_error_of_every_door_has_the_common_base() -> None:
    """The service's, Flask's, argument and usage errors are ``RatewardenError``s too, and
    each stays the builtin error code may already catch."""
    import ratewarden.flask
    from ratewarden.errors import ArgumentError, UsageError
    from ratewarden.errors import RateLimitExceeded as Exceeded
    from ratewarden.serve.http import ServeError
    from ratewarden.serve.rls import RlsRequestError
    from ratewarden.serve.spop import SpopError

    for cls in (ServeError, RlsRequestError, SpopError, ArgumentError, UsageError, ratewarden.flask.RateLimitExceeded):
        assert issubclass(cls, RatewardenError), cls
    for cls in (ratewarden.flask.RateLimitExceeded, RateLimitExceeded):
        assert issubclass(cls, Exceeded), cls
    assert issubclass(RlsRequestError, ValueError) and issubclass(ArgumentError, ValueError)
    assert issubclass(UsageError, RuntimeError)


async def test_a_negative_cost_is_an_argument_error() -> None:
    from ratewarden import Limiter, MemoryStore
    from ratewarden.errors import ArgumentError

    limiter = Limiter(MemoryStore())
    with pytest.raises(ArgumentError, match="cost must be zero or positive"):
        await limiter.hit("k", "1/s", cost=-1)


def test_a_sync_call_on_the_loop_thread_is_a_usage_error() -> None:
    import asyncio

    from ratewarden.errors import UsageError
    from ratewarden.loop_thread import LoopThread

    thread = LoopThread()

    async def nested() -> None:
        thread.run(asyncio.sleep(0))

    with pytest.raises(UsageError, match="cannot be made on its own loop thread"):
        thread.run(nested())


async def test_one_handler_for_the_base_answers_fastapi_denials() -> None:
    """A handler registered for ``ratewarden.errors.RateLimitExceeded`` is found before FastAPI's
    default ``HTTPException`` handler."""
    from fastapi import Depends, FastAPI
    from fastapi.responses import PlainTextResponse

    from ratewarden import Limiter, MemoryStore
    from ratewarden.errors import RateLimitExceeded as Exceeded
    from ratewarden.fastapi import RateLimit
    from tests.core.asgi import request

    app = FastAPI()

    @app.get("/", dependencies=[Depends(RateLimit("1/min", limiter=Limiter(MemoryStore())))])
    async def home() -> str:
        return "ok"

    async def handler(_request: object, exc: Exception) -> PlainTextResponse:
        assert isinstance(exc, Exceeded)
        return PlainTextResponse(f"over {exc.decision.limit}", status_code=429)

    app.add_exception_handler(Exceeded, handler)
    assert (await request(app, "/")).status == 200
    denied = await request(app, "/")
    assert (denied.status, denied.body) == (429, b"over 1")


def test_one_handler_for_the_base_answers_flask_denials() -> None:
    from flask import Flask

    from ratewarden import Limiter, MemoryStore
    from ratewarden.errors import RateLimitExceeded as Exceeded
    from ratewarden.flask import RateLimiter

    app = Flask(__name__)
    limiter = RateLimiter(app, limiter=Limiter(MemoryStore()))

    @app.errorhandler(Exceeded)
    def handler(exc: Exceeded) -> tuple[str, int]:
        return f"over {exc.decision.limit}", 429

    @app.get("/")
    @limiter.limit("1/min")
    def home() -> str:
        return "ok"

    client = app.test_client()
    assert client.get("/").status_code == 200
    denied = client.get("/")
    assert (denied.status_code, denied.data) == (429, b"over 1")
