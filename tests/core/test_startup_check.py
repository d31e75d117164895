"""A store that cannot answer is reported at start-up, once, at ERROR; the app still starts and
follows the failure policy.

``RateLimitMiddleware`` asks the store when the server starts the app (ASGI lifespan startup,
``Limiter.check_store``: a peek of one key). A wrong Redis password or an unreachable store is then
one ERROR line naming the store and the problem, instead of only the per-request warnings; the
requests are still decided by the failure policy (the insurance limiter, or 503 when fail-closed),
with no ERROR line per request. Without a start-up check (no middleware), the limiter's first
failed check logs the same line.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratewarden import Decision, Limit, Limiter, MemoryStore, RateLimitMiddleware, Rule, StoreError
from ratewarden.bench.services import free_port
from ratewarden.limiter import STORE_CHECK_KEY, store_problem
from ratewarden.stores import Breaker, RedisStore
from tests.core.asgi import request
from tests.servers import HOST, RedisStandalone, Server, have, redis_cmd, redis_server

PASSWORD = "s3cret-password"
WRONG = "not-the-password"
LIMIT = 3


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[int]:
    """A redis-server that requires a password (``requirepass``); yields its port."""
    if not have("redis-server"):
        pytest.fail("redis-server is not installed: run scripts/install-system-deps.sh (make setup does)")
    directory = Path(tempfile.mkdtemp(prefix="rw-redis-auth-"))
    plain = redis_server(directory, None, "--requirepass", PASSWORD)
    server = Server(plain.argv, plain.port, b"-NOAUTH", b"PING\r\n")  # PING is refused until AUTH
    server.start()
    yield server.port
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def _unreachable() -> str:
    return f"redis://{HOST}:{free_port()}/0"  # nothing listens there


async def _items(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def _app(limiter: Limiter) -> Starlette:
    app = Starlette(routes=[Route("/api/items", _items)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[Rule("/api/**", f"{LIMIT}/min", algorithm="gcra")])
    return app


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """Start and stop ``app`` as an ASGI server does (lifespan startup, then shutdown)."""
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, messages.get, sent.put))
    await messages.put({"type": "lifespan.startup"})
    assert (await asyncio.wait_for(sent.get(), 15))["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await messages.put({"type": "lifespan.shutdown"})
        assert (await asyncio.wait_for(sent.get(), 15))["type"] == "lifespan.shutdown.complete"
        await asyncio.wait_for(task, 15)


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ratewarden" and r.levelno == level]


async def _statuses(app: Any, count: int) -> list[int]:
    return [(await request(app, "/api/items")).status for _ in range(count)]


@pytest.mark.redis
@pytest.mark.parametrize("password", [WRONG, None], ids=["wrong-password", "no-password"])
async def test_authentication_failure_is_logged_once_at_startup(
    redis_with_password: int, password: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    auth = f":{password}@" if password else ""
    limiter = Limiter(RedisStore(f"redis://{auth}{HOST}:{redis_with_password}/0"))
    app = _app(limiter)
    try:
        with caplog.at_level(logging.INFO, logger="ratewarden"):
            async with lifespan(app):
                errors = _records(caplog, logging.ERROR)
                assert len(errors) == 1, errors  # at start-up, before any request
                statuses = await _statuses(app, 10)
        # The app served, decided by the insurance limiter (on_error="open"): exactly the limit.
        assert statuses == [200] * LIMIT + [429] * (10 - LIMIT), statuses
        assert _records(caplog, logging.ERROR) == errors, "an ERROR line per request"
        assert len(_records(caplog, logging.WARNING)) <= 2  # the usual line a second, at most
        line = errors[0]
        assert line.startswith(f"rate limit store {limiter.store!r} failed its start-up check: authentication failed")
        assert "on_error='open'" in line and "insurance limiter" in line
        assert WRONG not in line and PASSWORD not in line  # the password stays hidden
        assert limiter.without_store()["local_limiter"] == 10
    finally:
        await limiter.close()


@pytest.mark.redis
async def test_the_right_password_logs_nothing(redis_with_password: int, caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(RedisStore(f"redis://:{PASSWORD}@{HOST}:{redis_with_password}/0"))
    app = _app(limiter)
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            async with lifespan(app):
                assert await _statuses(app, 5) == [200] * LIMIT + [429] * 2
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        counts = limiter.without_store()
        assert counts["timeout"] == counts["unreachable"] == counts["error"] == counts["local_limiter"] == 0, counts
    finally:
        await limiter.close()


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_unreachable_store_is_logged_once_at_startup(on_error: str, caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(RedisStore(_unreachable()), on_error=on_error)  # type: ignore[arg-type]
    app = _app(limiter)
    try:
        with caplog.at_level(logging.INFO, logger="ratewarden"):
            async with lifespan(app):
                errors = _records(caplog, logging.ERROR)
                assert len(errors) == 1, errors
                statuses = await _statuses(app, 6)
        expected = [200] * LIMIT + [429] * (6 - LIMIT) if on_error == "open" else [503] * 6
        assert statuses == expected, statuses
        assert _records(caplog, logging.ERROR) == errors, "an ERROR line per request"
        line = errors[0]
        assert line.startswith(f"rate limit store {limiter.store!r} failed its start-up check: unreachable")
        assert f"on_error={on_error!r}" in line
        assert ("get 503" in line) == (on_error == "closed")
    finally:
        await limiter.close()


async def test_first_failure_is_logged_once_when_nothing_checked_at_startup(caplog: pytest.LogCaptureFixture) -> None:
    """No middleware, no lifespan (``Limiter.hit``, the FastAPI dependency, the decorator): the
    first failed check reports the store, once."""
    limiter = Limiter(RedisStore(_unreachable()))
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            decisions = [await limiter.hit("client", f"{LIMIT}/min", algorithm="gcra") for _ in range(6)]
        assert [d.allowed for d in decisions] == [True] * LIMIT + [False] * (6 - LIMIT)
        errors = _records(caplog, logging.ERROR)
        assert len(errors) == 1, errors
        assert "failed a check, its first failure (nothing checked it at start-up): unreachable" in errors[0]
    finally:
        await limiter.close()


async def test_check_store_returns_the_error_and_logs_it_once(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(RedisStore(_unreachable()))
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            first = await limiter.check_store()
            second = await limiter.check_store()
            await limiter.hit("client", "1/min")
        assert isinstance(first, StoreError) and first.reason == "unreachable"
        assert isinstance(second, StoreError)
        assert len(_records(caplog, logging.ERROR)) == 1
        assert limiter.without_store()["unreachable"] == 1  # the checks of the store are not counted as requests'
    finally:
        await limiter.close()


async def test_check_store_returns_the_error_under_either_policy_and_the_caller_may_raise_it() -> None:
    """The documented contract: the error is returned (the app starts, the failure policy applies),
    under ``on_error="closed"`` too; ``raise`` it to refuse to start."""
    limiter = Limiter(RedisStore(_unreachable()), on_error="closed")
    try:
        error = await limiter.check_store()
        assert isinstance(error, StoreError) and error.reason == "unreachable"
        with pytest.raises(StoreError, match=r"unreachable|connect|refused"):
            if (error := await limiter.check_store()) is not None:
                raise error
        assert limiter.check_store.__doc__ is not None and "never raised" in limiter.check_store.__doc__
    finally:
        await limiter.close()


async def test_a_breaker_fallback_does_not_hide_the_store(caplog: pytest.LogCaptureFixture) -> None:
    store = Breaker(RedisStore(_unreachable()), fallback=MemoryStore())
    limiter = Limiter(store)
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            error = await limiter.check_store()
        assert isinstance(error, StoreError)
        assert store.state == "closed"  # the check went around the breaker: nothing counted there
        (line,) = _records(caplog, logging.ERROR)
        assert line.startswith(f"rate limit store {store.store!r} failed its start-up check: unreachable")
        assert "fallback store of the Breaker" in line
    finally:
        await limiter.close()


async def test_local_stores_are_not_checked(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(MemoryStore())
    with caplog.at_level(logging.DEBUG, logger="ratewarden"):
        assert await limiter.check_store() is None
        async with lifespan(_app(limiter)):
            pass
    assert not caplog.records


@pytest.mark.redis
async def test_the_check_writes_nothing(redis_standalone: RedisStandalone, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"sc{uuid.uuid4().hex[:8]}"
    limiter = Limiter(RedisStore(redis_standalone.url, prefix=prefix), prefix=prefix)
    try:
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            assert await limiter.check_store() is None
        assert not caplog.records
        assert STORE_CHECK_KEY in limiter.keys_for(STORE_CHECK_KEY, limiter.limits("1/s"))[0]
        assert redis_cmd(redis_standalone.port, "KEYS", f"{prefix}:*") == ""
    finally:
        await limiter.close()


@pytest.mark.redis
async def test_a_later_outage_keeps_the_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """A store that answered at start-up and fails later: the usual warnings, no ERROR line."""
    if not have("redis-server"):
        pytest.fail("redis-server is not installed: run scripts/install-system-deps.sh (make setup does)")
    server = RedisStandalone().start()  # our own: this test stops it
    limiter = Limiter(RedisStore(server.url))
    try:
        assert await limiter.check_store() is None
        server.stop()
        with caplog.at_level(logging.WARNING, logger="ratewarden"):
            assert (await limiter.hit("client", "5/min")).allowed
        assert not _records(caplog, logging.ERROR)
        assert _records(caplog, logging.WARNING)
    finally:
        await limiter.close()
        server.close()


def test_store_problem_words() -> None:
    auth = StoreError("RedisStore('redis://x'): hit: ResponseError: WRONGPASS invalid username-password pair")
    assert store_problem(auth).startswith("authentication failed")
    assert store_problem(StoreError("x: hit: NOPERM this user has no permissions")).startswith("permission denied")
    assert store_problem(StoreError("x", reason="timeout")).startswith("no reply in time")
    assert store_problem(StoreError("x", reason="unreachable")).startswith("unreachable")
    assert store_problem(StoreError("x: -OOM")) == "the store answered with an error"
    cause = ConnectionRefusedError(111, "refused")
    wrapped = StoreError("x: hit: ConnectionRefusedError", reason="unreachable")
    wrapped.__cause__ = cause
    assert store_problem(wrapped).startswith("unreachable")



class NoPeekStore:
    """A remote store of one's own that cannot peek, and whose checks fail."""

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise StoreError("NoPeekStore: hit: refused", reason="unreachable")

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        raise NotImplementedError

    async def reset(self, keys: Sequence[str]) -> None:
        pass


async def test_a_store_without_peek_is_left_to_its_first_failure(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(NoPeekStore())
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        assert await limiter.check_store() is None
        assert not caplog.records
        assert (await limiter.hit("client", "1/min")).allowed  # the insurance limiter
    (line,) = _records(caplog, logging.ERROR)
    assert "failed a check, its first failure (nothing checked it at start-up): unreachable" in line
