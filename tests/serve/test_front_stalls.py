"""The compiled front door never loses a wake-up: more than one batch of expired or orphaned entries at
the head of a queue (a blocked event loop, closed SPOE connections) is skipped, and what waits behind
it is answered in time; ``/healthz`` names a door whose queue waits past its deadline."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest

from ratewarden.limiter import Limiter
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.front import start_front
from ratewarden.serve.front_http import start_http_front
from ratewarden.serve.front_spoe import start_spoe_front
from ratewarden.serve.rls import RateLimitService
from ratewarden.stores import MemoryStore
from tests.front_door import loopback_listener, require_compiled_front

from .test_spoe import ACK, AGENT_HELLO, _app, hello, notify

grpc = pytest.importorskip("grpc")
rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")
ratelimit_pb2 = pytest.importorskip("envoy.extensions.common.ratelimit.v3.ratelimit_pb2")

ENVOY = """
domain: front
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_front()


def _request(user: str) -> Any:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    return rls_pb2.RateLimitRequest(domain="front", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])


def _flood(address: str, n: int, timeout: float) -> list[Any]:
    """``n`` calls at once with the deadline ``timeout``: their status codes (OK when answered)."""
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        calls: list[Future[Any]] = [stub.ShouldRateLimit.future(_request(f"u{i}"), timeout=timeout) for i in range(n)]
        codes = []
        for call in calls:
            try:
                call.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        return codes


async def test_more_than_a_batch_of_expired_grpc_calls_never_stalls_the_door() -> None:
    """1,100 calls (more than the 1,024 taken at once) expire in the queue while the loop is blocked;
    every later call is still answered, three rounds over."""
    domain = parse_envoy_config(ENVOY)
    front = start_front(RateLimitService({domain.domain: domain}, Limiter(MemoryStore())), "127.0.0.1", 0)
    address = f"127.0.0.1:{front.port}"
    loop = asyncio.get_running_loop()
    try:
        late = loop.run_in_executor(None, _flood, address, 1100, 0.3)
        time.sleep(1.5)  # the loop is blocked: every call of the flood passes its deadline in the queue
        codes = await late
        assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}, Counter(codes)
        for _ in range(3):
            answered = await asyncio.wait_for(loop.run_in_executor(None, _flood, address, 50, 2.0), 10)
            assert answered == [grpc.StatusCode.OK] * 50
        assert front.front.pending() == 0
        assert front.stalled() is None
    finally:
        await front.stop(1.0)


async def test_healthz_names_a_grpc_door_whose_queue_waits_past_its_deadline() -> None:
    domain = parse_envoy_config(ENVOY)
    front = start_front(RateLimitService({domain.domain: domain}, Limiter(MemoryStore())), "127.0.0.1", 0, timeout=0.5)
    address = f"127.0.0.1:{front.port}"
    loop = asyncio.get_running_loop()

    def while_blocked() -> tuple[str | None, list[Any]]:
        sent = Future[list[Any]]()
        sent.set_result(_flood(address, 1, 5.0))
        time.sleep(0.3)
        return front.stalled(), sent.result()

    try:
        seen = loop.run_in_executor(None, while_blocked)
        time.sleep(1.5)  # the loop is blocked past the door's 0.5 s deadline
        problem, codes = await seen
        assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED]
        assert problem is not None and "gRPC front door" in problem and "0.5 s deadline" in problem
        await asyncio.sleep(0.05)
        assert front.stalled() is None  # the loop took the queue: healthy again
    finally:
        await front.stop(1.0)



def _http_statuses(port: int, n: int) -> list[int]:
    """``n`` requests at once, one connection each: their status codes."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
    statuses = []
    for sock in socks:
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        statuses.append(int(head.split(b" ", 2)[1]) if head else 0)
        sock.close()
    return statuses


async def test_more_than_a_batch_of_expired_http_requests_never_stalls_the_door() -> None:
    """1,100 HTTP requests (more than the 1,024 taken at once) expire in the queue while the loop is
    blocked; every later request is still answered, three rounds over."""
    listener = loopback_listener()
    port = listener.getsockname()[1]
    server = start_http_front(_app(), listener, timeout=0.5, max_connections=2000, grace=0.5)
    loop = asyncio.get_running_loop()
    serving = asyncio.ensure_future(server.serve())
    try:
        late = loop.run_in_executor(None, _http_statuses, port, 1100)
        time.sleep(1.5)  # the loop is blocked: every request passes its 0.5 s deadline in the queue
        assert set(await late) == {503}
        for _ in range(3):
            statuses = await asyncio.wait_for(loop.run_in_executor(None, _http_statuses, port, 50), 10)
            assert statuses == [200] * 50
        assert server.stalled() is None
    finally:
        server.should_exit = True
        await serving
        listener.close()


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        assert chunk, "the agent closed the connection"
        head += chunk
    length = struct.unpack(">I", head)[0]
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        assert chunk, "the agent closed the connection"
        body += chunk
    return body[0], body


def _spoe_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(hello())
    assert _read_frame(sock)[0] == AGENT_HELLO
    return sock


async def test_more_than_a_batch_of_orphaned_spoe_messages_never_stalls_the_agent() -> None:
    """1,280 NOTIFYs of connections that closed before the blocked loop took them (more than the
    1,024 taken at once) are skipped; an honest NOTIFY behind them is answered at once."""
    app = _app()
    listener = loopback_listener()
    port = listener.getsockname()[1]
    server = start_spoe_front(app, listener)
    loop = asyncio.get_running_loop()

    def orphans_then_honest() -> tuple[socket.socket, float]:
        for _ in range(5):
            sock = _spoe_connection(port)
            sock.sendall(b"".join(notify(1, i) for i in range(1, 257)))
            time.sleep(0.05)  # read by the agent's thread, queued for the blocked loop
            sock.close()
        time.sleep(0.3)
        honest = _spoe_connection(port)
        honest.sendall(notify(7, 1))
        return honest, time.monotonic()

    try:
        started = loop.run_in_executor(None, orphans_then_honest)
        time.sleep(1.0)  # the loop is blocked while the orphans and the honest NOTIFY queue
        honest, sent = await started
        kind, _ = await loop.run_in_executor(None, _read_frame, honest)
        waited = time.monotonic() - sent
        assert kind == ACK
        assert waited < 1.0
        honest.sendall(notify(7, 2))
        assert (await loop.run_in_executor(None, _read_frame, honest))[0] == ACK
        honest.close()
        assert server.stalled() is None
    finally:
        server.close()
        await server.end()
