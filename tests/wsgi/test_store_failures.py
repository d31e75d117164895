"""WSGI apps (the Flask extension and the plain WSGI middleware) on Redis and Memcached whose
server is killed, then paused (SIGSTOP), under ``on_error="open"`` and ``"closed"``, with direct WSGI
calls: never a 500, every request answered within 2 x the store timeout + slack; open → the app's
200 (or the insurance limiter's 429: it enforces the same limit), closed → the shared 503 with
``Retry-After``; once the server is back, exact limiting resumes (a new client gets exactly the
limit, from the store). One gunicorn ``gthread`` server per store and policy does the same with
8 threads sharing the store's client while the server is paused.

Each test has servers of its own (module-scoped, not the session's: they are killed here)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ratewarden import Limiter, Rule
from ratewarden.enforcement.answers import UNAVAILABLE_BODY
from ratewarden.stores import open_store
from ratewarden.wsgi import RateLimitMiddleware
from tests.servers import Memcached, RedisStandalone, Server, gunicorn_server, have, http_burst
from tests.timing import Stopwatch
from tests.wsgi.wsgi import Reply, WSGIApp, request

TIMEOUT = 0.1
BOUND = 2 * TIMEOUT + 0.5  # seconds a request may take while the store is down
LIMIT = 5
GUNICORN_TIMEOUT = 0.5
_clients = itertools.count(1)


class Backend:
    def __init__(self, kind: str, url: str, server: Server) -> None:
        self.kind = kind
        self.url = url
        self.server = server

    def down(self, how: str) -> None:
        if how == "killed":
            self.server.stop()
        else:
            self.server.pause()

    def up(self, how: str) -> None:
        if how == "killed":
            self.server.start()
        else:
            self.server.resume()


@pytest.fixture(scope="module", params=["redis", "memcached"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "redis":
        if not have("redis-server"):
            pytest.fail("redis-server is not installed: run scripts/install-system-deps.sh")
        redis = RedisStandalone().start()
        try:
            yield Backend("redis", f"{redis.url}?timeout={TIMEOUT}&connect_timeout={TIMEOUT}", redis.server)
        finally:
            redis.server.resume()
            redis.close()
    else:
        if not have("memcached"):
            pytest.fail("memcached is not installed: run scripts/install-system-deps.sh")
        memcached = Memcached().start()
        try:
            yield Backend(
                "memcached", f"{memcached.url}?timeout={TIMEOUT}&connect_timeout={TIMEOUT}", memcached.server
            )
        finally:
            memcached.server.resume()
            memcached.close()


def flask_app(url: str, on_error: str, prefix: str) -> tuple[WSGIApp, Limiter]:
    from flask import Flask

    from ratewarden.flask import RateLimiter

    app = Flask(__name__)
    app.config.update(
        RATEWARDEN_STORAGE_URL=url, RATEWARDEN_ON_ERROR=on_error, RATEWARDEN_KEY_PREFIX=prefix,
        RATEWARDEN_ALGORITHM="gcra",
    )
    extension = RateLimiter(app)

    @app.get("/limited")
    @extension.limit(f"{LIMIT}/day")
    def limited() -> str:
        return "ok"

    with app.app_context():
        limiter = extension.limiter
    return app, limiter


def wsgi_app(url: str, on_error: str, prefix: str) -> tuple[WSGIApp, Limiter]:
    def ok(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    limiter = Limiter(open_store(url), prefix=prefix, on_error=on_error)  # type: ignore[arg-type]
    app = RateLimitMiddleware(ok, limiter, [Rule("/limited", f"{LIMIT}/day", algorithm="gcra")])
    return app, limiter


APPS = {"flask": flask_app, "wsgi": wsgi_app}


def failed(limiter: Limiter) -> int:
    """How many checks the store failed (timed out, unreachable, an error reply)."""
    counts = limiter.without_store()
    return counts["timeout"] + counts["unreachable"] + counts["error"]


def new_client() -> str:
    n = next(_clients)
    return f"198.51.{n // 250}.{n % 250 + 1}"


def timed(app: WSGIApp, client: str) -> tuple[Reply, float]:
    """The reply, and how long it took less what a busy machine added (``Stopwatch.slack``)."""
    with Stopwatch() as clock:
        reply = request(app, "/limited", remote=client)
    return reply, clock.elapsed - clock.slack


def connected(app: WSGIApp, limiter: Any) -> int:
    """Send throwaway requests until the store answers one (on a busy machine a first connection can
    outlast the 0.1 s timeout); the store's failures counted so far."""
    for _ in range(20):
        before = failed(limiter)
        request(app, "/limited", remote=new_client())
        if failed(limiter) == before:
            return before
    raise AssertionError("the store answered none of 20 requests")


def exact_limit(app: WSGIApp, limiter: Limiter) -> int:
    """A new client gets exactly ``LIMIT`` 200s, then 429s; returns how many checks the store failed
    meanwhile. A loaded machine can keep a healthy store past the 0.1 s timeout: such a check is
    answered as ``on_error`` says, fail-open's insurance admission charged back ahead of the next
    check (so it counts: exactness holds through it), a fail-closed 503 charging nothing (sent
    again, 3 times at most)."""
    client = new_client()
    before = failed(limiter)
    replies: list[Reply] = []
    resent = 0
    while len(replies) < LIMIT + 2:
        failures = failed(limiter)
        reply = request(app, "/limited", remote=client)
        if reply.status == 503 and failed(limiter) > failures and resent < 3:
            resent += 1
            continue
        replies.append(reply)
    assert [r.status for r in replies] == [200] * LIMIT + [429, 429]
    assert [r.header("x-ratelimit-remaining") for r in replies[:LIMIT]] == [str(LIMIT - 1 - i) for i in range(LIMIT)]
    return failed(limiter) - before


@pytest.mark.parametrize("how", ["killed", "paused"])
@pytest.mark.parametrize("on_error", ["open", "closed"])
@pytest.mark.parametrize("framework", ["flask", "wsgi"])
def test_store_failure(backend: Backend, framework: str, on_error: str, how: str) -> None:
    app, limiter = APPS[framework](backend.url, on_error, f"fail-{uuid.uuid4().hex[:12]}")
    try:
        base = connected(app, limiter)
        base += exact_limit(app, limiter)
        backend.down(how)
        try:
            client = new_client()
            answers = [timed(app, client) for _ in range(LIMIT + 2)]
        finally:
            backend.up(how)
        codes = [reply.status for reply, _ in answers]
        slowest = max(elapsed for _, elapsed in answers)
        assert 500 not in codes
        assert failed(limiter) - base == len(answers), limiter.without_store()  # each one: the store failed it
        assert slowest < BOUND, f"a request took {slowest:.2f} s with the store {how} (bound {BOUND:.2f} s)"
        if on_error == "open":  # the insurance limiter: the same limit, counted in this process
            assert codes == [200] * LIMIT + [429, 429], codes
            assert answers[0][0].body == b"ok"
        else:
            assert codes == [503] * len(codes), codes
            for reply, _ in answers:
                assert reply.header("retry-after") == "1"
                assert reply.body == UNAVAILABLE_BODY
        base = connected(app, limiter) - len(answers)
        base += exact_limit(app, limiter)
        assert failed(limiter) - base == len(answers), limiter.without_store()  # the store decided the rest
    finally:
        limiter.close_sync()


def decided_burst(port: int, client: str) -> list[int]:
    """150 concurrent requests of ``client``; a 503 (fail-closed: the store, back but slowed by a
    loaded machine, missed the timeout; its script's deadline passed, so nothing was charged) is
    sent again, 3 rounds at most."""
    codes = http_burst(port, "/limited", 150, 150, {"x-client": client})
    for _ in range(3):
        refused = codes.count(503)
        if not refused:
            break
        again = http_burst(port, "/limited", refused, refused, {"x-client": client})
        codes = [code for code in codes if code != 503] + again
    return codes


@pytest.mark.parametrize("on_error", ["open", "closed"])
def test_gunicorn_gthread_with_the_store_paused(backend: Backend, on_error: str) -> None:
    """The same under one gunicorn ``gthread`` worker with 8 threads sharing the store's client
    (``tests/wsgi/apps.py``): 40 concurrent requests while the server is paused, then exactness."""
    # A longer timeout than the direct calls': on a loaded machine a reply that missed 0.1 s after its
    # script ran (the server descheduled in between) is a 503 that was charged, and the exact count
    # after the pause would be short by it.
    url = backend.url.replace(f"timeout={TIMEOUT}", f"timeout={GUNICORN_TIMEOUT}")
    env = {"RW_STORE": url, "RW_LIMIT": "100", "RW_ON_ERROR": on_error,
           "RW_PREFIX": f"fail-{uuid.uuid4().hex[:12]}"}
    with gunicorn_server("tests.wsgi.apps:app", threads=8, worker_class="gthread", env=env) as port:
        assert sorted(http_burst(port, "/limited", 150, 150, {"x-client": "a"})).count(200) == 100
        with backend.server.paused(), Stopwatch() as clock:
            codes = http_burst(port, "/limited", 40, 40, {"x-client": "b"})
        assert 500 not in codes
        assert codes == [200 if on_error == "open" else 503] * 40, codes  # open: the insurance limiter admits
        bound = 2 * GUNICORN_TIMEOUT + 0.5
        assert clock.within(40 / 8 * bound), f"40 requests on 8 threads with the store paused: {clock}"
        codes = decided_burst(port, "c")
        assert set(codes) <= {200, 429} and codes.count(200) == 100, sorted(set(codes))
