"""The check before Flask's dispatch (``ratewarden.flask.fast.FastCheck``): each request is charged
exactly once whichever path decides it, the app's own 429 handlers still answer, and a 429 or 503
answered before Flask is byte for byte the one the ``before_request`` hook would have sent."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from flask import Blueprint, Flask, jsonify

from ratewarden import Limiter, MemoryStore
from ratewarden.caches import size_of
from ratewarden.decision import Decision
from ratewarden.flask import RateLimiter, RateLimitExceeded
from ratewarden.flask import extension as extension_module
from ratewarden.flask import fast as fast_module
from ratewarden.keys import client_ip
from ratewarden.types import Scope
from tests.vectors.runner import FakeClock


def frozen_limiter(**options: Any) -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)), **options)


def user_key(scope: Scope) -> str:
    """A key of the app's own: the extension cannot know it reads only the scope (hook path)."""
    return client_ip(scope)


@pytest.fixture
def charges(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each path checked the request (``check_request``)."""
    counts = {"fast": 0, "hook": 0}
    for name, module in (("fast", fast_module), ("hook", extension_module)):
        real = module.check_request

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(module, "check_request", spy)
    return counts


def limited_app(key: Any = None, **extension: Any) -> tuple[Flask, RateLimiter]:
    app = Flask(__name__)
    limiter = RateLimiter(app, limiter=frozen_limiter(), **extension)

    @app.get("/v")
    @limiter.limit("3/min", key=key)
    def v() -> str:
        return "ok"

    return app, limiter


@pytest.mark.parametrize(
    ("key", "on_limit", "path"),
    [(None, None, "fast"), (user_key, None, "hook"), (None, lambda d: ("custom", 429), "fast")],
    ids=["fast", "hook", "fast-check-on_limit-answer"],
)
def test_each_request_is_charged_exactly_once(charges: dict[str, int], key: Any, on_limit: Any, path: str) -> None:
    app, limiter = limited_app(key, on_limit=on_limit)
    seen: list[Decision | None] = []

    @app.get("/d")
    @limiter.limit("3/min", key=key)
    def d() -> str:
        seen.append(limiter.current_decision)
        return "ok"

    client = app.test_client()
    answers = [client.get("/v") for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    assert [a.headers["X-RateLimit-Remaining"] for a in answers] == ["2", "1", "0", "0", "0"]
    assert [len(a.headers.getlist("RateLimit-Policy")) for a in answers] == [1] * 5
    assert charges == {"fast": 5 if path == "fast" else 0, "hook": 5 if path == "hook" else 0}
    if on_limit is not None:
        assert answers[-1].data == b"custom" and answers[-1].headers["Retry-After"]
    assert client.get("/d").status_code == 200
    assert seen and seen[0] is not None and seen[0].allowed and seen[0].remaining == 2


def test_a_request_the_fast_path_leaves_to_flask_is_charged_once_by_the_hook(charges: dict[str, int]) -> None:
    app = Flask(__name__)
    RateLimiter(app, limiter=frozen_limiter(), application_limits="2/min")

    @app.get("/x")
    def x() -> str:
        return "ok"

    client = app.test_client()
    assert [client.get("/nowhere").status_code for _ in range(3)] == [404, 404, 429]
    assert [client.post("/x").status_code for _ in range(1)] == [429]  # 405: routed by Flask, same counter
    assert charges == {"fast": 0, "hook": 4}


@pytest.mark.parametrize("on_blueprint", [False, True])
def test_an_errorhandler_for_429_still_answers(charges: dict[str, int], on_blueprint: bool) -> None:
    app = Flask(__name__)
    limiter = RateLimiter(app, limiter=frozen_limiter())
    bp = Blueprint("bp", __name__, url_prefix="/bp")
    owner: Any = bp if on_blueprint else app

    @owner.errorhandler(429)
    def too_many(error: RateLimitExceeded) -> Any:
        return jsonify(limit=error.decision.limit, handled=True), 429

    @bp.get("/e")
    @limiter.limit("1/min")
    def e() -> str:
        return "ok"

    app.register_blueprint(bp)
    client = app.test_client()
    assert client.get("/bp/e").status_code == 200
    denied = client.get("/bp/e")
    assert denied.status_code == 429 and denied.json == {"limit": 1, "handled": True}
    assert denied.headers.getlist("Retry-After") == [denied.headers["Retry-After"]]
    assert charges == {"fast": 2, "hook": 0}


def _raw(app: Flask, path: str) -> tuple[str, list[tuple[str, str]], bytes]:
    """The app's answer as its WSGI server sees it: status line, header list, body."""
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": path, "SERVER_NAME": "localhost", "SERVER_PORT": "80",
        "REMOTE_ADDR": "10.0.0.1", "wsgi.url_scheme": "http", "wsgi.input": None, "SCRIPT_NAME": "", "QUERY_STRING": "",
    }
    started: list[Any] = []
    body = b"".join(app.wsgi_app(environ, lambda status, headers, exc_info=None: started.append((status, headers))))
    return started[0][0], list(started[0][1]), body


@pytest.mark.parametrize("headers", ["always", "on_limit", "off"])
def test_the_fast_answers_are_byte_identical_to_the_hooks(charges: dict[str, int], headers: str) -> None:
    fast_app, _ = limited_app(headers=headers)
    hook_app, _ = limited_app(user_key, headers=headers)
    fast = [_raw(fast_app, "/v") for _ in range(5)]
    hook = [_raw(hook_app, "/v") for _ in range(5)]
    assert [answer[0] for answer in fast] == ["200 OK"] * 3 + ["429 TOO MANY REQUESTS"] * 2
    assert fast == hook
    assert charges == {"fast": 5, "hook": 5}


def test_the_fail_closed_503_is_byte_identical_on_both_paths(charges: dict[str, int]) -> None:
    def broken(scope: Scope) -> str:
        raise RuntimeError("no key")

    trusted_broken = lambda scope: broken(scope)  # noqa: E731
    trusted_broken.__module__ = "ratewarden.tests"  # passes for one of ratewarden's scope functions
    answers = []
    for key in (trusted_broken, broken):
        app = Flask(__name__)
        limiter = RateLimiter(app, limiter=frozen_limiter(on_error="closed"))

        @app.get("/f")
        @limiter.limit("1/min", key=key)
        def f() -> str:
            return "ok"

        answers.append(_raw(app, "/f"))
    assert answers[0][0] == "503 SERVICE UNAVAILABLE" and answers[0] == answers[1]
    assert charges == {"fast": 1, "hook": 1}


def test_remembered_routes_keep_methods_hosts_and_unrouted_paths_apart(charges: dict[str, int]) -> None:
    app = Flask(__name__)
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @app.route("/m", methods=["GET", "POST"])
    @limiter.limit("1/min", methods=["POST"])
    def m() -> str:
        return "ok"

    client = app.test_client()
    for _ in range(2):  # the second round is answered from the remembered routes
        assert [client.get("/m").status_code for _ in range(3)] == [200] * 3
        assert client.get("/nowhere").status_code == 404
    assert [client.post("/m").status_code for _ in range(2)] == [200, 429]
    assert client.post("/m", base_url="http://other.example").status_code == 429  # one counter per client
    assert charges == {"fast": 3, "hook": 0}


def test_long_hosts_do_not_fill_the_remembered_routes(charges: dict[str, int]) -> None:
    """Distinct 64 KB Host headers, each remembered as unrouted, used to stay in the remembered
    routes (4,000 of them: 260 MB); they now hold 4 MiB at most (``caches.remember``). 800 are 12
    times that bound."""
    app, _ = limited_app()
    client = app.test_client()
    assert client.get("/v").status_code == 200  # the app's first request: routes are remembered from now
    (check,) = [app.wsgi_app]
    assert isinstance(check, fast_module.FastCheck)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(800):
            host = f"h{i:08d}." + "x" * (64 * 1024 - 16)
            assert client.get("/v", headers={"Host": host}).status_code == 400  # werkzeug: not a host name
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    held = sum(size_of(route) for route in check._routes)
    assert held <= 4 << 20, f"the remembered routes hold {held / 2**20:.0f} MB"
    # 50 MB if every host were kept; what remains is urllib's and werkzeug's own caches (128 entries each)
    assert kept < 36 << 20, f"kept {kept / 2**20:.0f} MB"
    assert [client.get("/v").status_code for _ in range(3)] == [200, 200, 429]
