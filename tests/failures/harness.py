"""The failure matrix's moving parts: integrations (apps driven by direct ASGI calls), backends
(a store on a real server, and how to break that server) and faults.

Every integration limits one route (``/x``, or the WebSocket ``/x``) to ``LIMIT`` per hour per
client key, the key being the ``x-client`` header; a request with ``x-boom`` makes the key
function raise. ``Driver.attempt`` returns what the client saw, as one word:

* ``served``: the app ran (HTTP 2xx/4xx from the app, WebSocket accepted, message delivered);
* ``limited``: 429 / close 1008 / a ``rate_limit`` notice; ``banned``: 403;
* ``unavailable``: 503 / close 1013 / a message dropped without reaching the app;
* ``error ...``: anything else (a 500, an exception, nothing sent): never allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.charges import Charge
from ratewarden.fastapi import RateLimit, install
from ratewarden.metrics import Metrics
from ratewarden.policy import PolicyMiddleware
from ratewarden.policy.bans import Bans
from ratewarden.policy.delay import Delay
from ratewarden.policy.tiers import PolicyRule
from ratewarden.starlette import limit
from ratewarden.stores.base import Store
from ratewarden.stores.breaker import Breaker
from tests.core.asgi import call, http_scope
from tests.servers import HOST, Server, redis_cmd, wait_until
from tests.timing import queue_waits

LIMIT = 3  # per hour: nothing refills during a cell
RATE = f"{LIMIT}/hour"
ALGORITHM = "gcra"
SLACK = 0.5  # scheduling slack on this shared 2-core machine, added to every bound (0.3 was once exceeded by 47 ms under load)
MAX_WAIT = 0.6  # the delay rule's max_wait


def client_key(scope: MutableMapping[str, Any]) -> str:
    """The ``x-client`` header; raises when ``x-boom`` is present (the "key raises" fault)."""
    headers = dict(scope["headers"])
    if b"x-boom" in headers:
        raise RuntimeError("key service down")
    return headers[b"x-client"].decode()


def _headers(client: str, boom: bool, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    out = [("x-client", client), *extra]
    if boom:
        out.append(("x-boom", "1"))
    return out


_HTTP_OUTCOMES = {429: "limited", 503: "unavailable", 403: "banned"}


def http_outcome(status: int) -> str:
    if status in (200, 404):
        return "served"
    return _HTTP_OUTCOMES.get(status, f"error {status}")


# -- integrations -------------------------------------------------------------------------------


class Driver:
    """One built app and a way to send it one request (or message)."""

    ops = 1  # store round trips on the request path before the app runs

    def __init__(self) -> None:
        self.calls = 0  # times the app (endpoint / WebSocket handler / message handler) ran
        self.app: Any = None

    async def attempt(self, client: str, boom: bool = False, status: int = 200) -> str:
        reply = await call(self.app, http_scope("/x", headers=_headers(client, boom, [("x-status", str(status))])))
        return http_outcome(reply.status)

    async def before_fault(self) -> list[asyncio.Task[str]]:
        """Requests to start before the fault begins (and finish during it)."""
        return []

    async def close(self) -> None:
        pass


async def _endpoint_status(scope: MutableMapping[str, Any]) -> int:
    return int(dict(scope["headers"]).get(b"x-status", b"200"))


class _Asgi(Driver):
    async def endpoint(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        await PlainTextResponse("served", await _endpoint_status(scope))(scope, receive, send)


class MiddlewareDriver(_Asgi):
    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        self.app = RateLimitMiddleware(self.endpoint, limiter, [Rule("/x", RATE, key=client_key, algorithm=ALGORITHM)])


class DependencyDriver(Driver):
    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        app = FastAPI()
        install(app)
        dependency = RateLimit(RATE, limiter=limiter, key=client_key, algorithm=ALGORITHM)

        @app.get("/x", dependencies=[Depends(dependency)])
        async def endpoint() -> dict[str, bool]:
            self.calls += 1
            return {"ok": True}

        self.app = app


class DecoratorDriver(Driver):
    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()

        @limit(RATE, limiter=limiter, key=client_key, algorithm=ALGORITHM)
        async def endpoint(request: Request) -> Response:
            self.calls += 1
            return PlainTextResponse("served")

        self.app = Starlette(routes=[Route("/x", endpoint)])


class BansDriver(_Asgi):
    ops = 2  # the ban read, then the check

    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        bans = Bans(after=2, within=60, duration=60, key=client_key, cache_for=0)
        rules = [Rule("/x", RATE, key=client_key, algorithm=ALGORITHM)]
        self.app = PolicyMiddleware(self.endpoint, limiter, rules, bans=bans, metrics=metrics)


class DelayDriver(_Asgi):
    """``/x`` never waits (its retry time is far past ``max_wait``); ``/fast`` (4/s) does: one
    request is left waiting on it when the fault begins, so its re-check meets the fault."""

    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        self.fast_delay = Delay(max_wait=MAX_WAIT, burst=5)
        rules = [
            PolicyRule("/x", RATE, key=client_key, algorithm=ALGORITHM, delay=Delay(max_wait=MAX_WAIT)),
            PolicyRule("/fast", "4/s", key=client_key, algorithm=ALGORITHM, delay=self.fast_delay),
        ]
        self.app = PolicyMiddleware(self.endpoint, limiter, rules, metrics=metrics)
        self.waiting = False

    async def _fast(self, client: str) -> str:
        reply = await call(self.app, http_scope("/fast", headers=_headers(client, False)))
        return http_outcome(reply.status)

    async def before_fault(self) -> list[asyncio.Task[str]]:
        client = f"w-{uuid.uuid4().hex[:8]}"
        for _ in range(4):  # the burst
            assert await self._fast(client) == "served"
        waiter = asyncio.ensure_future(self._fast(client))
        deadline = time.monotonic() + 1
        while self.fast_delay.waiting == 0:
            assert time.monotonic() < deadline and not waiter.done(), "the request did not wait"
            await asyncio.sleep(0.002)
        return [waiter]


class ChargeDriver(_Asgi):
    """Only 2xx answers count: a 404 is refunded after the response."""

    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        rules = [PolicyRule("/x", RATE, key=client_key, algorithm=ALGORITHM, charge=Charge(["2xx"]))]
        self.app = PolicyMiddleware(self.endpoint, limiter, rules, metrics=metrics)


def _ws_scope(client: str, boom: bool) -> dict[str, Any]:
    return {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "scheme": "ws",
        "path": "/x",
        "raw_path": b"/x",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in _headers(client, boom)],
        "client": ("203.0.113.7", 50000),
        "server": ("testserver", 80),
        "subprotocols": [],
        "extensions": {"websocket.http.response": {}},
    }


def _ws_outcome(message: MutableMapping[str, Any]) -> str:
    kind = message["type"]
    if kind == "websocket.accept":
        return "served"
    if kind == "websocket.http.response.start":
        return http_outcome(message["status"])
    if kind == "websocket.close":
        return {1008: "limited", 1013: "unavailable"}.get(message.get("code", 1000), f"error close {message.get('code')}")
    return f"error {kind}"


async def _finish(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class ConnectDriver(Driver):
    """One attempt = one WebSocket connection (limited on connect)."""

    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        rules = [Rule("/x", RATE, key=client_key, algorithm=ALGORITHM, websocket=True)]
        self.app = RateLimitMiddleware(self.handler, limiter, rules)

    async def handler(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        self.calls += 1
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    async def attempt(self, client: str, boom: bool = False, status: int = 200) -> str:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        inbox.put_nowait({"type": "websocket.connect"})
        first: asyncio.Future[MutableMapping[str, Any]] = asyncio.get_running_loop().create_future()

        async def send(message: MutableMapping[str, Any]) -> None:
            if not first.done():
                first.set_result(message)

        task = asyncio.ensure_future(self.app(_ws_scope(client, boom), inbox.get, send))
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():
                exc = task.exception()
                return f"error {exc!r}" if exc else "error nothing sent"
            inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
            await asyncio.wait_for(task, 5)
            return _ws_outcome(first.result())
        finally:
            await _finish(task)


@dataclass
class _Connection:
    task: asyncio.Task[None]
    inbox: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    sent: list[MutableMapping[str, Any]] = field(default_factory=list)
    taken: asyncio.Event = field(default_factory=asyncio.Event)  # the middleware asked for the next message


class MessageDriver(Driver):
    """One attempt = one message on the client's (long-lived) connection, limited per message."""

    def __init__(self, limiter: Limiter, metrics: Metrics) -> None:
        super().__init__()
        rules = [Rule("/x", message_rate=RATE, key=client_key, algorithm=ALGORITHM)]
        self.app = RateLimitMiddleware(self.handler, limiter, rules)
        self.connections: dict[tuple[str, bool], _Connection] = {}

    async def handler(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            self.calls += 1
            await send({"type": "websocket.send", "text": "echo"})

    async def _connect(self, client: str, boom: bool) -> _Connection:
        found = self.connections.get((client, boom))
        if found is not None and not found.task.done():
            return found
        conn: _Connection

        async def receive() -> dict[str, Any]:
            conn.taken.set()
            return await conn.inbox.get()

        async def send(message: MutableMapping[str, Any]) -> None:
            conn.sent.append(message)

        conn = _Connection(asyncio.ensure_future(self.app(_ws_scope(client, boom), lambda: receive(), send)))
        conn.inbox.put_nowait({"type": "websocket.connect"})
        while not conn.sent:
            await asyncio.sleep(0.001)
            assert not conn.task.done(), "connection ended before accept"
        assert conn.sent[0]["type"] == "websocket.accept", conn.sent
        await conn.taken.wait()
        self.connections[(client, boom)] = conn
        return conn

    async def attempt(self, client: str, boom: bool = False, status: int = 200) -> str:
        conn = await self._connect(client, boom)
        calls, sent = self.calls, len(conn.sent)
        conn.taken.clear()
        conn.inbox.put_nowait({"type": "websocket.receive", "text": "hi"})
        try:
            await asyncio.wait({conn.task, asyncio.ensure_future(conn.taken.wait())}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _finish(conn.task)  # the client is gone: so is its connection
            raise
        if conn.task.done() and conn.task.exception() is not None:
            return f"error {conn.task.exception()!r}"
        if self.calls > calls:
            return "served"
        replies = conn.sent[sent:]
        if not replies:
            return "unavailable"  # dropped without reaching the app
        last = replies[-1]
        if last["type"] == "websocket.send" and json.loads(last["text"]).get("type") == "rate_limit":
            return "limited"
        return _ws_outcome(last)

    async def close(self) -> None:
        for conn in self.connections.values():
            conn.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        for conn in self.connections.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(conn.task), 1)
            await _finish(conn.task)


INTEGRATIONS: dict[str, Callable[[Limiter, Metrics], Driver]] = {
    "middleware": MiddlewareDriver,
    "dependency": DependencyDriver,
    "decorator": DecoratorDriver,
    "ws-connect": ConnectDriver,
    "ws-message": MessageDriver,
    "policy-bans": BansDriver,
    "policy-delay": DelayDriver,
    "policy-charge": ChargeDriver,
}


# -- backends and faults ------------------------------------------------------------------------


@dataclass
class Backend:
    """A store on a real server, and the processes/ports a fault acts on."""

    name: str
    timeout: float
    make: Callable[[], Store]
    processes: list[Server] = field(default_factory=list)
    redis_ports: list[int] = field(default_factory=list)  # where error replies are switched on
    after_restart: Callable[[], None] = lambda: None
    fallback: bool = False  # a Breaker answering from a local fallback while the server fails

    def kill(self) -> None:
        for server in self.processes:
            server.stop()

    def restart(self) -> None:
        for server in self.processes:
            server.start()
        self.after_restart()

    def pause(self) -> None:
        for server in self.processes:
            server.pause()

    def resume(self) -> None:
        for server in self.processes:
            server.resume()

    def redis(self, *args: str) -> None:
        for port in self.redis_ports:
            out = redis_cmd(port, *args)
            assert out == "OK", f"{args} on {port}: {out!r}"


class Fault:
    """Starts and ends one kind of failure on a backend."""

    name = ""
    #: "hold": the fault lasts until the requests sent during it are answered (or time out);
    #: "cancel": the requests are cancelled mid-check (the client went away).
    mode = "hold"

    def begin(self, backend: Backend) -> None:
        pass

    def sent(self, backend: Backend) -> None:
        """The requests of the fault are in flight (called once, after ``begin``)."""

    def end(self, backend: Backend) -> None:
        pass


class Down(Fault):
    name = "down"

    def begin(self, backend: Backend) -> None:
        backend.kill()

    def end(self, backend: Backend) -> None:
        backend.restart()


class Paused(Fault):
    name = "paused"

    def begin(self, backend: Backend) -> None:
        backend.pause()

    def end(self, backend: Backend) -> None:
        backend.resume()


class Slow(Fault):
    """Paused for a little longer than the timeout, then resumed by itself: every reply is late."""

    name = "slow"

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None
        self.round_trips = 1  # set by the runner: every round trip of the request path is late
        self.pause_for = 0.0
        self.sent_at = 0.0
        self.loop_thread = (0, 0)  # (pid, tid) of the event loop's thread, whose stalls count
        self.loop_waited = 0.0

    def begin(self, backend: Backend) -> None:
        backend.pause()

    def sent(self, backend: Backend) -> None:
        # Longer than the longest a check may wait: 2 x timeout per round trip (a late timer adds
        # one timeout at most on a loop that keeps up; see stores/deadline.py), plus twice what the
        # event loop's thread waited for a core meanwhile (its stalls delay the checks' timers as
        # much; tests/timing.py), 4 x the first at most. Armed once the requests are in flight, not
        # at the pause: a scheduling stall between the two on a loaded machine would otherwise let
        # every reply be on time.
        self.pause_for = backend.timeout * (2 * self.round_trips + 0.6)
        self.loop_thread = (os.getpid(), threading.get_native_id())
        self.loop_waited = queue_waits().get(self.loop_thread, 0.0)
        self.sent_at = time.monotonic()
        self._arm(backend, self.pause_for)

    def _arm(self, backend: Backend, delay: float) -> None:
        self.timer = threading.Timer(delay, self._resume_when_late, (backend,))
        self.timer.start()

    def _resume_when_late(self, backend: Backend) -> None:
        stalled = queue_waits().get(self.loop_thread, 0.0) - self.loop_waited
        left = min(self.pause_for + 2 * stalled, 4 * self.pause_for) - (time.monotonic() - self.sent_at)
        if left > 0.005:
            self._arm(backend, left)
        else:
            backend.resume()

    def end(self, backend: Backend) -> None:
        while self.timer is not None:
            timer = self.timer
            timer.join()
            if self.timer is timer:
                break
        backend.resume()


class OutOfMemory(Fault):
    name = "oom"

    def begin(self, backend: Backend) -> None:
        backend.redis("CONFIG", "SET", "maxmemory", "1")

    def end(self, backend: Backend) -> None:
        backend.redis("CONFIG", "SET", "maxmemory", "0")


class ReadOnly(Fault):
    """The server turned into a replica (of nothing reachable): every write is ``READONLY``."""

    name = "readonly"

    def begin(self, backend: Backend) -> None:
        backend.redis("REPLICAOF", HOST, "1")

    def end(self, backend: Backend) -> None:
        backend.redis("REPLICAOF", "NO", "ONE")


class KeyRaises(Fault):
    name = "key-raises"


class Disconnect(Fault):
    """The client goes away while its check waits on the (paused) server."""

    name = "disconnect"
    mode = "cancel"

    def begin(self, backend: Backend) -> None:
        backend.pause()

    def end(self, backend: Backend) -> None:
        backend.resume()


FAULTS: dict[str, Callable[[], Fault]] = {
    f.name: f for f in (Down, Paused, OutOfMemory, ReadOnly, Slow, KeyRaises, Disconnect)  # type: ignore[misc]
}

# Which faults apply to which backend (the others are not applicable: see docs/operations.md).
APPLICABLE = {
    "memory": ["key-raises"],
    "redis": ["down", "paused", "oom", "readonly", "slow", "key-raises", "disconnect"],
    "sentinel": ["down", "paused", "oom", "slow", "key-raises", "disconnect"],
    "cluster": ["down", "paused", "oom", "slow", "key-raises", "disconnect"],
    "memcached": ["down", "paused", "slow", "key-raises", "disconnect"],
    "breaker": ["down", "paused", "oom", "readonly", "slow", "key-raises", "disconnect"],
}


def cluster_ok(ports: Iterable[int]) -> Callable[[], None]:
    def wait() -> None:
        for port in ports:
            wait_until(lambda p=port: "cluster_state:ok" in redis_cmd(p, "CLUSTER", "INFO"), 30, f"cluster {port}", 0.05)

    return wait


def memory_backend() -> Backend:
    return Backend("memory", 0.0, MemoryStore)


def breaker_of(store: Store) -> Breaker:
    return Breaker(store, failures=2, cooldown=0.2, fallback=MemoryStore())
