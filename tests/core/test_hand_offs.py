"""Hand-offs from a door to the store: the calls between a door's entry and its store call, counted
on the stack at that call (``ratewarden`` frames outside ``stores/``). The step machine's frames are
suspended while its driver answers a step, so a door that translates and drives the core adds none;
no door may take more than the ASGI middleware."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import ratewarden
from ratewarden import Decision, Limit, Limiter, MemoryStore, Rule
from ratewarden.asgi.middleware import RateLimitMiddleware
from ratewarden.policy import parse_policy
from ratewarden.policy.asgi import PolicyMiddleware
from ratewarden.policy.wsgi import WSGIPolicyMiddleware
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.http import ServeApp
from ratewarden.serve.rls import RateLimitService, RequestDescriptor
from ratewarden.serve.spoe import SpoeAgent
from ratewarden.serve.spop import Message
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware

#: mypyc-compiled functions leave no Python frame to count: the counts are taken on the pure-Python
#: package, the layout the doors have (``make test``'s first pass; the wheel passes skip them).
pytestmark = pytest.mark.skipif(ratewarden.COMPILED, reason="compiled frames are not on the Python stack: counted in the pure pass")

_PACKAGE = str(Path(sys.modules["ratewarden"].__file__ or "").parent)
_STORES = str(Path(_PACKAGE) / "stores")

POLICY = """
version = 1

[[rules]]
name = "api"
path = "/**"
rate = "100/hour"
key = "ip"
"""


class Counting(MemoryStore):
    """A memory store that notes the ``ratewarden`` frames (its own excepted) above each charge."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[list[str]] = []

    def _note(self) -> None:
        frame = sys._getframe(2)
        names: list[str] = []
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(_PACKAGE) and not path.startswith(_STORES):
                names.append(frame.f_code.co_name)
            frame = frame.f_back  # type: ignore[assignment]
        self.stacks.append(names[::-1])

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self._note()
        return super().hit_now(keys, limits, costs)

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        self._note()
        return super().hit_one(key, limit, cost)


def hand_offs(store: Counting) -> int:
    """The calls from the door's entry to the store call of the last charge."""
    assert store.stacks, "the door never charged the store"
    return len(store.stacks[-1]) - 1


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b""]


async def _asgi(app: Any, path: str = "/a", headers: dict[str, str] | None = None) -> int:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://rw") as client:
        response = await client.get(path, headers=headers or {})
    return response.status_code


def _wsgi(app: Any) -> None:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/a", "REMOTE_ADDR": "127.0.0.1", "wsgi.input": io.BytesIO(),
               "SERVER_NAME": "rw", "SERVER_PORT": "80", "wsgi.url_scheme": "http", "QUERY_STRING": ""}
    b"".join(app(environ, lambda status, headers, exc_info=None: None))


def _asgi_middleware() -> int:
    store = Counting()
    asyncio.run(_asgi(RateLimitMiddleware(_app, Limiter(store), [Rule("/**", "100/hour")])))
    return hand_offs(store)


def test_the_asgi_middleware_takes_three() -> None:
    assert _asgi_middleware() == 3


def test_the_policy_middlewares_take_no_more() -> None:
    store = Counting()
    asyncio.run(_asgi(PolicyMiddleware(_app, Limiter(store), [Rule("/**", "100/hour")])))
    assert hand_offs(store) <= _asgi_middleware()
    store = Counting()
    _wsgi(WSGIPolicyMiddleware(_wsgi_app, Limiter(store), [Rule("/**", "100/hour")]))
    assert hand_offs(store) <= _asgi_middleware()


def test_the_wsgi_middleware_takes_no_more() -> None:
    store = Counting()
    _wsgi(WSGIRateLimitMiddleware(_wsgi_app, Limiter(store), [Rule("/**", "100/hour")]))
    assert hand_offs(store) <= _asgi_middleware()


def test_serve_check_takes_no_more() -> None:
    """``/check`` through an ASGI server: its entry is ``ServeApp.__call__``."""
    store = Counting()
    app = ServeApp(Limiter(store), parse_policy(POLICY, "toml", "t.toml"))
    status = asyncio.run(_asgi(app, "/check", {"x-original-uri": "/a", "x-original-method": "GET"}))
    assert status == 200
    assert hand_offs(store) <= _asgi_middleware(), store.stacks[-1]


def test_the_spoe_agent_takes_no_more() -> None:
    """A NOTIFY's check: its entry is the agent's ``actions`` (run by the task that ACKs it, and by
    the compiled front door)."""
    store = Counting()
    agent = SpoeAgent(ServeApp(Limiter(store), parse_policy(POLICY, "toml", "t.toml")))
    message = Message("check", {"method": "GET", "uri": "/a"})
    asyncio.run(agent.actions(message, False, ("127.0.0.1", 1)))
    assert hand_offs(store) <= _asgi_middleware() - 1, store.stacks[-1]  # ``_answer`` calls ``actions``


ENVOY = """
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 100
"""


def test_the_grpc_service_takes_no_more() -> None:
    """Envoy's ``ShouldRateLimit``: its entry is ``should_rate_limit`` (awaited by the gRPC servicer
    or by the compiled front door's batch adapter), which translates the descriptors and charges
    them through the core (``charge_items``)."""
    store = Counting()
    service = RateLimitService({"edge": parse_envoy_config(ENVOY)}, Limiter(store))
    answer = asyncio.run(service.should_rate_limit("edge", [RequestDescriptor((("remote_address", "10.0.0.1"),))]))
    assert answer.overall_ok
    assert hand_offs(store) <= _asgi_middleware() - 1, store.stacks[-1]  # the servicer calls it
