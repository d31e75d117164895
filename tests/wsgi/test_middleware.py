"""ratewarden.wsgi.RateLimitMiddleware over direct WSGI calls: every option, the same answers as
the ASGI middleware, streaming and file_wrapper untouched, odd input."""

from __future__ import annotations

import io
import json
import sys
import wsgiref.util
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest

from ratewarden import (
    ConfigurationError,
    Decision,
    Limiter,
    MemoryStore,
    Rule,
    RuleSet,
    StoreError,
    context_of,
)
from ratewarden import RateLimitMiddleware as ASGIRateLimitMiddleware
from ratewarden.enforcement.answers import UNAVAILABLE_BODY, UNAVAILABLE_HEADERS
from ratewarden.keys import ClientIP, bearer_token, header, query_param
from ratewarden.limits import Limit
from ratewarden.wsgi import CONTEXT_KEY, RateLimitMiddleware, scope_of
from tests.core import asgi
from tests.vectors.runner import FakeClock
from tests.wsgi.wsgi import Reply, call, environ, request

StartResponse = Callable[..., Any]


def ok_app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    """The wrapped app: 200 with its own header, echoing the method and path."""
    body = json.dumps({"path": env["PATH_INFO"], "method": env["REQUEST_METHOD"]}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("X-App", "yes")])
    return [body]


async def asgi_ok_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"yes")]})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)  # the start of an aligned minute, hour and 10 s window


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(MemoryStore(clock=clock))


def wrap(limiter: Limiter, rules: Sequence[Rule] | RuleSet, app: Any = ok_app, **options: Any) -> RateLimitMiddleware:
    return RateLimitMiddleware(app, limiter, rules, **options)


def run(app: Any, n: int, path: str = "/api/x", **kw: Any) -> list[Reply]:
    return [request(app, path, **kw) for _ in range(n)]


def statuses(app: Any, paths: Iterable[str], **kw: Any) -> list[int]:
    return [request(app, p, **kw).status for p in paths]


# --- headers -----------------------------------------------------------------------------------


def test_rate_limit_headers_on_allowed_requests(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "100/min", name="api")])
    first = request(app, "/api/items")
    assert first.status == 200 and first.header("x-app") == "yes"  # the app's own headers are kept
    assert first.header("ratelimit-policy") == '"api";q=100;w=60'
    assert first.header("ratelimit") == '"api";r=99;t=60'
    assert first.header("x-ratelimit-limit") == "100"
    assert first.header("x-ratelimit-remaining") == "99"
    assert first.header("x-ratelimit-reset") == "60"
    assert first.header("retry-after") is None
    assert json.loads(first.body) == {"path": "/api/items", "method": "GET"}


def test_the_apps_header_list_is_not_changed(limiter: Limiter) -> None:
    own = [("X-App", "yes")]

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", own)
        return [b""]

    reply = request(wrap(limiter, [Rule("/**", "5/min")], app), "/x")
    assert own == [("X-App", "yes")] and reply.header("x-ratelimit-limit") == "5"


@pytest.mark.parametrize("mode", ["always", "on_limit", "off"])
def test_header_modes(limiter: Limiter, mode: str) -> None:
    app = wrap(limiter, [Rule("/**", "1/min")], headers=mode)
    allowed, limited = run(app, 2, "/x")
    assert (allowed.header("x-ratelimit-limit") is not None) == (mode == "always")
    assert limited.status == 429
    assert (limited.header("x-ratelimit-limit") is not None) == (mode != "off")
    assert limited.header("retry-after") == "60"  # in every mode


@pytest.mark.parametrize(("style", "ietf", "legacy"), [("both", True, True), ("ietf", True, False), ("legacy", False, True)])
def test_header_styles(limiter: Limiter, style: str, ietf: bool, legacy: bool) -> None:
    app = wrap(limiter, [Rule("/**", "1/min")], header_style=style)
    for reply in run(app, 2, "/x"):
        assert (reply.header("ratelimit") is not None) == ietf
        assert (reply.header("ratelimit-policy") is not None) == ietf
        assert (reply.header("x-ratelimit-remaining") is not None) == legacy


def test_bad_options_are_rejected(limiter: Limiter) -> None:
    with pytest.raises(ConfigurationError, match="headers must be"):
        wrap(limiter, [], headers="sometimes")
    with pytest.raises(ConfigurationError, match="header_style must be"):
        wrap(limiter, [], header_style="fancy")


def test_ratelimit_policy_lists_every_limit_that_applied(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "2/min; 100/hour", name="api"), Rule("/**", "5/min", name="all")])
    first = request(app, "/api/x")
    policy = '"api-2/min";q=2;w=60, "api-100/hour";q=100;w=3600, "all";q=5;w=60'
    assert first.header("ratelimit-policy") == policy
    assert first.header("ratelimit") == '"api-2/min";r=1;t=60'
    request(app, "/api/x")
    limited = request(app, "/api/x")
    assert limited.status == 429 and limited.header("ratelimit-policy") == policy
    assert request(app, "/other").header("ratelimit-policy") == '"all";q=5;w=60'


# --- the 429 and 503: the ASGI middleware's bytes ------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"headers": "on_limit"}, {"headers": "off"}, {"header_style": "ietf"},
                                     {"header_style": "legacy"}])
async def test_429_is_byte_identical_to_the_asgi_middlewares(clock: FakeClock, options: dict[str, Any]) -> None:
    rules = [Rule("/api/**", "2/min; 10/hour", name="api"), Rule("/**", "3/min", name="all")]
    wsgi_app = wrap(Limiter(MemoryStore(clock=clock)), rules, **options)
    asgi_app = ASGIRateLimitMiddleware(asgi_ok_app, Limiter(MemoryStore(clock=clock)), rules, **options)
    for step in range(4):
        if step == 3:
            clock.advance(7.5)  # a later Retry-After and reset
        ours = request(wsgi_app, "/api/x")
        theirs = await asgi.request(asgi_app, "/api/x")
        assert ours.status == theirs.status
        if ours.status == 429:
            assert ours.body == theirs.body
            assert ours.raw_headers == theirs.raw_headers
        else:  # the same rate-limit headers after the app's own
            assert ours.raw_headers[2:] == theirs.raw_headers[1:]
    assert ours.status == 429 and json.loads(ours.body)["status"] == 429
    assert ours.header("content-type") == "application/problem+json"
    assert ours.header("content-length") == str(len(ours.body))


class FailingStore(MemoryStore):
    """A store whose every check fails (the ASGI middleware asks ``hit_one``, the WSGI one ``hit_blocking``)."""

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise StoreError("the store is down", reason="unreachable")

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise StoreError("the store is down", reason="unreachable")

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        raise StoreError("the store is down", reason="unreachable")


def test_fail_open_without_an_insurance_limiter_lets_requests_through() -> None:
    app = wrap(Limiter(FailingStore(), on_error="open", fallback=None), [Rule("/**", "1/min")])
    for reply in run(app, 3, "/x"):
        assert reply.status == 200 and reply.header("x-app") == "yes"
        assert reply.header("x-ratelimit-limit") is None  # nothing was decided


def test_fail_open_limits_with_the_insurance_limiter_by_default() -> None:
    app = wrap(Limiter(FailingStore(), on_error="open"), [Rule("/**", "1/min")])
    assert [r.status for r in run(app, 3, "/x")] == [200, 429, 429]


def test_fail_open_with_an_insurance_limiter_decides_locally(clock: FakeClock) -> None:
    app = wrap(Limiter(FailingStore(), fallback=MemoryStore(clock=clock)), [Rule("/**", "1/min")])
    assert [r.status for r in run(app, 2, "/x")] == [200, 429]


async def test_fail_closed_answers_the_shared_503() -> None:
    app = wrap(Limiter(FailingStore(), on_error="closed"), [Rule("/**", "1/min")])
    reply = request(app, "/x")
    assert reply.status == 503
    assert reply.body == UNAVAILABLE_BODY and reply.raw_headers == list(UNAVAILABLE_HEADERS)
    theirs = await asgi.request(
        ASGIRateLimitMiddleware(asgi_ok_app, Limiter(FailingStore(), on_error="closed"), [Rule("/**", "1/min")]), "/x"
    )
    assert (theirs.status, theirs.body, theirs.raw_headers) == (503, reply.body, reply.raw_headers)


@pytest.mark.parametrize(("policy", "expected"), [("open", [200, 429, 429]), ("closed", [503] * 3)])
def test_a_failing_key_function_follows_the_policy(clock: FakeClock, policy: str, expected: list[int]) -> None:
    def broken(scope: Any) -> str:
        raise RuntimeError("no key")

    app = wrap(Limiter(MemoryStore(clock=clock), on_error=policy), [Rule("/**", "1/min", key=broken)])
    # fail-open charges the client's address (key-error:...) instead: never unlimited
    assert statuses(app, ["/x"] * 3) == expected


def test_a_disabled_limiter_passes_everything(clock: FakeClock) -> None:
    app = wrap(Limiter(MemoryStore(clock=clock), enabled=False), [Rule("/**", "1/min")])
    replies = run(app, 3, "/x")
    assert [r.status for r in replies] == [200] * 3 and replies[0].header("x-ratelimit-limit") is None


def test_cost_that_can_never_fit_has_no_retry_after(limiter: Limiter) -> None:
    reply = request(wrap(limiter, [Rule("/**", "2/min", cost=5)]), "/x")
    assert reply.status == 429 and reply.header("retry-after") is None
    assert json.loads(reply.body)["retry_after"] is None


# --- on_limit ----------------------------------------------------------------------------------


def test_on_limit_answer_keeps_retry_after_and_the_rate_limit_headers(limiter: Limiter) -> None:
    seen: list[tuple[dict[str, Any], Decision]] = []

    def on_limit(env: dict[str, Any], decision: Decision) -> Any:
        seen.append((env, decision))

        def answer(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            start_response("429 Too Many Requests", [("Content-Type", "text/plain"), ("Retry-After", "999")])
            return [b"slow down"]

        return answer

    app = wrap(limiter, [Rule("/**", "1/min", name="all")], on_limit=on_limit)
    request(app, "/x")
    limited = request(app, "/x")
    assert limited.status == 429 and limited.body == b"slow down"
    assert limited.headers_named("retry-after") == ["999"]  # its own, not a second copy
    assert limited.header("ratelimit") == '"all";r=0;t=60'
    assert limited.header("x-ratelimit-remaining") == "0"
    assert len(seen) == 1 and seen[0][0]["PATH_INFO"] == "/x" and not seen[0][1].allowed


@pytest.mark.parametrize("mode", ["on_limit", "off"])
def test_on_limit_answer_with_header_modes(limiter: Limiter, mode: str) -> None:
    def answer(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("429 Too Many Requests", [("Content-Type", "text/plain")])
        return [b"no"]

    app = wrap(limiter, [Rule("/**", "1/min")], headers=mode, on_limit=lambda env, decision: answer)
    limited = run(app, 2, "/x")[1]
    assert limited.body == b"no" and limited.header("retry-after") == "60"
    assert (limited.header("x-ratelimit-limit") is not None) == (mode == "on_limit")


def test_on_limit_returning_none_sends_the_default_429(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min")], on_limit=lambda env, decision: None)
    limited = run(app, 2, "/x")[1]
    assert limited.status == 429 and limited.header("content-type") == "application/problem+json"


def test_on_limit_may_be_a_flask_response(limiter: Limiter) -> None:
    flask = pytest.importorskip("flask")
    app = wrap(limiter, [Rule("/**", "1/min")], on_limit=lambda env, d: flask.Response("busy", status=429))
    limited = run(app, 2, "/x")[1]
    assert limited.status == 429 and limited.body == b"busy" and limited.header("retry-after") == "60"


# --- rules -------------------------------------------------------------------------------------


def test_unmatched_requests_reach_the_app_untouched(limiter: Limiter) -> None:
    body = [b"as it is"]
    seen: list[Any] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        seen.append((start_response, dict(env)))
        start_response("200 OK", [])
        return body

    middleware = wrap(limiter, [Rule("/api/**", "1/min")], app)
    env = environ("/other")

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return None

    assert middleware(env, start_response) is body
    assert seen[0][0] is start_response and seen[0][1] == environ("/other") | {"wsgi.input": env["wsgi.input"]}


def test_methods(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min", methods=["POST", "put"])])
    assert statuses(app, ["/api/x"] * 3) == [200, 200, 200]
    assert [request(app, "/api/x", method="POST").status for _ in range(2)] == [200, 429]
    assert request(app, "/api/x", method="PUT").status == 429  # one bucket for both methods


def test_bypass_rules_win(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min"), Rule("/health", bypass=True), Rule("/admin", bypass=True, methods="GET")])
    assert statuses(app, ["/health"] * 3) == [200] * 3
    assert statuses(app, ["/admin"] * 3) == [200] * 3
    assert request(app, "/admin", method="POST").status == 200  # the /** rule's one
    assert request(app, "/admin", method="POST").status == 429


@pytest.mark.parametrize("path", ["//api//x", "/api/./x", "/api/y/../x", "/api/x/"])
def test_paths_are_matched_normalised(limiter: Limiter, path: str) -> None:
    """The rules see the path the app routes to, as under ASGI: one bucket for every spelling."""
    app = wrap(limiter, [Rule("/api/x", "2/min")])
    assert statuses(app, ["/api/x", path, "/api/x"]) == [200, 200, 429]


@pytest.mark.parametrize(
    "path",
    ["/api/%2e%2e/x", "//api//x", "/api/" + "x" * 20_000, "/api/é/ü", "/api/\x00", "/api/../../etc/passwd", "/api/{x}"],
)
def test_odd_paths_are_served_and_limited(limiter: Limiter, path: str) -> None:
    app = wrap(limiter, [Rule("/**", "2/min")])
    assert statuses(app, [path] * 3) == [200, 200, 429]


def test_non_ascii_paths_match_as_text(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/café/**", "1/min")])
    assert statuses(app, ["/café/x", "/café/x", "/cafe/x"]) == [200, 429, 200]


def test_an_empty_path_is_the_root(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/", "1/min")])
    assert [call(app, environ("") | {"PATH_INFO": ""}).status for _ in range(2)] == [200, 429]


def test_several_rules_are_all_or_nothing(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "3/min", name="api"), Rule("/api/slow", "1/min", name="slow")])
    assert statuses(app, ["/api/slow", "/api/slow", "/api/fast", "/api/fast", "/api/fast"]) == [200, 429, 200, 200, 429]


def test_rules_can_be_replaced_at_run_time(limiter: Limiter) -> None:
    rules = RuleSet([Rule("/**", "1/min")])
    app = wrap(limiter, rules)
    assert statuses(app, ["/x", "/x"]) == [200, 429]
    rules.replace([Rule("/**", "5/min", name="roomier")])
    assert statuses(app, ["/x", "/x"]) == [200, 200]


def test_cost_functions(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "10/min", cost=lambda scope: 4 if scope["method"] == "POST" else 1)])
    assert [request(app, "/x", method="POST").status for _ in range(3)] == [200, 200, 429]
    assert statuses(app, ["/x", "/x", "/x"]) == [200, 200, 429]


def test_async_key_functions_are_refused_at_construction(limiter: Limiter) -> None:
    async def key(scope: Any) -> str:
        return "k"

    with pytest.raises(ConfigurationError, match="async key function"):
        wrap(limiter, [Rule("/**", "1/min", key=key)])
    with pytest.raises(ConfigurationError, match="async key function"):
        wrap(limiter, RuleSet([Rule("/a", "1/min"), Rule("/b", "1/min", key=key, shadow=True)]))
    # A rule a WSGI request never reaches may keep one.
    wrap(limiter, [Rule("/ws", "1/min", key=key, websocket=True), Rule("/x", bypass=True, key=key)])


# --- key functions -----------------------------------------------------------------------------


def test_client_ip_is_the_peer_address(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min")])
    assert statuses(app, ["/x", "/x"], remote="198.51.100.1") == [200, 429]
    assert request(app, "/x", remote="198.51.100.2").status == 200
    spoofed = {"X-Forwarded-For": "192.0.2.99"}  # no trusted proxy: the header is ignored
    assert request(app, "/x", remote="198.51.100.1", headers=spoofed).status == 429


def test_client_ip_behind_trusted_proxies(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=ClientIP(trusted_proxies=["10.0.0.0/8"]))])

    def via_proxy(client: str) -> int:
        return request(app, "/x", remote="10.1.2.3", headers={"X-Forwarded-For": f"{client}, 10.9.9.9"}).status

    assert [via_proxy("192.0.2.1"), via_proxy("192.0.2.1"), via_proxy("192.0.2.2")] == [200, 429, 200]
    # Not from a trusted proxy: the forwarded address is not believed.
    assert request(app, "/x", remote="198.51.100.9", headers={"X-Forwarded-For": "192.0.2.3"}).status == 200
    assert request(app, "/x", remote="198.51.100.9", headers={"X-Forwarded-For": "192.0.2.4"}).status == 429


def test_missing_client_is_served_and_limited(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "2/min")])
    assert statuses(app, ["/x"] * 3, remote=None) == [200, 200, 429]
    assert request(app, "/x").status == 200  # another peer is not in the anonymous bucket


def test_header_key(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=header("X-API-Key"))])
    assert statuses(app, ["/x", "/x"], headers={"X-API-Key": "alice"}) == [200, 429]
    assert request(app, "/x", headers={"X-API-Key": "bob"}).status == 200
    # No such header: the client IP, as under ASGI.
    assert statuses(app, ["/x", "/x"], remote="192.0.2.50") == [200, 429]


def test_non_ascii_and_oversized_header_keys(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=header("X-API-Key"))])
    for value in ("\xc3\xa9\xff\xfe", "k" * 50_000, "a{b}c", "\x00\x01"):  # native strings: bytes as latin-1
        assert statuses(app, ["/x", "/x"], headers={"X-API-Key": value}) == [200, 429], value[:10]
    assert all(len(k) < 400 for k in limiter.store._data)  # type: ignore[attr-defined]


def test_bearer_token_key(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=bearer_token())])
    assert statuses(app, ["/x", "/x"], headers={"Authorization": "Bearer t1"}) == [200, 429]
    assert request(app, "/x", headers={"Authorization": "Bearer t2"}).status == 200


def test_query_key(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=query_param("api_key"))])
    assert statuses(app, ["/x", "/x"], query="api_key=a&x=1") == [200, 429]
    assert request(app, "/x", query="api_key=b").status == 200


def test_path_key(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/users/*", "1/min", key=lambda scope: scope["path"])])
    assert statuses(app, ["/users/1", "/users/1", "/users/2"]) == [200, 429, 200]
    assert request(app, "/users/1", remote="192.0.2.77").status == 429  # per path, not per client


# --- what the app sees -------------------------------------------------------------------------


def test_the_context_is_left_in_the_environ(limiter: Limiter) -> None:
    seen: list[Any] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        context = env[CONTEXT_KEY]
        seen.append((context.decision.remaining, [d.remaining for d in context.shadow], context_of(scope_of(env))))
        assert seen[-1][2] is context
        start_response("200 OK", [])
        return [b""]

    rules = [Rule("/api/**", "10/min", name="api"), Rule("/api/**", "5/min", name="trial", shadow=True)]
    request(wrap(limiter, rules, app), "/api/quota")
    assert seen[0][:2] == (9, [4])


def test_shadow_rules_never_block(limiter: Limiter) -> None:
    contexts: list[Any] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        contexts.append(env.get(CONTEXT_KEY))
        start_response("200 OK", [])
        return [b""]

    middleware = wrap(limiter, [Rule("/**", "1/min", shadow=True)], app)
    replies = run(middleware, 3, "/x")
    assert [r.status for r in replies] == [200] * 3
    assert replies[0].header("x-ratelimit-limit") is None  # nothing enforced, nothing stated
    assert contexts[0].decision is None and [d.allowed for d in contexts[2].shadow] == [False]


def test_no_context_when_nothing_applied(limiter: Limiter) -> None:
    seen: list[Any] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        seen.append(CONTEXT_KEY in env)
        start_response("200 OK", [])
        return [b""]

    request(wrap(limiter, [Rule("/api/**", "1/min")], app), "/other")
    assert seen == [False]


# --- bodies: never buffered, never wrapped --------------------------------------------------------


class Streamed:
    """A streaming body that records how far it was read and whether it was closed."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.read = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self.chunks):
            self.read += 1
            yield b"chunk %d\n" % i

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("mode", ["always", "off"])
def test_streaming_bodies_are_returned_as_they_are(limiter: Limiter, mode: str) -> None:
    body = Streamed(1000)

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return body

    middleware = wrap(limiter, [Rule("/**", "5/min")], app, headers=mode)
    started: list[list[tuple[str, str]]] = []
    result = middleware(environ("/stream"), lambda status, headers, exc_info=None: started.append(headers))
    assert result is body and body.read == 0  # nothing read before the server asks
    assert (("x-ratelimit-limit", "5") in started[0]) == (mode == "always")
    assert next(iter(result)) == b"chunk 0\n" and body.read == 1
    result.close()  # type: ignore[attr-defined]
    assert body.closed


def test_generator_apps_start_the_response_lazily(limiter: Limiter) -> None:
    """A generator app calls start_response on its first ``next``: the headers are added then."""
    closed: list[bool] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            for i in range(3):
                yield b"%d" % i
        finally:
            closed.append(True)

    reply = request(wrap(limiter, [Rule("/**", "5/min")], app), "/gen")
    assert (reply.status, reply.body, reply.header("x-ratelimit-remaining"), closed) == (200, b"012", "4", [True])


def test_file_wrapper_passes_through(limiter: Limiter, tmp_path: Any) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 100_000)
    wrappers: list[Any] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", "100000")])
        wrapped = env["wsgi.file_wrapper"](path.open("rb"), 8192)
        wrappers.append(wrapped)
        return wrapped  # type: ignore[no-any-return]

    middleware = wrap(limiter, [Rule("/**", "5/min")], app)
    env = environ("/file") | {"wsgi.file_wrapper": wsgiref.util.FileWrapper}
    result = middleware(env, lambda status, headers, exc_info=None: None)
    assert result is wrappers[0] and isinstance(result, wsgiref.util.FileWrapper)  # a server can sendfile it
    assert b"".join(result) == b"x" * 100_000
    result.close()
    assert wrappers[0].filelike.closed


def test_exc_info_reaches_the_server(limiter: Limiter) -> None:
    calls: list[tuple[str, Any]] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [])
        try:
            raise ValueError("late failure")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"failed"]

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        calls.append((status, exc_info))
        assert ("x-ratelimit-limit", "5") in headers

    wrap(limiter, [Rule("/**", "5/min")], app)(environ("/x"), start_response)
    assert calls[0] == ("200 OK", None)
    assert calls[1][0].startswith("500") and calls[1][1][0] is ValueError


def test_write_callable_is_returned(limiter: Limiter) -> None:
    written: list[bytes] = []

    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        write = start_response("200 OK", [])
        write(b"legacy ")
        return [b"body"]

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return written.append

    result = wrap(limiter, [Rule("/**", "5/min")], app)(environ("/x"), start_response)
    assert written == [b"legacy "] and list(result) == [b"body"]


# --- a real WSGI framework -----------------------------------------------------------------------


def test_a_flask_app(limiter: Limiter) -> None:
    flask = pytest.importorskip("flask")
    app = flask.Flask(__name__)

    @app.get("/api/items")
    def items() -> Any:
        context = flask.request.environ[CONTEXT_KEY]
        return {"remaining": context.decision.remaining}

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, [Rule("/api/**", "2/min")])  # type: ignore[method-assign]
    client = app.test_client()
    replies = [client.get("/api/items") for _ in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    assert replies[0].get_json() == {"remaining": 1} and replies[0].headers["X-RateLimit-Remaining"] == "1"
    assert replies[2].headers["Retry-After"] == "60" and replies[2].mimetype == "application/problem+json"
    assert client.get("/elsewhere").status_code == 404


def test_wsgi_input_is_left_unread(limiter: Limiter) -> None:
    def app(env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [])
        return [env["wsgi.input"].read()]

    env = environ("/upload", method="POST", headers={"Content-Length": "5", "Content-Type": "text/plain"})
    env["wsgi.input"] = io.BytesIO(b"hello")
    assert call(wrap(limiter, [Rule("/**", "5/min")], app), env).body == b"hello"
