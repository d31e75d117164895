"""The conformance matrix: every case of ``cases.CASES`` through every door of ``DOORS``, compared
with the row's expectation (status of each send, every rate-limit header of the last answer, what
the store was charged), as amended by the row's explicit per-door ``differences``."""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from ratewarden.stores import SharedMemoryStore
from tests.servers import RedisStandalone
from tests.shm import SHM_DIR, unique_name

from . import doors
from .cases import ANY, CASES, Case, Difference

#: Every door, by name: what runs a case through it.
DOORS: dict[str, Callable[..., Awaitable[doors.Run]]] = {
    "asgi": doors.door_asgi,
    "asgi-policy": doors.door_asgi_policy,
    "wsgi": doors.door_wsgi,
    "wsgi-policy": doors.door_wsgi_policy,
    "flask": doors.door_flask,
    "django": doors.door_django,
    "sanic": doors.door_sanic,
    "litestar": doors.door_litestar,
    "serve-check": doors.door_serve_check,
    "serve-v1-check": doors.door_serve_v1_check,
    "serve-check-compiled": doors.door_serve_check_compiled,
    "serve-v1-check-compiled": doors.door_serve_v1_check_compiled,
    "spoe": doors.door_spoe,
    "spoe-compiled": doors.door_spoe_compiled,
    "grpc": doors.door_grpc,
    "grpc-compiled": doors.door_grpc_compiled,
}
#: Doors that answer as another door does: its differences are theirs.
SAME_AS = {"grpc-compiled": "grpc", "spoe-compiled": "spoe", "serve-check-compiled": "serve-check",
           "serve-v1-check-compiled": "serve-v1-check"}
#: The doors behind ``ratewarden serve``'s HTTP server (one uvicorn for the module).
SERVED = ("serve-check", "serve-v1-check")
#: Names a door gives the rules' limits in its headers, when not the rule's name.
NAMES: dict[str, Callable[[Case], dict[str, str]]] = {
    "flask": lambda case: {spec.name: "items" + (f"-{i}" if i else "") for i, spec in enumerate(
        s for s in case.rules if not s.bypass)},
    "grpc": lambda case: dict(case.envoy.names) if case.envoy is not None else {},
    "grpc-compiled": lambda case: dict(case.envoy.names) if case.envoy is not None else {},
}


def _params() -> Iterator[Any]:
    for case in CASES:
        for door in DOORS:
            diff: Difference | None = case.differences.get(SAME_AS.get(door, door))
            assert door != "grpc" or case.envoy is not None or (diff is not None and diff.skip), (
                f"{case.id}: give its Envoy form, or say why gRPC cannot express it"
            )
            marks: list[Any] = []
            if diff is not None and diff.skip:
                marks.append(pytest.mark.skip(reason=f"{door} differs: {diff.why}"))
            elif diff is not None and diff.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=diff.xfail))
            for kind in doors.STORE_KINDS:
                kind_marks = [*marks, pytest.mark.redis] if kind == "redis" else marks
                yield pytest.param(case, door, kind, id=f"{case.id}-{door}-{kind}", marks=kind_marks)


@pytest.fixture(scope="module")
def serve() -> Iterator[doors.Serve]:
    with doors.uvicorn_serving(doors.Dispatch()) as serving:
        yield serving


@pytest.fixture(scope="module")
def paused_redis() -> Iterator[RedisStandalone]:
    """A redis-server of the module's own, that a timeout row stops (SIGSTOP) during its sends."""
    server = RedisStandalone().start()
    try:
        yield server
    finally:
        server.server.resume()
        server.close()


@pytest.fixture(scope="module")
def refused_url() -> str:
    """A Redis URL whose port nothing listens on: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture(scope="module")
def locked_shm() -> Iterator[SharedMemoryStore]:
    """A shared-memory table whose every region lock another process holds: every check waits
    its lock deadline and fails with ``reason="timeout"``."""
    store = SharedMemoryStore(unique_name(), max_keys=doors.SHM_KEYS, directory=SHM_DIR, log_size=0,
                              clock=doors.frozen, lock_timeout=doors.FAULT_TIMEOUT)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    holder = context.Process(target=doors.hold_every_lock, args=(store.name, str(SHM_DIR), theirs), daemon=True)
    holder.start()
    try:
        assert ours.poll(60), "the lock holder did not start"
        yield store
    finally:
        holder.kill()
        holder.join(30)
        ours.close()
        theirs.close()
        await_close(store)
        store.unlink()


def await_close(store: SharedMemoryStore) -> None:
    with contextlib.suppress(StopIteration):
        store.close().send(None)  # a coroutine that never suspends


@pytest.fixture
def backend(request: pytest.FixtureRequest, case: Case, kind: str) -> Iterator[doors.Backend]:
    """The store kind of this test, its servers, and a limiter prefix of its own."""
    backend = doors.Backend(kind, prefix=f"rw{uuid.uuid4().hex[:10]}")
    if kind == "redis":
        backend.redis_url = request.getfixturevalue("redis_standalone").url
        if case.fault == "timeout":
            backend.paused = request.getfixturevalue("paused_redis")
            backend.paused.server.pause()
        backend.refused_url = request.getfixturevalue("refused_url")
    if kind == "shm" and case.fault == "timeout":
        backend.locked = request.getfixturevalue("locked_shm")
    doors.BACKEND = backend
    yield backend
    doors.BACKEND = doors.Backend()


@pytest.mark.parametrize(("case", "door", "kind"), list(_params()))
async def test_conformance(case: Case, door: str, kind: str, backend: doors.Backend, request: pytest.FixtureRequest) -> None:
    serve: doors.Serve | None = request.getfixturevalue("serve") if door in SERVED else None
    try:
        if serve is not None:
            run = await DOORS[door](case, serve, f"{case.id}-{door}-{kind}")
        else:
            run = await DOORS[door](case)
        backend.heal()
        check(case, door, run, backend)
    finally:
        await backend.close(serve.dispatch.loop if serve is not None else None)


def check(case: Case, door: str, run: doors.Run, backend: doors.Backend) -> None:
    statuses, headers, charged = case.expected(SAME_AS.get(door, door))
    names = NAMES.get(door)
    if names is not None:
        headers = doors.rename(headers, names(case))
    got_statuses = tuple(status for status, _ in run.answers)
    last = run.answers[-1][1]
    got_headers = {name: last.get(name) for name in headers}
    for name, value in headers.items():
        if value == ANY and got_headers[name] is not None:
            got_headers[name] = value
    assert (got_statuses, got_headers) == (statuses, headers)
    if backend.readable(case):
        assert doors.charged(run.store, case) == dict(charged)
    if case.fault and backend.limiters:  # the store failed as the row says (Django builds its own limiter)
        assert set(backend.failures()) == {backend.reason(case)}, backend.failures()
