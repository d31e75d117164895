"""Issue 28's round-2 bypasses, door by door (Django's are in tests/django/test_bypasses_round2.py):

1. ``HEAD`` ran the ``GET`` view past a ``GET``-only limit (frameworks answer ``HEAD`` with it);
2. a lower-case method (``post``) passed a ``POST`` limit, then was routed as ``POST``;
3. ``?api_key=<random>&api_key=REAL`` was keyed on the first value while the app read the last;
4. (finding 6) a trusted proxy's ``X-Forwarded-For`` entry with a port was a new client per port.

Each test drives the real framework in process (Flask/werkzeug, Starlette, FastAPI, ``ratewarden
serve``'s ASGI app) and counts what the application itself ran, on a frozen clock (exact counts).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from fastapi import Depends, FastAPI
from flask import Flask, request
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from werkzeug.test import Client as WerkzeugClient

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.fastapi import RateLimit
from ratewarden.flask import RateLimiter
from ratewarden.keys import ClientIP, query_param
from ratewarden.policy import PolicyMiddleware, PolicyRule, WSGIPolicyMiddleware, parse_policy
from ratewarden.serve.http import ServeApp
from ratewarden.starlette import limit
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.core import asgi
from tests.vectors.runner import FakeClock
from tests.wsgi.wsgi import call, environ

REAL = "sk-real-caller"
AMBIGUOUS = f"/data?api_key=rand-{{}}&api_key={REAL}"


def frozen() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


# --- the applications: each counts the views it ran -------------------------------------------------


def flask_app(ran: list[str]) -> Flask:
    """``GET /items``, ``POST /login`` and ``GET /data`` (authenticating ``request.args["api_key"]``)."""
    app = Flask(__name__)

    @app.get("/items")
    def items() -> str:
        ran.append(request.method)
        return "items"

    @app.post("/login")
    def login() -> str:
        ran.append(request.method)
        return "in"

    @app.get("/data")
    def data() -> str:
        ran.append(request.args["api_key"])
        return "data"

    return app


def last_value_wsgi(ran: list[str]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app reading the last ``api_key`` (as Django's ``request.GET[...]`` does)."""

    def app(env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        values = [v for k, v in parse_qsl(env.get("QUERY_STRING", "")) if k == "api_key"]
        ran.append(values[-1] if values else "")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return app


def starlette_app(ran: list[str]) -> Starlette:
    """``GET /items`` (Starlette adds ``HEAD``) and ``GET /data`` reading ``query_params["api_key"]``
    (the last value)."""

    async def items(req: Request) -> PlainTextResponse:
        ran.append(req.method)
        return PlainTextResponse("items")

    async def data(req: Request) -> PlainTextResponse:
        ran.append(req.query_params["api_key"])
        return PlainTextResponse("data")

    return Starlette(routes=[Route("/items", items, methods=["GET"]), Route("/data", data)])


def upper_casing_asgi(ran: list[str]) -> Any:
    """An ASGI app routing ``post`` as ``POST`` (Django's ``ASGIRequest`` upper-cases the method)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            ran.append(scope["method"].upper())
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"in"})

    return app


def spend_real(get: Callable[[str], int]) -> None:
    """The real caller's 3/hour, spent."""
    assert [get(f"/data?api_key={REAL}") for _ in range(4)] == [200, 200, 200, 429]


# --- 1. HEAD is charged to a GET limit ----------------------------------------------------------------


def test_wsgi_middleware_charges_head_to_a_get_limit() -> None:
    ran: list[str] = []
    app = WSGIRateLimitMiddleware(flask_app(ran), frozen(), [Rule("/items", "3/hour", methods="GET")])
    client = WerkzeugClient(app)
    codes = [client.get("/items").status_code for _ in range(3)] + [client.head("/items").status_code for _ in range(5)]
    assert codes == [200] * 3 + [429] * 5
    assert ran == ["GET"] * 3


def test_flask_limit_on_get_charges_head() -> None:
    ran: list[str] = []
    app = flask_app(ran)
    limiter = RateLimiter(app, limiter=frozen())
    limiter.limit("3/hour", methods=["GET"])(app.view_functions["items"])
    client = app.test_client()
    codes = [client.head("/items").status_code for _ in range(5)] + [client.get("/items").status_code]
    assert codes == [200] * 3 + [429] * 3
    assert ran == ["HEAD"] * 3  # Flask ran the GET view for each HEAD it let through


def test_asgi_middleware_charges_head_to_a_get_limit() -> None:
    ran: list[str] = []
    app = starlette_app(ran)
    app.add_middleware(RateLimitMiddleware, limiter=frozen(), rules=[Rule("/items", "3/hour", methods=["GET"])])
    with TestClient(app) as client:
        codes = [client.get("/items").status_code for _ in range(3)] + [client.head("/items").status_code for _ in range(3)]
    assert codes == [200] * 3 + [429] * 3
    assert ran == ["GET"] * 3


def test_fastapi_dependency_shares_one_limit_between_get_and_head() -> None:
    ran: list[str] = []
    app = FastAPI()

    @app.api_route("/items", methods=["GET", "HEAD"], dependencies=[Depends(RateLimit("3/hour", limiter=frozen()))])
    def items(req: Request) -> str:
        ran.append(req.method)
        return "items"

    with TestClient(app) as client:
        codes = [client.get("/items").status_code for _ in range(3)] + [client.head("/items").status_code for _ in range(3)]
    assert codes == [200] * 3 + [429] * 3
    assert ran == ["GET"] * 3


@pytest.mark.parametrize("door", ["asgi", "wsgi"])
def test_policy_middleware_charges_head_to_a_get_rule(door: str) -> None:
    ran: list[str] = []
    rules = [PolicyRule("/items", "3/hour", methods=["GET"], name="items")]
    if door == "asgi":
        app = starlette_app(ran)
        app.add_middleware(PolicyMiddleware, limiter=frozen(), rules=rules)
        with TestClient(app) as client:
            codes = [client.head("/items").status_code for _ in range(5)]
    else:
        wsgi_client = WerkzeugClient(WSGIPolicyMiddleware(flask_app(ran), frozen(), rules))
        codes = [wsgi_client.head("/items").status_code for _ in range(5)]
    assert codes == [200] * 3 + [429] * 2
    assert ran == ["HEAD"] * 3


# --- 2. methods are compared case-insensitively ------------------------------------------------------


@pytest.mark.parametrize("door", ["middleware", "policy"])
def test_wsgi_doors_match_a_lower_case_method(door: str) -> None:
    ran: list[str] = []
    rules = [Rule("/login", "3/hour", methods="POST")] if door == "middleware" else [PolicyRule("/login", "3/hour", methods="POST")]
    wrapper = WSGIRateLimitMiddleware if door == "middleware" else WSGIPolicyMiddleware
    app = wrapper(flask_app(ran), frozen(), rules)
    codes = [call(app, environ("/login", method=m)).status for m in ("post", "Post", "pOST", "post", "POST", "post")]
    assert codes == [200] * 3 + [429] * 3
    assert ran == ["POST"] * 3  # werkzeug routed each spelling to the POST view


@pytest.mark.parametrize("door", ["middleware", "policy"])
async def test_asgi_doors_match_a_lower_case_method(door: str) -> None:
    ran: list[str] = []
    wrapper = RateLimitMiddleware if door == "middleware" else PolicyMiddleware
    app = wrapper(upper_casing_asgi(ran), frozen(), [Rule("/login", "3/hour", methods="POST")])
    codes = [(await asgi.request(app, "/login", method=m)).status for m in ("post", "Post", "pOST", "post", "post")]
    assert codes == [200] * 3 + [429] * 2
    assert ran == ["POST"] * 3


# --- 3. a keyed query parameter given twice, differently, is refused ---------------------------------


def _refused(status: int, body: bytes) -> None:
    assert status == 400
    assert "'api_key' is given more than once with different values" in body.decode()


def test_asgi_middleware_refuses_a_repeated_keyed_parameter() -> None:
    ran: list[str] = []
    app = starlette_app(ran)
    app.add_middleware(RateLimitMiddleware, limiter=frozen(), rules=[Rule("/data", "3/hour", key=query_param("api_key"))])
    with TestClient(app) as client:
        spend_real(lambda path: client.get(path).status_code)
        for i in range(5):
            response = client.get(AMBIGUOUS.format(i))
            _refused(response.status_code, response.content)
        assert client.get(f"/data?api_key={REAL}&api_key={REAL}").status_code == 429  # the same value twice: REAL
    assert ran == [REAL] * 3


def test_fastapi_dependency_refuses_a_repeated_keyed_parameter() -> None:
    ran: list[str] = []
    app = FastAPI()

    @app.get("/data", dependencies=[Depends(RateLimit("3/hour", limiter=frozen(), key=query_param("api_key")))])
    def data(api_key: str) -> str:
        ran.append(api_key)
        return "data"

    with TestClient(app) as client:
        spend_real(lambda path: client.get(path).status_code)
        for i in range(5):
            response = client.get(AMBIGUOUS.format(i))
            assert response.status_code == 400
            assert "more than once with different values" in response.json()["detail"]
    assert ran == [REAL] * 3


def test_starlette_limit_refuses_a_repeated_keyed_parameter() -> None:
    ran: list[str] = []
    limiter = frozen()

    @limit("3/hour", limiter=limiter, key=query_param("api_key"))
    async def data(req: Request) -> PlainTextResponse:
        ran.append(req.query_params["api_key"])
        return PlainTextResponse("data")

    with TestClient(Starlette(routes=[Route("/data", data)])) as client:
        spend_real(lambda path: client.get(path).status_code)
        for i in range(5):
            response = client.get(AMBIGUOUS.format(i))
            _refused(response.status_code, response.content)
    assert ran == [REAL] * 3


def test_wsgi_middleware_refuses_a_repeated_keyed_parameter() -> None:
    ran: list[str] = []
    app = WSGIRateLimitMiddleware(last_value_wsgi(ran), frozen(), [Rule("/data", "3/hour", key=query_param("api_key"))])
    client = WerkzeugClient(app)
    spend_real(lambda path: client.get(path).status_code)
    for i in range(5):
        response = client.get(AMBIGUOUS.format(i))
        _refused(response.status_code, response.data)
    assert ran == [REAL] * 3


def test_flask_limit_refuses_a_repeated_keyed_parameter() -> None:
    ran: list[str] = []
    app = flask_app(ran)
    limiter = RateLimiter(app, limiter=frozen())
    limiter.limit("3/hour", key=query_param("api_key"))(app.view_functions["data"])
    client = app.test_client()
    spend_real(lambda path: client.get(path).status_code)
    for i in range(5):  # Flask's app reads the first value: the order an attacker would use here
        response = client.get(f"/data?api_key={REAL}&api_key=rand-{i}")
        _refused(response.status_code, response.data)
    assert ran == [REAL] * 3


_QUERY_POLICY = """
version = 1

[[rules]]
name = "data"
path = "/data"
rate = "3/hour"
key = "query:api_key"
"""

_IDENTITY_POLICY = """
version = 1

[identity]
sources = ["query:api_key"]
unknown_group = "basic"
anonymous_group = "anonymous"

[groups.basic]
limits = "3/hour"

[groups.anonymous]
limits = "1/hour"

[[rules]]
name = "data"
path = "/data"
tiered = true
"""


@pytest.mark.parametrize("policy", [_QUERY_POLICY, _IDENTITY_POLICY], ids=["query-key", "identity-source"])
@pytest.mark.parametrize("door", ["asgi", "wsgi"])
def test_policy_middleware_refuses_a_repeated_keyed_parameter(door: str, policy: str) -> None:
    ran: list[str] = []
    parsed = parse_policy(policy, "toml", "policy.toml")
    if door == "asgi":
        app = starlette_app(ran)
        app.add_middleware(PolicyMiddleware, limiter=frozen(), policy=parsed)
        with TestClient(app) as client:
            spend_real(lambda path: client.get(path).status_code)
            answers = [client.get(AMBIGUOUS.format(i)) for i in range(5)]
            replies = [(r.status_code, r.content) for r in answers]
    else:
        wsgi_client = WerkzeugClient(WSGIPolicyMiddleware(last_value_wsgi(ran), frozen(), policy=parsed))
        spend_real(lambda path: wsgi_client.get(path).status_code)
        replies = [(r.status_code, r.data) for r in (wsgi_client.get(AMBIGUOUS.format(i)) for i in range(5))]
    for status, body in replies:
        _refused(status, body)
    assert ran == [REAL] * 3


async def test_serve_check_refuses_a_repeated_keyed_parameter() -> None:
    app = ServeApp(frozen(), parse_policy(_QUERY_POLICY, "toml", "policy.toml"))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://rw") as client:

        async def check(path: str) -> dict[str, Any]:
            response = await client.post("/v1/check", json={"method": "GET", "path": path, "client": "198.51.100.7"})
            assert response.status_code == 200
            return json.loads(response.content)  # type: ignore[no-any-return]

        assert [(await check(f"/data?api_key={REAL}"))["status"] for _ in range(4)] == [200, 200, 200, 429]
        for i in range(5):
            answer = await check(AMBIGUOUS.format(i))
            assert answer["status"] == 400 and answer["allowed"] is False
        forwarded = await client.get(
            "/check", headers={"X-Original-Method": "GET", "X-Original-URI": AMBIGUOUS.format(9)}
        )
        assert forwarded.status_code == 400 and b"more than once with different values" in forwarded.content


# --- finding 6: a trusted proxy's X-Forwarded-For entry with a port -----------------------------------

_PORTED = [
    *(f"198.51.100.9:{5000 + i}" for i in range(4)),
    *(f"[2001:db8::9]:{6000 + i}" for i in range(4)),
]


def _xff_codes(get: Callable[[str], int]) -> list[int]:
    return [get(entry) for entry in _PORTED]


async def test_asgi_client_ip_drops_the_port_of_a_forwarded_entry() -> None:
    ran: list[str] = []
    app = starlette_app(ran)
    key = ClientIP(trusted_proxies=["127.0.0.0/8"])
    app.add_middleware(RateLimitMiddleware, limiter=frozen(), rules=[Rule("/items", "3/hour", key=key)])
    codes = [
        (await asgi.request(app, "/items", headers=[("x-forwarded-for", entry)], client=("127.0.0.1", 40000))).status
        for entry in _PORTED
    ]
    assert codes == [200, 200, 200, 429] * 2
    assert key(asgi.http_scope(client=("127.0.0.1", 1), headers=[("x-forwarded-for", "198.51.100.9:5000")])) == "198.51.100.9"


def test_wsgi_client_ip_drops_the_port_of_a_forwarded_entry() -> None:
    ran: list[str] = []
    key = ClientIP(trusted_proxies=["127.0.0.1/32"])
    app = WSGIRateLimitMiddleware(flask_app(ran), frozen(), [Rule("/items", "3/hour", key=key)])
    client = WerkzeugClient(app)
    codes = _xff_codes(
        lambda entry: client.get("/items", headers={"X-Forwarded-For": entry}, environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code
    )
    assert codes == [200, 200, 200, 429] * 2
    assert ran == ["GET"] * 6


def test_flask_trusted_proxies_drop_the_port_of_a_forwarded_entry() -> None:
    ran: list[str] = []
    app = flask_app(ran)
    app.config["RATEWARDEN_TRUSTED_PROXIES"] = ["127.0.0.1/32"]
    limiter = RateLimiter(app, limiter=frozen())
    limiter.limit("3/hour")(app.view_functions["items"])
    client = app.test_client()
    codes = _xff_codes(
        lambda entry: client.get("/items", headers={"X-Forwarded-For": entry}, environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code
    )
    assert codes == [200, 200, 200, 429] * 2
    assert ran == ["GET"] * 6


def test_explain_says_a_repeated_keyed_parameter_is_refused() -> None:
    from ratewarden.cli.policy import explain

    lines = explain(parse_policy(_QUERY_POLICY, "toml", "policy.toml"), "get", "/data", [], f"api_key=x&api_key={REAL}")
    assert lines[0].startswith("GET /data: 1 rule(s)")
    assert lines[-1] == "    refused with 400: query parameter 'api_key' is given more than once with different values; send it once"
