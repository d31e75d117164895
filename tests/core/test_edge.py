"""Edge enforcement of ``Depends(RateLimit(...))`` after ``install(app)``: charged once, before
routing, on the route FastAPI itself picks; the OpenAPI documentation of declared limits."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from ratewarden import Limiter, MemoryStore, context_of
from ratewarden.decision import Decision
from ratewarden.fastapi import RateLimit, install
from ratewarden.fastapi.routes import EdgeCheck, resolve
from ratewarden.keys import path_param
from tests.core.asgi import http_scope, request
from tests.core.counted_limit import CountedLimit
from tests.vectors.runner import FakeClock

# Routes serving several methods get one operation id per method; FastAPI warns, harmlessly here.
pytestmark = pytest.mark.filterwarnings("ignore:Duplicate Operation ID:UserWarning")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def limiter(store: MemoryStore) -> Limiter:
    return Limiter(store)


def counters(store: MemoryStore) -> dict[str, float]:
    """Each fixed-window key and the cost charged to it."""
    return {key: state[1] for key in store._data if (state := store.state_of(key)) is not None}


class Calls:
    """Counts what ran: endpoints and other dependencies."""

    def __init__(self) -> None:
        self.endpoint = 0
        self.other = 0

    async def other_dependency(self) -> None:
        self.other += 1


def limited_app(limiter: Limiter, calls: Calls, rate: str = "5/min", installed: bool = True) -> FastAPI:
    app = FastAPI()
    dep = RateLimit(rate, limiter=limiter)

    # The other dependency comes first: FastAPI alone would run it before the limit denies.
    @app.get("/work", dependencies=[Depends(calls.other_dependency), Depends(dep)])
    async def work() -> dict[str, bool]:
        calls.endpoint += 1
        return {"ok": True}

    if installed:
        install(app)
    return app


# --- charged once, denied before routing ----------------------------------------------------------


async def test_each_request_is_charged_once_and_denials_never_reach_the_route(
    limiter: Limiter, store: MemoryStore
) -> None:
    calls = Calls()
    app = limited_app(limiter, calls, "5/min")
    replies = [await request(app, "/work") for _ in range(12)]
    assert [r.status for r in replies] == [200] * 5 + [429] * 7
    # Five allowed requests cost five, not ten: the dependency did not charge again.
    assert counters(store) == {"rw:{GET /work|203.0.113.7}:fixed_window:5/60000": 5.0}
    assert [r.header("x-ratelimit-remaining") for r in replies[:5]] == ["4", "3", "2", "1", "0"]
    # Denied requests ran neither the endpoint nor the other dependency.
    assert (calls.endpoint, calls.other) == (5, 5)
    limited = replies[-1]
    assert limited.header("content-type") == "application/problem+json"
    assert limited.header("retry-after") == "60"
    assert limited.json()["status"] == 429 and limited.json()["policy"] == "GET-/work"


async def test_concurrent_requests_exactly_the_limit(limiter: Limiter, store: MemoryStore) -> None:
    calls = Calls()
    app = limited_app(limiter, calls, "37/min")
    replies = await asyncio.gather(*(request(app, "/work") for _ in range(200)))
    assert sum(r.status == 200 for r in replies) == 37
    assert sum(r.status == 429 for r in replies) == 163
    assert calls.endpoint == 37 and calls.other == 37
    assert list(counters(store).values()) == [37.0]


async def test_without_install_the_dependency_checks_for_itself(limiter: Limiter, store: MemoryStore) -> None:
    calls = Calls()
    app = limited_app(limiter, calls, "2/min", installed=False)
    replies = [await request(app, "/work") for _ in range(4)]
    assert [r.status for r in replies] == [200, 200, 429, 429]
    assert "detail" in replies[-1].json()  # FastAPI's error shape, raised from the dependency
    assert calls.other == 4  # denial came from inside FastAPI, after the other dependency ran
    assert list(counters(store).values()) == [2.0]


async def test_route_gets_the_decision_and_the_edge_check(limiter: Limiter) -> None:
    app = FastAPI()
    dep = RateLimit("3/min", limiter=limiter)
    seen: list[Any] = []

    @app.get("/me")
    async def me(request: Request, decision: Decision = Depends(dep)) -> dict[str, int]:  # noqa: B008
        context = context_of(request)
        seen.append(context.edge if context is not None else None)
        return {"remaining": decision.remaining}

    @app.get("/raw", dependencies=[Depends(dep)])
    async def raw() -> Response:
        return PlainTextResponse("raw")  # a Response of its own: the headers are still added

    install(app)
    reply = await request(app, "/me")
    assert reply.json() == {"remaining": 2}
    check = seen[0]
    assert isinstance(check, EdgeCheck) and check.decision is not None and check.decision.remaining == 2
    raw_reply = await request(app, "/raw")
    assert raw_reply.body == b"raw" and raw_reply.header("x-ratelimit-remaining") == "2"


async def test_router_and_app_level_limits_apply_at_the_edge(limiter: Limiter, store: MemoryStore) -> None:
    calls = Calls()
    app_dep = RateLimit("100/min", limiter=limiter, name="app")
    router_dep = RateLimit("2/min", limiter=limiter)
    app = FastAPI(dependencies=[Depends(app_dep)])
    router = APIRouter(prefix="/v1", dependencies=[Depends(router_dep), Depends(calls.other_dependency)])

    @router.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        calls.endpoint += 1
        return {"id": item_id}

    app.include_router(router)
    install(app)
    replies = [await request(app, f"/v1/items/{i}") for i in range(4)]
    assert [r.status for r in replies] == [200, 200, 429, 429]
    assert (calls.endpoint, calls.other) == (2, 2)
    # Both limits are stated; the per-route one is named by its full, prefixed template.
    assert replies[0].header("ratelimit-policy") == '"app";q=100;w=60, "GET-/v1/items/-item_id-";q=2;w=60'
    assert counters(store) == {
        "rw:{app|203.0.113.7}:fixed_window:100/60000": 2.0,
        "rw:{GET /v1/items/(item_id)|203.0.113.7}:fixed_window:2/60000": 2.0,
    }


async def test_limits_inside_a_mounted_app_and_path_param_keys(limiter: Limiter, store: MemoryStore) -> None:
    sub = FastAPI()
    dep = RateLimit("1/min", limiter=limiter, key=path_param("user"))
    ran: list[str] = []

    @sub.get("/users/{user}", dependencies=[Depends(dep)])
    async def user(user: str) -> dict[str, str]:
        ran.append(user)
        return {"user": user}

    app = FastAPI()
    app.mount("/api", sub)
    install(app)
    statuses = [(await request(app, f"/api/users/{u}")).status for u in ("a", "a", "b", "b")]
    assert statuses == [200, 429, 200, 429]
    assert ran == ["a", "b"]
    assert set(counters(store).values()) == {1.0} and len(counters(store)) == 2


async def test_dependency_overrides_are_respected(limiter: Limiter) -> None:
    calls = Calls()
    app = limited_app(limiter, calls, "1/min")
    dep = next(d.call for d in app.routes[-1].dependant.dependencies if isinstance(d.call, RateLimit))  # type: ignore[attr-defined]
    app.dependency_overrides[dep] = lambda: None
    assert [(await request(app, "/work")).status for _ in range(3)] == [200, 200, 200]


async def test_routes_added_after_the_first_request_are_limited(limiter: Limiter) -> None:
    calls = Calls()
    app = limited_app(limiter, calls, "1/min")
    assert (await request(app, "/work")).status == 200

    @app.get("/late", dependencies=[Depends(RateLimit("1/min", limiter=limiter))])
    async def late() -> dict[str, bool]:
        calls.other += 100
        return {"ok": True}

    assert [(await request(app, "/late")).status for _ in range(2)] == [200, 429]
    assert calls.other == 101


async def test_fail_closed_store_error_answers_503_at_the_edge() -> None:
    class Broken(MemoryStore):
        def hit_now(self, *args: Any) -> Decision:
            raise OSError("store down")

    calls = Calls()
    app = limited_app(Limiter(Broken(), on_error="closed"), calls)
    reply = await request(app, "/work")
    assert reply.status == 503 and reply.header("retry-after") == "1"
    assert calls.endpoint == 0 and calls.other == 0


# --- route matching parity ----------------------------------------------------------------------


def big_app(limiter: Limiter, ran: list[str]) -> FastAPI:
    """A realistic app of 50+ routes: prefixes, nested routers, mounts, converters, methods."""
    names: list[str] = []

    def endpoint(name: str) -> Any:
        async def run(request: Request) -> dict[str, str]:
            ran.append(name)
            return {"ran": name}

        run.label = name  # type: ignore[attr-defined]
        run.__name__ = f"endpoint_{len(names)}"  # unique operation ids
        names.append(name)
        return run

    def plain(name: str) -> Any:
        async def run(request: Request) -> Response:
            ran.append(name)
            return PlainTextResponse(name)

        run.label = name  # type: ignore[attr-defined]
        names.append(name)
        return run

    dep = RateLimit("1000/min", limiter=limiter)
    app = FastAPI(dependencies=[Depends(RateLimit("1000/min", limiter=limiter, name="global"))])
    for path in ("/", "/health", "/items", "/items/{item_id:int}", "/items/{slug}", "/items/new",
                 "/files/{p:path}", "/users/me", "/users/{uid}", "/users/{uid}/posts/{pid:int}",
                 "/floats/{x:float}", "/uuid/{u:uuid}", "/a/b/c", "/a/{b}/c", "/trailing/"):
        app.add_api_route(path, endpoint(f"GET {path}"), methods=["GET"], dependencies=[Depends(dep)])
    app.add_api_route("/items", endpoint("POST /items"), methods=["POST"])
    app.add_api_route("/items/{item_id:int}", endpoint("PUT /items/{item_id:int}"), methods=["PUT", "PATCH"])
    app.add_api_route("/items/{item_id:int}", endpoint("DELETE /items/{item_id:int}"), methods=["DELETE"],
                      dependencies=[Depends(dep)])
    app.add_api_route("/head-too", endpoint("GET,HEAD /head-too"), methods=["GET", "HEAD"])

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(dep)])
    for path in ("/orders", "/orders/{oid:int}", "/orders/{oid:int}/lines/{line}", "/search/{q:path}",
                 "/orders/latest"):
        v1.add_api_route(path, endpoint(f"v1 {path}"), methods=["GET"])
    v1.add_api_route("/orders", endpoint("v1 POST /orders"), methods=["POST"])
    nested = APIRouter(prefix="/admin")
    for path in ("/stats", "/users/{uid}", "/users/{uid}/ban"):
        nested.add_api_route(path, endpoint(f"v1 admin {path}"), methods=["GET", "POST"])
    v1.include_router(nested)
    app.include_router(v1)
    app.include_router(v1, prefix="/v2")  # the same router twice, under two prefixes

    reports = APIRouter(tags=["reports"])
    for path in ("", "/daily", "/daily/{day:int}", "/monthly/{month}", "/export/{fmt}",
                 "/export/{fmt}/{rest:path}", "/{rid:int}", "/{rid:int}/rows", "/{name}", "/{name}/rows"):
        reports.add_api_route(path, endpoint(f"reports GET {path}"), methods=["GET"])
    reports.add_api_route("/{rid:int}", endpoint("reports DELETE /{rid:int}"), methods=["DELETE"])
    app.include_router(reports, prefix="/reports", dependencies=[Depends(dep)])

    bare_router = APIRouter()
    for path in ("/docs-like", "/catalog/{cat}/{item}", "/catalog/{cat}"):
        bare_router.add_api_route(path, endpoint(f"bare {path}"), methods=["GET"])
    app.include_router(bare_router, prefix="/shop", dependencies=[Depends(dep)])

    sub = FastAPI()
    for path in ("/", "/ping", "/things/{tid:int}", "/things/{name}"):
        sub.add_api_route(path, endpoint(f"sub {path}"), methods=["GET"], dependencies=[Depends(dep)])
    app.mount("/sub", sub)

    starlette_sub = Starlette(routes=[
        Route("/", plain("st /")),
        Route("/page/{n:int}", plain("st /page/{n:int}")),
        Mount("/deep", routes=[Route("/leaf/{x}", plain("st deep /leaf/{x}"))]),
    ])
    app.mount("/static-like", starlette_sub)
    app.router.routes.append(Route("/plain/{x}", plain("plain /plain/{x}"), methods=["GET"]))
    app.add_api_route("/{catch_all:path}", endpoint("GET catch-all"), methods=["GET"])
    assert len(names) >= 50  # endpoints; v1's nine routes are served under two prefixes besides
    return app


SAMPLES = [
    ("GET", p) for p in (
        "/", "/health", "/items", "/items/", "/items/42", "/items/abc", "/items/new", "/items/-1",
        "/files/a/b/c.txt", "/files/", "/users/me", "/users/7", "/users/7/posts/3", "/users/7/posts/x",
        "/floats/1.5", "/floats/x", "/uuid/12345678-1234-1234-1234-123456789abc", "/uuid/nope",
        "/a/b/c", "/a/x/c", "/trailing/", "/trailing", "/head-too",
        "/v1/orders", "/v1/orders/5", "/v1/orders/latest", "/v1/orders/5/lines/2", "/v1/search/a/b",
        "/v1/admin/stats", "/v1/admin/users/u1", "/v1/admin/users/u1/ban",
        "/v2/v1/orders", "/v2/v1/orders/9", "/v2/v1/admin/users/u2/ban", "/v3/orders",
        "/shop/docs-like", "/shop/catalog/c/i", "/shop/catalog/c", "/shop/catalog",
        "/sub", "/sub/", "/sub/ping", "/sub/things/3", "/sub/things/bolt", "/sub/nothing",
        "/static-like/", "/static-like/page/2", "/static-like/page/x", "/static-like/deep/leaf/q",
        "/plain/1", "/nowhere/at/all", "/docs", "/openapi.json",
        "/reports", "/reports/", "/reports/daily", "/reports/daily/3", "/reports/daily/x", "/reports/monthly/jan",
        "/reports/export/csv", "/reports/export/csv/a/b", "/reports/12", "/reports/12/rows", "/reports/q4",
        "/reports/q4/rows", "/reports/q4/rows/extra",
    )
] + [
    ("POST", "/items"), ("PUT", "/items/3"), ("PATCH", "/items/3"), ("DELETE", "/items/3"),
    ("DELETE", "/items/abc"), ("POST", "/v1/orders"), ("POST", "/v1/admin/stats"), ("PUT", "/v1/orders"),
    ("HEAD", "/health"), ("HEAD", "/head-too"), ("HEAD", "/static-like/page/2"), ("OPTIONS", "/items"),
    ("POST", "/plain/1"), ("POST", "/sub/ping"), ("DELETE", "/reports/12"), ("DELETE", "/reports/q4"),
    ("POST", "/reports/daily"),
]


@pytest.mark.parametrize(("method", "path"), SAMPLES)
async def test_edge_resolves_the_route_fastapi_runs(limiter: Limiter, method: str, path: str) -> None:
    ran: list[str] = []
    app = big_app(limiter, ran)
    resolved = resolve(app.routes, http_scope(path, method))
    expected = None if resolved is None else getattr(getattr(resolved[0], "endpoint", None), "label", None)
    reply = await request(app, path, method=method)
    actual = ran[0] if ran else None
    if reply.status in (404, 405, 307):
        assert resolved is None, f"{method} {path}: FastAPI answered {reply.status}, the edge picked {resolved}"
    elif actual is None:
        # Nothing of ours ran: FastAPI's own routes (/docs), or a 422 after picking the route.
        assert expected is None or reply.status == 422, (reply.status, resolved)
    else:
        assert resolved is not None, f"{method} {path}: FastAPI ran {actual!r}, the edge found no route"
        assert expected == actual, f"{method} {path}: edge {expected!r}, FastAPI ran {actual!r}"


async def test_edge_and_fastapi_agree_under_install(limiter: Limiter, store: MemoryStore) -> None:
    """With install(), every sample is charged on the route FastAPI runs, and only there."""
    ran: list[str] = []
    app = big_app(limiter, ran)
    install(app)
    for method, path in SAMPLES:
        before = dict(counters(store))
        ran.clear()
        reply = await request(app, path, method=method)
        assert reply.status != 429
        changed = {k for k, v in counters(store).items() if before.get(k) != v}
        if ran and not ran[0].startswith(("st ", "plain ")) and ran[0] not in ("GET catch-all",):
            assert changed, f"{method} {path} ran {ran[0]!r} but charged nothing"
        if not ran and reply.status != 422:
            assert not changed, f"{method} {path} ran nothing but charged {changed}"


# --- OpenAPI --------------------------------------------------------------------------------------


def test_openapi_documents_429_and_headers(limiter: Limiter) -> None:
    app = FastAPI()
    router = APIRouter(prefix="/r", dependencies=[Depends(RateLimit("5/min", limiter=limiter, header_style="ietf"))])

    @router.get("/limited")
    async def limited() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/quiet", dependencies=[Depends(RateLimit("5/min", limiter=limiter, headers="off"))])
    async def quiet() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/free")
    async def free() -> dict[str, bool]:
        return {"ok": True}

    app.include_router(router)
    install(app)
    schema = app.openapi()
    op = schema["paths"]["/r/limited"]["get"]["responses"]
    assert op["429"]["content"]["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/RateLimitProblem"}
    assert set(op["429"]["headers"]) == {"Retry-After", "RateLimit", "RateLimit-Policy"}
    assert set(op["200"]["headers"]) == {"RateLimit", "RateLimit-Policy"}
    quiet_op = schema["paths"]["/quiet"]["get"]["responses"]
    assert set(quiet_op["429"]["headers"]) == {"Retry-After"} and "headers" not in quiet_op["200"]
    assert "429" not in schema["paths"]["/free"]["get"]["responses"]
    problem = schema["components"]["schemas"]["RateLimitProblem"]
    assert {"type", "title", "status", "detail", "retry_after"} <= set(problem["properties"])
    assert app.openapi() is schema  # built once


# --- options and odd cases ----------------------------------------------------------------------


async def test_header_settings_of_the_dependency_apply_at_the_edge(limiter: Limiter) -> None:
    app = FastAPI()

    @app.get("/quiet", dependencies=[Depends(RateLimit("1/min", limiter=limiter, headers="off"))])
    async def quiet() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/ietf", dependencies=[Depends(RateLimit("1/min", limiter=limiter, header_style="ietf"))])
    async def ietf() -> dict[str, bool]:
        return {"ok": True}

    install(app)
    ok, limited = await request(app, "/quiet"), await request(app, "/quiet")
    assert ok.header("ratelimit") is None and ok.header("x-ratelimit-limit") is None
    assert limited.status == 429 and limited.header("retry-after") == "60" and limited.header("ratelimit") is None
    ok = await request(app, "/ietf")
    assert ok.header("ratelimit") == '"GET-/ietf";r=0;t=60' and ok.header("x-ratelimit-limit") is None


async def test_limits_on_two_limiters_both_apply(store: MemoryStore, clock: FakeClock) -> None:
    other_store = MemoryStore(clock=clock)
    app = FastAPI()
    first = RateLimit("3/min", limiter=Limiter(store), name="a")
    second = RateLimit("2/min", limiter=Limiter(other_store), name="b")

    @app.get("/x", dependencies=[Depends(first), Depends(second)])
    async def x() -> dict[str, bool]:
        return {"ok": True}

    install(app)
    replies = [await request(app, "/x") for _ in range(4)]
    assert [r.status for r in replies] == [200, 200, 429, 429]
    assert replies[0].header("ratelimit") == '"b";r=1;t=60'  # the binding (least remaining) limit
    assert list(counters(store).values()) == [3.0]  # the first limiter was charged before the second denied
    assert list(counters(other_store).values()) == [2.0]


async def test_fail_open_store_error_lets_the_request_through_uncharged_once() -> None:
    calls: list[int] = []

    class Broken(MemoryStore):
        def hit_now(self, *args: Any) -> Decision:
            calls.append(1)
            raise OSError("store down")

    app = limited_app(Limiter(Broken(), fallback=None), Calls())
    reply = await request(app, "/work")
    assert reply.status == 200 and reply.header("ratelimit") is None
    assert len(calls) == 1  # the dependency did not try the store a second time


async def test_fail_open_store_error_is_decided_by_the_insurance_limiter_by_default() -> None:
    class Broken(MemoryStore):
        def hit_now(self, *args: Any) -> Decision:
            raise OSError("store down")

    app = limited_app(Limiter(Broken()), Calls(), "2/min")
    assert [(await request(app, "/work")).status for _ in range(3)] == [200, 200, 429]


def test_websockets_pass_through(limiter: Limiter, store: MemoryStore) -> None:
    app = limited_app(limiter, Calls(), "1/min")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    for _ in range(2):
        with TestClient(app).websocket_connect("/ws") as connection:
            assert connection.receive_text() == "hi"
    assert counters(store) == {}


async def test_unknown_paths_and_methods_are_not_charged(limiter: Limiter, store: MemoryStore) -> None:
    app = limited_app(limiter, Calls(), "1/min")
    assert (await request(app, "/missing")).status == 404
    assert (await request(app, "/work", method="POST")).status == 405
    assert counters(store) == {}


async def test_unused_limits_are_lifted_by_default(limiter: Limiter, store: MemoryStore) -> None:
    calls = Calls()
    app = FastAPI()
    dep = CountedLimit("2/min", limiter=limiter)
    router = APIRouter(prefix="/r", dependencies=[Depends(dep), Depends(calls.other_dependency)])

    @router.get("/x")
    async def x() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/used")
    async def used(decision: Decision = Depends(dep)) -> dict[str, int]:  # noqa: B008
        return {"remaining": decision.remaining}  # a used value stays a dependency

    app.include_router(router)
    install(app)
    replies = [await request(app, "/r/x") for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 429]
    assert replies[0].header("x-ratelimit-remaining") == "1" and calls.other == 2
    # FastAPI no longer solves the lifted dependency; the edge and the OpenAPI schema still see it.
    assert dep.solved == 0
    assert [(await request(app, "/used")).json() for _ in range(2)] == [{"remaining": 1}, {"remaining": 0}]
    assert dep.solved == 2  # the parameter form is untouched and gets the edge's decision
    assert sorted(counters(store).values()) == [2.0, 2.0]
    assert "429" in app.openapi()["paths"]["/r/x"]["get"]["responses"]


async def test_lift_false_keeps_the_dependency_in_fastapi(limiter: Limiter, store: MemoryStore) -> None:
    app = FastAPI()
    dep = CountedLimit("2/min", limiter=limiter)

    @app.get("/x", dependencies=[Depends(dep)])
    async def x() -> dict[str, bool]:
        return {"ok": True}

    install(app, lift=False)
    assert [(await request(app, "/x")).status for _ in range(3)] == [200, 200, 429]
    assert dep.solved == 2  # run by FastAPI for each allowed request, returning the edge's decision
    assert list(counters(store).values()) == [2.0]  # charged once each


async def test_concurrent_requests_with_lifting_exactly_the_limit(limiter: Limiter, store: MemoryStore) -> None:
    app = FastAPI()
    lifted = CountedLimit("37/min", limiter=limiter)
    used = CountedLimit("23/min", limiter=limiter)
    got: list[Decision] = []

    @app.get("/lifted", dependencies=[Depends(lifted)])
    async def lifted_route() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/used")
    async def used_route(decision: Decision = Depends(used)) -> dict[str, bool]:  # noqa: B008
        got.append(decision)
        return {"ok": True}

    install(app)
    replies = await asyncio.gather(*(request(app, p) for _ in range(200) for p in ("/lifted", "/used")))
    by_path = {p: [r.status for r in replies[i::2]] for i, p in enumerate(("/lifted", "/used"))}
    assert by_path["/lifted"].count(200) == 37 and by_path["/lifted"].count(429) == 163
    assert by_path["/used"].count(200) == 23 and by_path["/used"].count(429) == 177
    assert sorted(counters(store).values()) == [23.0, 37.0]  # no double charge
    assert lifted.solved == 0 and used.solved == 23
    assert sorted(d.remaining for d in got) == list(range(23))


async def test_nested_or_repeated_install_charges_once(limiter: Limiter, store: MemoryStore) -> None:
    sub = FastAPI()

    @sub.get("/x", dependencies=[Depends(RateLimit("3/min", limiter=limiter))])
    async def x() -> dict[str, bool]:
        return {"ok": True}

    install(sub)
    install(sub)
    app = FastAPI()
    app.mount("/sub", sub)
    install(app)
    assert [(await request(app, "/sub/x")).status for _ in range(4)] == [200, 200, 200, 429]
    assert list(counters(store).values()) == [3.0]


# --- dependency overrides with lifted limits ------------------------------------------------------


def overridable_app(
    limiter: Limiter, calls: Calls, rate: str = "1/min", via_router: bool = False
) -> tuple[FastAPI, CountedLimit]:
    app = FastAPI()
    dep = CountedLimit(rate, limiter=limiter)
    router = APIRouter(dependencies=[Depends(dep)]) if via_router else app.router
    route_deps = [Depends(calls.other_dependency)] if via_router else [Depends(calls.other_dependency), Depends(dep)]

    @router.get("/work", dependencies=route_deps)
    async def work() -> dict[str, bool]:
        calls.endpoint += 1
        return {"ok": True}

    if via_router:
        app.include_router(router)
    install(app)
    return app, dep


@pytest.mark.parametrize("via_router", [False, True])
async def test_override_set_before_the_first_request_runs_and_the_edge_stays_out(
    limiter: Limiter, store: MemoryStore, via_router: bool
) -> None:
    calls = Calls()
    app, dep = overridable_app(limiter, calls, via_router=via_router)
    overridden: list[str] = []
    app.dependency_overrides[dep] = lambda: overridden.append("ran")
    assert [(await request(app, "/work")).status for _ in range(3)] == [200, 200, 200]
    assert overridden == ["ran"] * 3 and counters(store) == {}  # FastAPI ran the override; nothing charged
    del app.dependency_overrides[dep]
    assert [(await request(app, "/work")).status for _ in range(2)] == [200, 429]
    assert list(counters(store).values()) == [1.0]
    assert dep.solved == 0 and overridden == ["ran"] * 3  # lifted again: the edge is the check


@pytest.mark.parametrize("via_router", [False, True])
async def test_override_added_after_requests_were_served(
    limiter: Limiter, store: MemoryStore, via_router: bool
) -> None:
    calls = Calls()
    app, dep = overridable_app(limiter, calls, "2/min", via_router)
    assert [(await request(app, "/work")).status for _ in range(3)] == [200, 200, 429]
    assert dep.solved == 0
    overridden: list[str] = []

    async def override() -> None:
        overridden.append("ran")

    app.dependency_overrides[dep] = override
    assert [(await request(app, "/work")).status for _ in range(3)] == [200, 200, 200]
    assert overridden == ["ran"] * 3 and list(counters(store).values()) == [2.0]
    assert (calls.endpoint, calls.other) == (5, 5)
    app.dependency_overrides.clear()
    assert (await request(app, "/work")).status == 429  # enforced at the edge again
    assert dep.solved == 0 and calls.other == 5


async def test_override_of_one_limit_leaves_the_others_to_their_dependencies(
    limiter: Limiter, store: MemoryStore
) -> None:
    """Overriding a route's parameter-form limit takes the edge out of that route: its lifted
    limit goes back to FastAPI and checks itself, charged once; the route gets the override's value."""
    app = FastAPI()
    lifted = CountedLimit("2/min", limiter=limiter, name="lifted")
    used = CountedLimit("100/min", limiter=limiter, name="used")
    got: list[Any] = []

    @app.get("/both", dependencies=[Depends(lifted)])
    async def both(decision: Any = Depends(used)) -> dict[str, bool]:  # noqa: B008
        got.append(decision)
        return {"ok": True}

    install(app)
    assert (await request(app, "/both")).status == 200
    assert lifted.solved == 0 and isinstance(got[0], Decision)
    app.dependency_overrides[used] = lambda: "stand-in"
    replies = [await request(app, "/both") for _ in range(2)]
    assert [r.status for r in replies] == [200, 429]
    assert replies[1].header("content-type") == "application/problem+json"  # raised by the dependency
    assert got[1:] == ["stand-in"] and lifted.solved == 2
    assert counters(store) == {
        "rw:{lifted|203.0.113.7}:fixed_window:2/60000": 2.0,
        "rw:{used|203.0.113.7}:fixed_window:100/60000": 1.0,
    }
    app.dependency_overrides.clear()
    assert (await request(app, "/both")).status == 429
    assert lifted.solved == 2 and len(got) == 2  # the edge answered; nothing reached FastAPI


async def test_override_removed_while_a_request_past_the_edge_is_unsolved(
    limiter: Limiter, store: MemoryStore
) -> None:
    """A request that skipped the edge for an override, still waiting to be solved when the override
    goes, is charged by its dependency: the limit is not taken out from under it."""
    app = FastAPI()
    dep = CountedLimit("3/min", limiter=limiter)
    entered, release = asyncio.Event(), asyncio.Event()

    async def gate(request: Request) -> None:
        if "x-wait" in request.headers:
            entered.set()
            await release.wait()

    @app.get("/work", dependencies=[Depends(gate), Depends(dep)])
    async def work() -> dict[str, bool]:
        return {"ok": True}

    install(app)
    app.dependency_overrides[dep] = lambda: None
    waiting = asyncio.ensure_future(request(app, "/work", headers=[("x-wait", "1")]))
    await entered.wait()
    app.dependency_overrides.clear()
    assert (await request(app, "/work")).status == 200  # charged at the edge
    release.set()
    assert (await waiting).status == 200  # charged by its dependency, no override left to run
    assert list(counters(store).values()) == [2.0]
    assert dep.solved == 2  # both ran it (the one charged at the edge got the edge's decision)
    assert [(await request(app, "/work")).status for _ in range(2)] == [200, 429]
    assert dep.solved == 2  # lifted again once nothing that skipped the edge was in flight


async def test_override_of_a_dependency_holding_a_limit(limiter: Limiter, store: MemoryStore) -> None:
    """FastAPI does not run the dependencies of an overridden dependency: a limit declared under one
    (here, in the user lookup tests replace) is not enforced at the edge either while it is replaced."""
    app = FastAPI()
    dep = RateLimit("1/min", limiter=limiter)

    async def current_user(decision: Decision = Depends(dep)) -> str:  # noqa: B008
        return "real"

    @app.get("/me")
    async def me(user: str = Depends(current_user)) -> dict[str, str]:
        return {"user": user}

    install(app)
    app.dependency_overrides[current_user] = lambda: "stand-in"
    replies = [await request(app, "/me") for _ in range(3)]
    assert [r.status for r in replies] == [200] * 3 and replies[0].json() == {"user": "stand-in"}
    assert counters(store) == {}
    app.dependency_overrides.clear()
    assert [(await request(app, "/me")).status for _ in range(2)] == [200, 429]
    assert list(counters(store).values()) == [1.0]


async def test_lifted_limits_keep_their_place_when_the_route_table_changes(limiter: Limiter) -> None:
    """The first limit of a route sets the answer's headers: after its lifted limits are taken out
    and the targets rebuilt (a route was added), the order is still FastAPI's."""
    app = FastAPI()
    nested = RateLimit("5/min", limiter=limiter, header_style="ietf")
    lifted = RateLimit("5/min", limiter=limiter, header_style="legacy")

    async def user(decision: Decision = Depends(nested)) -> str:  # noqa: B008
        return "u"

    @app.get("/x", dependencies=[Depends(user), Depends(lifted)])
    async def x() -> dict[str, bool]:
        return {"ok": True}

    install(app)
    first = await request(app, "/x")
    assert first.header("ratelimit") is not None and first.header("x-ratelimit-limit") is None

    @app.get("/added")
    async def added() -> dict[str, bool]:
        return {"ok": True}

    again = await request(app, "/x")
    assert again.header("ratelimit") is not None and again.header("x-ratelimit-limit") is None


async def test_a_route_added_to_a_mounted_app_is_not_lifted_under_a_stale_path_cache(
    limiter: Limiter, store: MemoryStore
) -> None:
    """A path the edge cached as a 404 can lead to a route added later (in a mounted app, whose route
    table the edge checks at most once a second): that route's limit stays with its dependency until
    the edge has dropped its cache, so no request reaches it unchecked."""
    sub = FastAPI()
    app = FastAPI()
    app.mount("/api", sub)
    install(app)
    assert (await request(app, "/api/items/1")).status == 404

    @sub.get("/items/{item_id}", dependencies=[Depends(RateLimit("1/min", limiter=limiter))])
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    assert (await request(app, "/api/items/2")).status == 200  # placed and charged by the edge
    assert (await request(app, "/api/items/1")).status == 429  # stale 404 entry: the dependency checked
    assert list(counters(store).values()) == [1.0]


async def test_lifted_apps_are_not_kept_alive(limiter: Limiter) -> None:
    """What the edge lifted goes with its app: apps built and dropped (an app factory per test, apps
    rebuilt at runtime) leave neither their limits nor their routes behind."""
    dropped: list[weakref.ref[Any]] = []
    for n in range(50):
        app = FastAPI()
        dep = RateLimit("5/min", limiter=limiter)

        @app.get(f"/x{n}", dependencies=[Depends(dep)])
        async def x() -> dict[str, bool]:
            return {"ok": True}

        install(app)
        assert (await request(app, f"/x{n}")).status == 200
        assert app.routes[-1].dependant.dependencies == []  # type: ignore[attr-defined]  # lifted
        dropped += [weakref.ref(dep), weakref.ref(app.routes[-1])]
        del app, dep, x
    gc.collect()
    assert [r for r in dropped if r() is not None] == []
