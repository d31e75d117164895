"""The doors of the conformance matrix: each builds its own configuration from a case's rules,
sends the case's request through a real client of that door, and returns what came back.

HTTP doors are spoken to with httpx (``ASGITransport``/``WSGITransport``: the whole app, in
process), ``ratewarden serve``'s HTTP API through uvicorn on a loopback port, gRPC with the
published Envoy API's client, and SPOE over a raw socket with the SPOP client of
``tests/serve/test_spoe.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ratewarden import Decision, Limit, Limiter, MemoryStore, RateLimitMiddleware, Rule, RuleSet
from ratewarden.errors import StoreError
from ratewarden.keys import KeyFunc, client_ip, header, query_param
from ratewarden.policy import PolicyMiddleware, WSGIPolicyMiddleware, parse_policy
from ratewarden.rates import parse_rates
from ratewarden.serve.http import ServeApp
from ratewarden.storage_keys import storage_key
from ratewarden.stores import RedisStore, SharedMemoryStore
from ratewarden.stores.base import Store
from ratewarden.stores.shared_memory.layout import HEADER_SIZE
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.shm import SHM_DIR, unique_name

from .cases import NOW, TRACKED, Case

Answer = tuple[int, dict[str, str]]  # status, the TRACKED headers present


def frozen() -> float:
    return NOW


#: The stores every case runs on (``Backend``).
STORE_KINDS = ("memory", "shm", "redis")
#: What a failing store's checks wait, in seconds: a held lock's deadline, a paused Redis's timeout.
FAULT_TIMEOUT = 0.2
SHM_KEYS = 1000
#: A healthy Redis's timeout: generous, so a loaded machine never turns an answer into a failure.
HEALTHY_TIMEOUT = 5.0
#: ``StoreError.reason`` of each fault (memory's stand-ins raise it; the real stores' own failures give it).
REASONS = {"timeout": "timeout", "error": "unreachable", "corrupt": "error"}


def raising(cls: type[Any], failure: Callable[[], BaseException]) -> type[Any]:
    """``cls`` whose every check raises ``failure()``; peeks still read the store."""

    def fail(self: Any, *args: Any) -> Decision:
        raise failure()

    async def fail_async(self: Any, *args: Any) -> Decision:
        raise failure()

    methods = {"hit_now": fail, "hit_one": fail, "hit_blocking": fail, "hit": fail_async}
    return type(f"Failing{cls.__name__}", (cls,), methods)


def hold_every_lock(name: str, directory: str, connection: Any) -> None:
    """In a child process: take every region lock of the table ``name`` and keep them (a worker
    stopped while holding its locks)."""
    import time

    from ratewarden.stores.shared_memory import locks

    store = SharedMemoryStore(name, max_keys=SHM_KEYS, directory=directory, log_size=0, lock_timeout=FAULT_TIMEOUT)
    seg = store._segment()
    for region in [*seg.regions, seg.overflow]:
        locks.lock(seg, region)
    connection.send(True)
    time.sleep(3600)


@dataclass
class Backend:
    """The store kind the current test runs on (``test_matrix`` sets ``BACKEND`` per test): it
    opens each door's store, healthy or failing as the case says, and closes them after the test.

    A failing store fails for real where its kind can: shared memory with every lock held by
    another process (timeout), closed (error) or its table overwritten with garbage (corrupt);
    Redis paused (timeout), refusing connections (error) or holding wrong-typed values at the
    case's keys (corrupt). ``MemoryStore`` has no lock, connection or bytes to break: its failing
    stores raise the ``StoreError`` of each fault."""

    kind: str = "memory"
    prefix: str = "rw"  # the limiters': unique per test, so tests sharing a Redis never meet
    redis_url: str = ""  # the session's server
    paused: Any = None  # a RedisStandalone of the module's, stopped (SIGSTOP) during the sends (timeouts)
    refused_url: str = ""  # a port nothing listens on (errors)
    locked: Any = None  # a SharedMemoryStore whose locks another process holds (timeouts)
    opened: list[Store] = field(default_factory=list)
    limiters: list[Limiter] = field(default_factory=list)  # those ``limiter_for`` built

    def store(self, case: Case) -> Store:
        store = self._open(case)
        if store is not self.locked:
            self.opened.append(store)
        return store

    def _open(self, case: Case) -> Store:
        fault = case.fault
        if self.kind == "memory":
            if case.crashing_store:
                return raising(MemoryStore, lambda: RuntimeError("a bug in the store"))(clock=frozen)
            if fault:
                return raising(MemoryStore, lambda: StoreError(f"memory: {fault}", reason=REASONS[fault]))(clock=frozen)
            return MemoryStore(clock=frozen)
        if self.kind == "shm":
            if fault == "timeout":
                return self.locked
            cls = raising(SharedMemoryStore, lambda: RuntimeError("a bug in the store")) if case.crashing_store else SharedMemoryStore
            shm = cls(unique_name(), max_keys=SHM_KEYS, directory=SHM_DIR, log_size=0, clock=frozen,
                      lock_timeout=FAULT_TIMEOUT)
            shm.unlink()
            if fault == "corrupt":  # every byte after the file header (the locks too): see tests/stores/test_shm_garbage.py
                mm = shm._segment().mm
                mm[HEADER_SIZE:] = random.Random(1).randbytes(len(mm) - HEADER_SIZE)
            elif fault == "error":  # closed: every call raises SharedMemoryError
                with contextlib.suppress(StopIteration):
                    shm.close().send(None)  # a coroutine that never suspends
            return shm
        if fault == "timeout":
            return RedisStore(self.paused.url, timeout=FAULT_TIMEOUT, connect_timeout=FAULT_TIMEOUT)
        if fault == "error":
            return RedisStore(self.refused_url, timeout=FAULT_TIMEOUT, connect_timeout=FAULT_TIMEOUT)
        cls = raising(RedisStore, lambda: RuntimeError("a bug in the store")) if case.crashing_store else RedisStore
        if fault == "corrupt":
            import redis

            with redis.Redis.from_url(self.redis_url) as client:
                for keys in candidate_keys(case, self.prefix).values():
                    for key in keys:
                        client.rpush(key, "not a counter")
                        client.pexpire(key, 60_000)
        return cls(self.redis_url, clock=frozen, timeout=HEALTHY_TIMEOUT)  # type: ignore[no-any-return]

    def heal(self) -> None:
        """Resume the paused Redis (its clients' connections then close at once, and what it was
        charged can be read)."""
        if self.paused is not None:
            self.paused.server.resume()

    async def close(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Close every store opened, on ``loop`` if a door used them there (uvicorn's)."""
        self.heal()
        for store in self.opened:
            if loop is None or loop is asyncio.get_running_loop():
                await store.close()
            else:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(store.close(), loop))
        self.opened.clear()

    def reason(self, case: Case) -> str:
        """``StoreError.reason`` of the case's failing store (a closed shared-memory store's is "error")."""
        return "error" if self.kind == "shm" and case.fault == "error" else REASONS[case.fault]

    def failures(self) -> dict[str, int]:
        """The checks the limiters decided without their store, by failure reason."""
        out: dict[str, int] = {}
        for limiter in self.limiters:
            for reason, count in limiter.without_store().items():
                if reason in ("timeout", "unreachable", "error") and count:
                    out[reason] = out.get(reason, 0) + count
        return out

    def readable(self, case: Case) -> bool:
        """Whether what the case's store was charged can be read back (a broken real store cannot;
        a resumed Redis can: the checks that reached it late, past their deadline, charged nothing)."""
        return not case.fault or self.kind == "memory" or (self.kind == "redis" and case.fault == "timeout")


BACKEND = Backend()


def store_for(case: Case) -> Store:
    return BACKEND.store(case)


def limiter_for(store: Store, case: Case) -> Limiter:
    limiter = Limiter(store, on_error="closed" if case.failing_store else "open", prefix=BACKEND.prefix)
    BACKEND.limiters.append(limiter)
    return limiter


def candidate_keys(case: Case, prefix: str) -> dict[str, list[str]]:
    """By rate (as the case writes it): every storage key a door may charge it to, under the rule's
    name, Flask's endpoint names or Envoy's descriptors, for the case's client."""
    namespaces = [spec.name for spec in case.rules] + ["items"] + [f"items-{i}" for i in range(1, len(case.rules))]
    identities = [("", ns, case.client) for ns in namespaces]
    if case.envoy is not None:
        identities += [("", "envoy:case", f"{k}={v}") for d in case.envoy.descriptors for k, v in d]
    out: dict[str, list[str]] = {}
    for spec in case.rules:
        if spec.bypass:
            continue
        for text, rate in zip(spec.rate.split(";"), parse_rates(spec.rate), strict=True):
            suffix = Limit(rate, "fixed_window").suffix
            out[text.strip()] = list(dict.fromkeys(storage_key(prefix, ns, key, suffix) for _, ns, key in identities))
    return out


def charged(store: Store, case: Case) -> dict[str, int]:
    """Units charged to each rate of the case's rules, summed over every key a door may use, read
    with the store's own ``peek``."""
    out: dict[str, int] = {}
    for text, keys in candidate_keys(case, BACKEND.prefix).items():
        limit = Limit(parse_rates(text)[0], "fixed_window")
        used = sum(limit.quota - d.remaining for d in store.peek_blocking(keys, [limit] * len(keys)))
        if used:
            out[text] = int(used)
    return out


def tracked(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        name = name.lower()
        if name in TRACKED:
            out[name] = value if name not in out else f"{out[name]}, {value}"
    return out


def url(case: Case) -> str:
    return case.path + (f"?{case.query}" if case.query else "")


# -- configurations ----------------------------------------------------------------------------------


def key_function(spec: str) -> KeyFunc:
    kind, _, arg = spec.partition(":")
    if kind == "header":
        return header(arg)
    if kind == "query":
        return query_param(arg)
    return client_ip


def rules_of(case: Case) -> list[Rule]:
    out = []
    for spec in case.rules:
        if spec.bypass:
            out.append(Rule(spec.path, bypass=True, name=spec.name))
            continue
        out.append(Rule(
            spec.path, spec.rate, key=key_function(spec.key), algorithm="fixed_window",
            methods=spec.methods or None, name=spec.name, cost=spec.cost, shadow=spec.shadow,
        ))
    return out


def policy_text(case: Case) -> str:
    lines = ["version = 1", ""]
    for spec in case.rules:
        lines += ["[[rules]]", f"name = {json.dumps(spec.name)}", f"path = {json.dumps(spec.path)}"]
        if spec.bypass:
            lines += ["bypass = true", ""]
            continue
        rates = [r.strip() for r in spec.rate.split(";")]
        lines += [f"rate = {json.dumps(rates if len(rates) > 1 else rates[0])}", f"key = {json.dumps(spec.key)}",
                  'algorithm = "fixed_window"', f"cost = {spec.cost}"]
        if spec.methods:
            lines.append(f"methods = {json.dumps(list(spec.methods))}")
        if spec.shadow:
            lines.append("shadow = true")
        lines.append("")
    return "\n".join(lines)


def django_rules(case: Case) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for spec in case.rules:
        rule: dict[str, Any] = {"path": spec.path, "name": spec.name}
        if spec.bypass:
            rule["bypass"] = True
        else:
            kind, _, arg = spec.key.partition(":")
            rule.update(rate=spec.rate, algorithm="fixed_window", cost=spec.cost, shadow=spec.shadow,
                        key={"query": f"get:{arg}", "header": spec.key}.get(kind, "ip"))
            if spec.methods:
                rule["methods"] = list(spec.methods)
        out.append(rule)
    return out


# -- the apps behind the middleware --------------------------------------------------------------------


async def asgi_ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"" if scope["method"].upper() == "HEAD" else b"ok"})


def wsgi_ok(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def asgi_method(app: Any, method: str) -> Any:
    """``app`` seeing ``method`` as the server gave it (httpx upper-cases every method it sends)."""

    async def shim(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope["method"] = method
        await app(scope, receive, send)

    return shim


def wsgi_method(app: Any, method: str) -> Any:
    def shim(environ: dict[str, Any], start_response: Any) -> Any:
        environ["REQUEST_METHOD"] = method
        return app(environ, start_response)

    return shim


# -- doors ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    answers: list[Answer]
    store: Store


async def _send_async(client: httpx.AsyncClient, case: Case) -> list[Answer]:
    out = []
    for _ in range(case.sends):
        r = await client.request(case.method.upper(), url(case), headers=dict(case.request_headers))
        out.append((r.status_code, tracked(r.headers.items())))
    return out


def _send_sync(client: httpx.Client, case: Case) -> list[Answer]:
    out = []
    for _ in range(case.sends):
        r = client.request(case.method.upper(), url(case), headers=dict(case.request_headers))
        out.append((r.status_code, tracked(r.headers.items())))
    return out


async def run_asgi(case: Case, make: Callable[[Any, Limiter], Any]) -> Run:
    store = store_for(case)
    limiter = limiter_for(store, case)
    app = asgi_method(make(asgi_ok, limiter), case.method)
    transport = httpx.ASGITransport(app=app, client=(case.client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return Run(await _send_async(client, case), store)


def run_wsgi(case: Case, app: Any, store: Store) -> Run:
    transport = httpx.WSGITransport(app=wsgi_method(app, case.method), remote_addr=case.client)
    with httpx.Client(transport=transport, base_url="http://testserver") as client:
        return Run(_send_sync(client, case), store)


async def door_asgi(case: Case) -> Run:
    return await run_asgi(case, lambda app, limiter: RateLimitMiddleware(app, limiter, rules_of(case)))


async def door_asgi_policy(case: Case) -> Run:
    policy = parse_policy(policy_text(case), "toml", "case.toml")
    return await run_asgi(case, lambda app, limiter: PolicyMiddleware(app, limiter, policy=policy))


async def door_wsgi(case: Case) -> Run:
    store = store_for(case)
    return run_wsgi(case, WSGIRateLimitMiddleware(wsgi_ok, limiter_for(store, case), rules_of(case)), store)


async def door_wsgi_policy(case: Case) -> Run:
    store = store_for(case)
    policy = parse_policy(policy_text(case), "toml", "case.toml")
    return run_wsgi(case, WSGIPolicyMiddleware(wsgi_ok, limiter_for(store, case), policy=policy), store)


async def door_flask(case: Case) -> Run:
    from flask import Flask

    from ratewarden.flask import RateLimiter

    store = store_for(case)
    app = Flask("conformance")
    extension = RateLimiter(app, limiter=limiter_for(store, case))

    def items() -> str:
        return "ok"

    view: Any = items
    # The rules' own matching says which apply (none when a bypass rule matches); each is a @limit.
    names = {r.rule.name for r in RuleSet(rules_of(case)).match(case.method, case.path)}
    for spec in reversed(case.rules):
        if spec.name in names:
            view = extension.limit(spec.rate, key=key_function(spec.key), cost=spec.cost,
                                   methods=list(spec.methods) or None, algorithm="fixed_window")(view)
    app.add_url_rule(case.path, "items", view, methods=["GET", "POST", "PUT"])
    return run_wsgi(case, app, store)


async def door_django(case: Case) -> Run:
    import django
    from django.conf import settings as django_settings
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.utils import override_settings

    if not django_settings.configured:  # as tests/django/conftest.py configures it, when it has not
        from tests.django import settings as test_settings

        django_settings.configure(**{n: getattr(test_settings, n) for n in dir(test_settings) if n.isupper()})
        django.setup()
    store = store_for(case)
    settings = {
        "STORE": store, "RULES": django_rules(case), "ON_ERROR": "closed" if case.failing_store else "open",
        "PREFIX": BACKEND.prefix,
    }
    with override_settings(ROOT_URLCONF="tests.conformance.django_urls", MIDDLEWARE=["ratewarden.django.RateLimitMiddleware"],
                           RATEWARDEN=settings):
        return run_wsgi(case, WSGIHandler(), store)


async def door_sanic(case: Case) -> Run:
    from sanic import response

    from ratewarden.sanic import RateLimiter
    from tests.sanic.server import new_app, started

    store = store_for(case)
    app = new_app()
    RateLimiter(app, limiter_for(store, case), rules_of(case))

    async def items(request: Any) -> Any:
        return response.text("ok")

    app.route(case.path, methods=["GET", "HEAD", "POST", "PUT"])(items)
    # Sanic as an ASGI app (tests/sanic serve it on a socket), so the peer is the case's client.
    transport = httpx.ASGITransport(app=asgi_method(app, case.method), client=(case.client, 40000))
    async with started(app), httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return Run(await _send_async(client, case), store)


async def door_litestar(case: Case) -> Run:
    from litestar import Litestar, head, route

    from ratewarden.litestar import RateLimitPlugin

    store = store_for(case)
    plugin = RateLimitPlugin(limiter_for(store, case), rules_of(case))

    @route(case.path, http_method=["GET", "POST", "PUT"], status_code=200)
    async def items() -> str:
        return "ok"

    @head(case.path)
    async def items_head() -> None:
        return None

    app = Litestar([items, items_head], plugins=[plugin], openapi_config=None)
    transport = httpx.ASGITransport(app=asgi_method(app, case.method), client=(case.client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return Run(await _send_async(client, case), store)


# -- ratewarden serve ----------------------------------------------------------------------------------


class Dispatch:
    """One ASGI app for a whole module's uvicorn: each request goes to the case app named by its
    ``X-Conformance-Case`` header (one server, a fresh ``ServeApp`` and store per case)."""

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # uvicorn's: the case stores' connections are on it

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        if scope["type"] != "http":
            return
        name = dict(scope["headers"]).get(b"x-conformance-case", b"").decode()
        await self.apps[name](scope, receive, send)


@dataclass
class Serve:
    dispatch: Dispatch
    port: int


def serve_app(case: Case) -> tuple[ServeApp, Store]:
    store = store_for(case)
    return ServeApp(limiter_for(store, case), parse_policy(policy_text(case), "toml", "case.toml")), store


async def _checks(case: Case, port: int, key: str) -> list[tuple[int, dict[str, str]]]:
    """The case's ``/check`` calls to ``serve``'s HTTP server on ``port`` (an nginx ``auth_request``'s)."""
    headers = {
        **case.request_headers, "X-Original-URI": url(case), "X-Original-Method": case.method,
        "X-Real-IP": case.client, "X-Conformance-Case": key,
    }
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(case.sends):
            r = await client.get("/check", headers=headers)
            out.append((r.status_code, tracked(r.headers.items())))
    return out


async def _v1_checks(case: Case, port: int, key: str) -> list[tuple[int, dict[str, str]]]:
    """The case's ``/v1/check`` calls (a JSON description) to ``serve``'s HTTP server on ``port``."""
    body = {"method": case.method, "path": url(case), "headers": dict(case.request_headers), "client": case.client,
            "cost": case.cost}
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(case.sends):
            r = await client.post("/v1/check", json=body, headers={"X-Conformance-Case": key})
            if r.status_code != 200:  # the description itself was refused
                out.append((r.status_code, tracked(r.headers.items())))
                continue
            answer = r.json()
            out.append((answer["status"], tracked(answer["headers"].items())))
    return out


async def door_serve_check(case: Case, serve: Serve, key: str) -> Run:
    app, store = serve_app(case)
    serve.dispatch.apps[key] = app
    return Run(await _checks(case, serve.port, key), store)


async def door_serve_v1_check(case: Case, serve: Serve, key: str) -> Run:
    app, store = serve_app(case)
    serve.dispatch.apps[key] = app
    return Run(await _v1_checks(case, serve.port, key), store)


async def _compiled_http(case: Case, calls: Callable[[Case, int, str], Awaitable[list[tuple[int, dict[str, str]]]]]) -> Run:
    """``calls`` through the compiled HTTP front door (``--http-front compiled``, the default where it
    imports), on this event loop, answering with the case's ``ServeApp``."""
    from ratewarden.serve.front_http import start_http_front
    from tests.front_door import require_compiled_front

    require_compiled_front()
    app, store = serve_app(case)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = start_http_front(app, sock, grace=5.0)
    serving = asyncio.create_task(server.serve())
    try:
        out = await calls(case, sock.getsockname()[1], "compiled")
    finally:
        server.should_exit = True
        await serving
        sock.close()
    return Run(out, store)


async def door_serve_check_compiled(case: Case) -> Run:
    """``/check`` through the compiled front door: ``ServeApp.check`` without the ASGI exchange."""
    return await _compiled_http(case, _checks)


async def door_serve_v1_check_compiled(case: Case) -> Run:
    """``/v1/check`` through the compiled front door (the ASGI app, run by the front door's adapter)."""
    return await _compiled_http(case, _v1_checks)


async def door_spoe(case: Case, compiled: bool = False) -> Run:
    from ratewarden.serve.front_spoe import CompiledSpoe, start_spoe_front
    from ratewarden.serve.spoe import start_spoe
    from tests.serve.test_spoe import Spop

    app, store = serve_app(case)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    address = sock.getsockname()[:2]
    server: asyncio.Server | CompiledSpoe = start_spoe_front(app, sock) if compiled else await start_spoe(app, sock)
    reader, writer = await asyncio.open_connection(*address)
    conn = Spop(reader, writer)
    out = []
    try:
        await conn.hello()
        for i in range(case.sends):
            answer = await conn.check(1, i + 1, uri=url(case), method=case.method, headers=dict(case.request_headers),
                                      ip=ipaddress.ip_address(case.client))
            status = answer.pop("status")
            assert isinstance(status, int)
            out.append((status, tracked((k.replace("_", "-"), str(v)) for k, v in answer.items())))
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()
        if isinstance(server, CompiledSpoe):
            await server.end()
    return Run(out, store)


async def door_spoe_compiled(case: Case) -> Run:
    """The SPOE door through the compiled front door (``--spoe-front compiled``), on this event loop."""
    from tests.front_door import require_compiled_front

    require_compiled_front()
    return await door_spoe(case, compiled=True)


# -- gRPC (Envoy's rate limit service) -------------------------------------------------------------------


async def door_grpc(case: Case, compiled: bool = False) -> Run:
    import grpc  # type: ignore[import-untyped]
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

    from ratewarden.serve.envoy_config import parse_envoy_config
    from ratewarden.serve.grpc import start_grpc
    from ratewarden.serve.rls import RateLimitService

    assert case.envoy is not None
    store = store_for(case)
    domain = parse_envoy_config(case.envoy.config)
    service = RateLimitService({domain.domain: domain}, limiter_for(store, case))
    if compiled:
        from ratewarden.serve.front import start_front

        front = start_front(service, "127.0.0.1", 0)
        server, port = front, front.port
    else:
        server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    descriptors = [
        ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d])
        for d in case.envoy.descriptors
    ]
    request = rls_pb2.RateLimitRequest(domain="case", descriptors=descriptors, hits_addend=case.envoy.hits)
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    out: list[Answer] = []
    try:
        for _ in range(case.sends):
            try:
                answer = await stub.ShouldRateLimit(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                out.append((503, {}))
                continue
            status = 200 if answer.overall_code == rls_pb2.RateLimitResponse.OK else 429
            out.append((status, tracked((h.key, h.value) for h in answer.response_headers_to_add)))
    finally:
        await channel.close()
        await server.stop(None)
    return Run(out, store)


async def door_grpc_compiled(case: Case) -> Run:
    """The gRPC door through the compiled front door (``ratewarden._front``), on this event loop."""
    from tests.front_door import require_compiled_front

    require_compiled_front()
    return await door_grpc(case, compiled=True)


def rename(headers: Mapping[str, str | None], names: Mapping[str, str]) -> dict[str, str | None]:
    """``headers`` with each rule name (quoted, as the headers carry it) replaced by the door's."""
    if not names:
        return dict(headers)
    quoted = re.compile('"(' + "|".join(re.escape(n) for n in names) + ')([-"])')
    return {
        name: value if value is None else quoted.sub(lambda m: f'"{names[m[1]]}{m[2]}', value)
        for name, value in headers.items()
    }


@contextlib.contextmanager
def uvicorn_serving(dispatch: Dispatch) -> Iterator[Serve]:
    from tests.servers import uvicorn_in_thread

    with uvicorn_in_thread(dispatch) as port:
        yield Serve(dispatch, port)

