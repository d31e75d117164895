"""The request state after each integration: ratewarden's one key, ``scope["state"]["ratewarden"]``
(a ``RequestContext``), next to whatever the server or the app put there, and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule, context_of
from ratewarden.context import EdgeCheck, RequestContext
from ratewarden.fastapi import RateLimit, install
from ratewarden.policy import PolicyMiddleware
from ratewarden.starlette import limit
from tests.core.asgi import call, http_scope

SERVER_STATE = {"lifespan": "kept"}  # what a server copies in from the lifespan state


async def ok_app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def scope_with_state(path: str) -> dict[str, Any]:
    scope = http_scope(path)
    scope["state"] = dict(SERVER_STATE)
    return scope


def ours(state: dict[str, Any]) -> list[str]:
    """The keys of ``state`` that ratewarden wrote."""
    return sorted(set(state) - set(SERVER_STATE))


def shared_rules() -> list[Rule]:
    return [Rule("/**", "5/min", name="enforced"), Rule("/**", "1/min", name="trial", shadow=True)]


async def test_plain_middleware_leaves_one_context() -> None:
    scope = scope_with_state("/x")
    reply = await call(RateLimitMiddleware(ok_app, Limiter(MemoryStore()), shared_rules()), scope)
    assert reply.status == 200
    assert ours(scope["state"]) == ["ratewarden"] and scope["state"]["lifespan"] == "kept"
    context = scope["state"]["ratewarden"]
    assert isinstance(context, RequestContext) and context_of(scope) is context
    assert context.decision is not None and context.decision.remaining == 4
    assert [d.remaining for d in context.shadow] == [0]


async def test_plain_middleware_creates_the_state_when_the_server_has_none() -> None:
    scope = http_scope("/x")
    await call(RateLimitMiddleware(ok_app, Limiter(MemoryStore()), [Rule("/**", "5/min")]), scope)
    assert list(scope["state"]) == ["ratewarden"]


async def test_policy_middleware_leaves_one_context() -> None:
    scope = scope_with_state("/x")
    app = PolicyMiddleware(ok_app, Limiter(MemoryStore()), shared_rules(), shadow=True)
    await call(app, scope)
    assert ours(scope["state"]) == ["ratewarden"]
    context = context_of(scope)
    assert context is not None and context.decision is not None and [d.remaining for d in context.shadow] == [0]


async def test_nested_middlewares_share_one_context() -> None:
    limiter = Limiter(MemoryStore())
    inner = RateLimitMiddleware(ok_app, limiter, [Rule("/**", "9/min", name="inner")])
    outer = RateLimitMiddleware(inner, limiter, [Rule("/**", "1/min", name="outer", shadow=True)])
    scope = scope_with_state("/x")
    await call(outer, scope)
    context = context_of(scope)
    assert ours(scope["state"]) == ["ratewarden"]
    assert context is not None and context.decision is not None and context.decision.remaining == 8
    assert len(context.shadow) == 1  # the outer middleware's shadow rule, on the same context


def fastapi_app(limiter: Limiter, installed: bool, seen: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()
    dependency = RateLimit("5/min", limiter=limiter)

    @app.get("/x", dependencies=[Depends(dependency)])
    async def endpoint(request: Request) -> dict[str, bool]:
        seen.append(request.scope["state"])
        return {"ok": True}

    if installed:
        install(app)
    return app


async def test_edge_layer_leaves_one_context() -> None:
    seen: list[dict[str, Any]] = []
    scope = scope_with_state("/x")
    reply = await call(fastapi_app(Limiter(MemoryStore()), True, seen), scope)
    assert reply.status == 200 and reply.header("x-ratelimit-remaining") == "4"
    assert ours(scope["state"]) == ["ratewarden"] and seen[0] is scope["state"]
    context = context_of(scope)
    assert context is not None and isinstance(context.edge, EdgeCheck)
    assert context.edge.decision is not None and context.edge.decision.remaining == 4


async def test_dependency_and_decorator_write_nothing_to_the_state() -> None:
    limiter = Limiter(MemoryStore())
    scope = scope_with_state("/x")
    reply = await call(fastapi_app(limiter, False, []), scope)
    assert reply.header("x-ratelimit-remaining") == "4" and ours(scope["state"]) == []

    @limit("5/min", limiter=limiter, name="decorated")
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse("ok")

    scope = scope_with_state("/d")
    reply = await call(Starlette(routes=[Route("/d", endpoint)]), scope)
    assert reply.header("x-ratelimit-remaining") == "4" and ours(scope["state"]) == []


async def test_websocket_shadow_rules_leave_one_context_that_does_not_grow_per_message() -> None:
    """Regression: a shadow message limit appended every message's decision to the request state
    for the life of the connection."""
    received: list[str] = []

    async def echo(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            received.append(message["text"])

    rules = [Rule("/ws", "5/min", websocket=True, shadow=True, message_rate="100/min")]
    app = RateLimitMiddleware(echo, Limiter(MemoryStore()), rules)
    scope = {"type": "websocket", "path": "/ws", "headers": [], "client": ("203.0.113.7", 1), "state": {}}
    incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for message in [{"type": "websocket.connect"}] + [{"type": "websocket.receive", "text": str(i)} for i in range(50)]:
        incoming.put_nowait(message)
    incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(scope, incoming.get, send)
    assert len(received) == 50
    assert list(scope["state"]) == ["ratewarden"]
    context = context_of(scope)
    assert context is not None and len(context.shadow) == 1  # the connection's, none per message
