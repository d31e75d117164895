"""ratewarden.flask.RateLimiter through Flask's test client: every feature, on a frozen clock so
the counts are exact."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Blueprint, Flask, jsonify, request

from ratewarden import ConfigurationError, Limiter, MemoryStore
from ratewarden.flask import RateLimiter, RateLimitExceeded
from ratewarden.flask.extension import EXTENSION_KEY
from ratewarden.keys import header
from ratewarden.types import Scope
from tests.vectors.runner import FakeClock


def frozen_limiter(**options: Any) -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)), **options)


def make_app(**config: Any) -> Flask:
    app = Flask(__name__)
    app.config.update(config)
    return app


def statuses(app: Flask, path: str, count: int, **kwargs: Any) -> list[int]:
    client = app.test_client()
    return [client.open(path, **kwargs).status_code for _ in range(count)]


def test_view_limit_answers_problem_json_with_retry_after_and_headers() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @app.get("/items")
    @limiter.limit("2/min")
    def items() -> str:
        return "ok"

    client = app.test_client()
    first = client.get("/items")
    assert first.status_code == 200 and first.data == b"ok"
    assert first.headers["X-RateLimit-Limit"] == "2" and first.headers["X-RateLimit-Remaining"] == "1"
    assert first.headers["RateLimit-Policy"] == '"items";q=2;w=60'
    assert first.headers["RateLimit"].startswith('"items";r=1;t=')
    assert "Retry-After" not in first.headers
    assert client.get("/items").status_code == 200
    denied = client.get("/items")
    assert denied.status_code == 429
    assert denied.headers["Content-Type"] == "application/problem+json"
    assert int(denied.headers["Retry-After"]) >= 1
    assert denied.headers["X-RateLimit-Remaining"] == "0"
    body = json.loads(denied.data)
    assert body["status"] == 429 and body["title"] == "Too Many Requests" and body["limit"] == 2
    assert int(denied.headers["Content-Length"]) == len(denied.data)


def test_init_app_later_and_config_storage_url() -> None:
    limiter = RateLimiter()

    app = make_app(RATEWARDEN_STORAGE_URL="memory://", RATEWARDEN_KEY_PREFIX="mine", RATEWARDEN_ALGORITHM="gcra")

    @app.get("/x")
    @limiter.limit("2/hour")
    def x() -> str:
        return "x"

    limiter.init_app(app)
    assert statuses(app, "/x", 3) == [200, 200, 429]
    with app.app_context():
        assert limiter.limiter.prefix == "mine"
        assert isinstance(limiter.limiter.store, MemoryStore)
    with pytest.raises(ConfigurationError, match="init_app was already called"):
        limiter.init_app(app)


def test_a_limiter_and_storage_config_together_are_refused() -> None:
    app = make_app(RATEWARDEN_STORAGE_URL="memory://")
    with pytest.raises(ConfigurationError, match="RATEWARDEN_STORAGE_URL"):
        RateLimiter(app, limiter=frozen_limiter())



@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"RATEWARDEN_STORAGE_URI": "redis://cache"}, "RATEWARDEN_STORAGE_URI: not a ratewarden key; did you mean RATEWARDEN_STORAGE_URL?"),
        ({"RATEWARDEN_DEFAULT_LIMIT": "1/min"}, "did you mean RATEWARDEN_DEFAULT_LIMITS?"),
        ({"RATEWARDEN_COLOUR": "blue"}, "RATEWARDEN_COLOUR: not a ratewarden key; the keys are RATEWARDEN_ENABLED,"),
        ({"RATELIMIT_STORAGE_URI": "redis://cache"}, "RATELIMIT_STORAGE_URI: a flask-limiter key, which ratewarden does not read; use RATEWARDEN_STORAGE_URL"),
        ({"RATELIMIT_DEFAULT": "1/min"}, "use RATEWARDEN_DEFAULT_LIMITS"),
        ({"RATELIMIT_STRATEGY": "moving-window"}, "use RATEWARDEN_ALGORITHM"),
        ({"RATELIMIT_HEADER_REMAINING": "X-Left"}, "use RATEWARDEN_HEADER_STYLE"),
        ({"RATELIMIT_META": "1/hour"}, "RATELIMIT_META: a flask-limiter key, which ratewarden does not read; ratewarden has no equivalent"),
    ],
)
def test_unknown_and_flask_limiter_config_keys_are_refused(config: dict[str, str], expected: str) -> None:
    """A typo or a leftover flask-limiter key would leave the app on memory:// without its limits."""
    app = make_app(**config)
    with pytest.raises(ConfigurationError, match=r"ratewarden\.flask does not read") as raised:
        RateLimiter(app)
    assert expected in str(raised.value)
    assert EXTENSION_KEY not in app.extensions


def test_every_refused_key_is_named_at_once() -> None:
    app = make_app(RATEWARDEN_STORAGE_URI="redis://cache", RATELIMIT_DEFAULT="1/min", RATEWARDEN_DEFAULT_LIMITS="5/min")
    with pytest.raises(ConfigurationError) as raised:
        RateLimiter(app, limiter=frozen_limiter())
    lines = str(raised.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["RATELIMIT_DEFAULT", "RATEWARDEN_STORAGE_URI"]

def test_key_and_cost_functions_take_the_scope() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    def cost(scope: Scope) -> float:
        return 2.0 if scope["query_string"] == b"big=1" else 1.0

    def from_flask_request(scope: Scope) -> str:  # reads flask.request, ignores the scope
        return request.args.get("user", "anonymous")

    @app.get("/by-key")
    @limiter.limit("2/min", key=header("X-API-Key"))
    def by_key() -> str:
        return "ok"

    @app.get("/by-user")
    @limiter.limit("2/min", key=from_flask_request)
    def by_user() -> str:
        return "ok"

    @app.get("/costly")
    @limiter.limit("3/min", cost=cost)
    def costly() -> str:
        return "ok"

    client = app.test_client()
    assert [client.get("/by-key", headers={"X-API-Key": "a"}).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/by-key", headers={"X-API-Key": "b"}).status_code == 200
    assert [client.get("/by-user?user=ann").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/by-user?user=bob").status_code == 200
    assert client.get("/costly?big=1").status_code == 200  # 2 of 3
    assert client.get("/costly?big=1").status_code == 429  # 2 more would exceed: nothing charged
    assert client.get("/costly").status_code == 200


def test_stacked_limits_all_apply() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @app.get("/s")
    @limiter.limit("3/min")
    @limiter.limit("2/min", methods="GET")
    def s() -> str:
        return "ok"

    assert statuses(app, "/s", 3) == [200, 200, 429]
    policy = app.test_client().get("/s").headers["RateLimit-Policy"]
    assert '"s";q=3;w=60' in policy and '"s-1";q=2;w=60' in policy


def test_blueprint_limits_count_per_view_and_shared_limits_count_once() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())
    bp = Blueprint("api", __name__, url_prefix="/api")
    limiter.limit("2/min")(bp)

    @bp.get("/a")
    def a() -> str:
        return "a"

    @bp.get("/b")
    def b() -> str:
        return "b"

    search = limiter.shared_limit("3/min", scope="search")

    @app.get("/one")
    @search
    def one() -> str:
        return "1"

    @app.get("/two")
    @search
    def two() -> str:
        return "2"

    app.register_blueprint(bp)
    assert statuses(app, "/api/a", 3) == [200, 200, 429]
    assert statuses(app, "/api/b", 3) == [200, 200, 429]  # its own counter
    client = app.test_client()
    assert [client.get(p).status_code for p in ("/one", "/two", "/one", "/two")] == [200, 200, 200, 429]
    assert client.get("/one").headers["RateLimit-Policy"] == '"search";q=3;w=60'


def test_shared_limit_on_a_blueprint_and_a_view_is_charged_once() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())
    shared = limiter.shared_limit("4/min", scope="all")
    bp = shared(Blueprint("bp", __name__))

    @bp.get("/v")
    @shared
    def v() -> str:
        return "v"

    app.register_blueprint(bp)
    assert statuses(app, "/v", 5) == [200] * 4 + [429]


def test_default_limits_override_and_exempt() -> None:
    app = make_app(RATEWARDEN_DEFAULT_LIMITS="2/min")
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    @app.get("/own")
    @limiter.limit("3/min")
    def own() -> str:
        return "ok"

    @app.get("/both")
    @limiter.limit("3/min", override_defaults=False)
    def both() -> str:
        return "ok"

    @app.get("/free")
    @limiter.exempt
    def free() -> str:
        return "ok"

    health = Blueprint("health", __name__)
    limiter.exempt(health)

    @health.get("/health")
    def alive() -> str:
        return "ok"

    app.register_blueprint(health)
    assert statuses(app, "/plain", 3) == [200, 200, 429]
    assert statuses(app, "/own", 4) == [200, 200, 200, 429]  # its own limit replaces the default
    assert statuses(app, "/both", 3) == [200, 200, 429]  # both apply: the default's 2 first
    assert statuses(app, "/free", 5) == [200] * 5
    assert statuses(app, "/health", 5) == [200] * 5
    assert statuses(app, "/missing", 5) == [404] * 5  # no route: no view to count per


def test_application_limits_are_one_counter_across_the_app() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter(), application_limits="3/min", default_limits="10/min")

    @app.get("/a")
    def a() -> str:
        return "a"

    @app.get("/exempt")
    @limiter.exempt
    def exempt() -> str:
        return "e"

    client = app.test_client()
    codes = [client.get(p).status_code for p in ("/a", "/nowhere", "/a", "/exempt", "/a", "/nowhere")]
    assert codes == [200, 404, 200, 200, 429, 429]


def test_methods_and_exempt_when() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())
    internal: list[bool] = [False]

    @app.route("/form", methods=["GET", "POST"])
    @limiter.limit("1/min", methods=["POST"], exempt_when=lambda scope: internal[0])
    def form() -> str:
        return "ok"

    assert statuses(app, "/form", 3) == [200] * 3  # GET is not limited
    assert statuses(app, "/form", 2, method="POST") == [200, 429]
    internal[0] = True
    assert statuses(app, "/form", 2, method="POST") == [200, 200]


def test_each_request_is_charged_all_or_nothing() -> None:
    """A request one limit denies charges none of the others."""
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())
    skip_shared: list[bool] = [False]
    shared = limiter.shared_limit("2/min", scope="pool", exempt_when=lambda scope: skip_shared[0])

    @app.get("/a")
    @limiter.limit("2/min")
    @shared
    def a() -> str:
        return "a"

    @app.get("/b")
    @shared
    def b() -> str:
        return "b"

    client = app.test_client()
    assert [client.get("/b").status_code for _ in range(2)] == [200, 200]  # the pool is spent
    assert [client.get("/a").status_code for _ in range(3)] == [429, 429, 429]  # a's own limit untouched
    skip_shared[0] = True
    assert [client.get("/a").status_code for _ in range(3)] == [200, 200, 429]


def test_request_filter_current_decision_and_enabled() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @limiter.request_filter
    def from_tests(scope: Scope) -> bool:
        return dict(scope["headers"]).get(b"x-test") == b"1"

    @app.get("/q")
    @limiter.limit("2/min")
    def q() -> Any:
        decision = limiter.current_decision
        return jsonify(remaining=None if decision is None else decision.remaining)

    client = app.test_client()
    assert client.get("/q", headers={"X-Test": "1"}).json == {"remaining": None}
    assert client.get("/q").json == {"remaining": 1}
    assert client.get("/q").json == {"remaining": 0}
    off = make_app(RATEWARDEN_ENABLED=False)
    off_limiter = RateLimiter(off, limiter=frozen_limiter())

    @off.get("/q")
    @off_limiter.limit("1/min")
    def off_q() -> str:
        return "ok"

    assert statuses(off, "/q", 3) == [200] * 3
    assert "X-RateLimit-Limit" not in off.test_client().get("/q").headers


def test_header_config_off_on_limit_and_ietf() -> None:
    for mode, style, allowed_has, denied_has, denied_lacks in (
        ("off", "both", (), ("Retry-After",), ("X-RateLimit-Limit", "RateLimit")),
        ("on_limit", "both", (), ("Retry-After", "X-RateLimit-Limit", "RateLimit"), ()),
        ("always", "ietf", ("RateLimit", "RateLimit-Policy"), ("Retry-After", "RateLimit"), ("X-RateLimit-Limit",)),
        ("always", "legacy", ("X-RateLimit-Limit",), ("Retry-After", "X-RateLimit-Reset"), ("RateLimit",)),
    ):
        app = make_app(RATEWARDEN_HEADERS=mode, RATEWARDEN_HEADER_STYLE=style)
        limiter = RateLimiter(app, limiter=frozen_limiter())

        @app.get("/h")
        @limiter.limit("1/min")
        def h() -> str:
            return "ok"

        client = app.test_client()
        allowed, denied = client.get("/h"), client.get("/h")
        names = {"X-RateLimit-Limit", "RateLimit", "RateLimit-Policy"}
        assert {n for n in names if n in allowed.headers} == set(allowed_has), (mode, style)
        assert all(n in denied.headers for n in denied_has), (mode, style)
        assert not any(n in denied.headers for n in denied_lacks), (mode, style)
    with pytest.raises(ConfigurationError):
        RateLimiter(make_app(RATEWARDEN_HEADER_STYLE="fancy"), limiter=frozen_limiter())


def test_trusted_proxies_from_config() -> None:
    app = make_app(RATEWARDEN_TRUSTED_PROXIES="127.0.0.0/8", RATEWARDEN_DEFAULT_LIMITS="1/min")
    RateLimiter(app, limiter=frozen_limiter())

    @app.get("/p")
    def p() -> str:
        return "ok"

    client = app.test_client()
    assert client.get("/p", headers={"X-Forwarded-For": "203.0.113.1"}).status_code == 200
    assert client.get("/p", headers={"X-Forwarded-For": "203.0.113.1"}).status_code == 429
    assert client.get("/p", headers={"X-Forwarded-For": "203.0.113.2"}).status_code == 200


def test_on_limit_callable_replaces_the_429_and_keeps_retry_after() -> None:
    app = make_app()
    seen: list[Any] = []

    def on_limit(decision: Any) -> Any:
        seen.append(decision)
        return jsonify(error="slow down"), 429

    limiter = RateLimiter(app, limiter=frozen_limiter(), on_limit=on_limit)

    @app.get("/o")
    @limiter.limit("1/min")
    def o() -> str:
        return "ok"

    client = app.test_client()
    client.get("/o")
    denied = client.get("/o")
    assert denied.status_code == 429 and denied.json == {"error": "slow down"}
    assert int(denied.headers["Retry-After"]) >= 1 and denied.headers["X-RateLimit-Remaining"] == "0"
    assert len(seen) == 1 and not seen[0].allowed


def test_the_apps_429_errorhandler_overrides_the_answer() -> None:
    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    @app.errorhandler(429)
    def too_many(error: RateLimitExceeded) -> Any:
        return jsonify(limit=error.decision.limit), 429

    @app.get("/e")
    @limiter.limit("1/min")
    def e() -> str:
        return "ok"

    client = app.test_client()
    client.get("/e")
    denied = client.get("/e")
    assert denied.status_code == 429 and denied.json == {"limit": 1}
    assert denied.headers["Retry-After"] and denied.headers.getlist("Retry-After") == [denied.headers["Retry-After"]]


def test_fail_closed_answers_503_and_fail_open_lets_through() -> None:
    def broken(scope: Scope) -> str:
        raise RuntimeError("no key")

    for on_error, expected in (("closed", 503), ("open", 200)):
        app = make_app()
        limiter = RateLimiter(app, limiter=frozen_limiter(on_error=on_error))

        @app.get("/f")
        @limiter.limit("1/min", key=broken)
        def f() -> str:
            return "ok"

        answer = app.test_client().get("/f")
        assert answer.status_code == expected
        if expected == 503:
            assert answer.headers["Content-Type"] == "application/problem+json" and answer.headers["Retry-After"] == "1"


def test_config_on_error_closed_builds_the_limiter() -> None:
    app = make_app(RATEWARDEN_ON_ERROR="closed")
    limiter = RateLimiter(app)
    with app.app_context():
        assert limiter.limiter.on_error == "closed"
    with pytest.raises(ConfigurationError):
        RateLimiter(make_app(RATEWARDEN_ON_ERROR="maybe"))


def test_mistakes_fail_at_declaration() -> None:
    limiter = RateLimiter()

    async def async_key(scope: Scope) -> str:
        return "k"

    with pytest.raises(ConfigurationError):
        limiter.limit("ten per second")
    with pytest.raises(ConfigurationError):
        limiter.limit("1/s", methods="GETT")
    with pytest.raises(ConfigurationError, match="async key"):
        limiter.limit("1/s", key=async_key)
    with pytest.raises(ConfigurationError):
        limiter.shared_limit("1/s", scope="")


def test_views_wrapped_by_other_decorators_keep_their_limits() -> None:
    import functools

    app = make_app()
    limiter = RateLimiter(app, limiter=frozen_limiter())

    def logged(view: Any) -> Any:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return view(*args, **kwargs)

        return wrapper

    @app.get("/w")
    @logged
    @limiter.limit("1/min")
    def w() -> str:
        return "ok"

    assert statuses(app, "/w", 2) == [200, 429]
