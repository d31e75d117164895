"""What one caller can make a ``ratewarden serve`` worker do or hold (issue 28, findings 9, 10, 11, 13),
tried as an attacker would, with independent clients: the generated Envoy API's gRPC client, raw
sockets for SPOE and HTTP, httpx against the real ``ratewarden serve`` process.

- gRPC: a request of too many descriptors or entries is INVALID_ARGUMENT at once, one larger than
  the message size RESOURCE_EXHAUSTED, and nothing is charged;
- SPOE: a connection that does not finish its HELLO or a frame, or idles, is disconnected (status 2);
  connections over the cap get status 13; a NOTIFY is one decision of its ``check`` message and its
  ACK fits the frame size agreed;
- HTTP: a request not sent whole in time is answered 408 and closed, headers over the bound 431,
  connections over the cap 503 at once; deeply nested or ill-typed JSON is a 400.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

from ratewarden import Limiter, MemoryStore
from ratewarden.bench.services import free_port
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.grpc import rls_json, start_grpc
from ratewarden.serve.rls import RateLimitService
from ratewarden.serve.spoe import SpoeAgent

from .test_serve_cli import POLICY as CLI_POLICY
from .test_serve_cli import Serve
from .test_spoe import (
    ACK,
    AGENT_DISCONNECT,
    NOTIFY,
    Received,
    Spop,
    _app,
    frame,
    hdrs_bin,
    hello,
    spoe_front,  # noqa: F401 (the fixture running the SPOE tests on both front doors)
    start_agent,
    stop_agent,
    string,
    typed,
)

SLACK = 10.0  # seconds a bound may take beyond its timeout on a busy machine

# -- gRPC: descriptors, entries and message size (finding 9) --------------------------------------------

ENVOY = """
domain: bounds
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
"""


def _request(descriptors: int, entries: int = 1, value: str = "v") -> Any:
    entry = [ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value=value) for _ in range(entries)]
    return rls_pb2.RateLimitRequest(
        domain="bounds", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entry) for _ in range(descriptors)])


@asynccontextmanager
async def _grpc(**bounds: int) -> AsyncIterator[tuple[Any, RateLimitService]]:
    message_size = {"max_message_size": bounds.pop("max_message_size")} if "max_message_size" in bounds else {}
    service = RateLimitService({"bounds": parse_envoy_config(ENVOY)}, Limiter(MemoryStore()), **bounds)
    server, port = await start_grpc(service, "127.0.0.1", 0, **message_size)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 8 << 20)])
    try:
        yield rls_pb2_grpc.RateLimitServiceStub(channel), service
    finally:
        await channel.close()
        await server.stop(None)


async def _code(stub: Any, request: Any) -> tuple[Any, str]:
    try:
        await stub.ShouldRateLimit(request, timeout=30)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), str(exc.details())
    return grpc.StatusCode.OK, ""


async def test_grpc_too_many_descriptors_or_entries_is_invalid_argument_and_charges_nothing() -> None:
    async with _grpc() as (stub, service):
        code, details = await _code(stub, _request(20_000))  # 200 KB, under the message size
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 256 descriptors, got 20000" in details
        code, details = await _code(stub, _request(1, entries=5_000))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 1024 entries in all, got 5000" in details
        code, details = await _code(stub, _request(8, entries=200))  # 1600 entries over 8 descriptors
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "1600" in details
        answer = await stub.ShouldRateLimit(_request(1), timeout=30)  # nothing was charged
        assert answer.overall_code == rls_pb2.RateLimitResponse.OK and answer.statuses[0].limit_remaining == 9
        status, body = await rls_json(service, b'{"domain": "bounds", "descriptors": ['
                                      + b", ".join([b'{"entries": [{"key": "k", "value": "v"}]}'] * 300) + b"]}")
        assert status == 400 and b"at most 256 descriptors" in body
    async with _grpc(max_descriptors=2, max_entries=3) as (stub, _):
        assert (await _code(stub, _request(3)))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert (await _code(stub, _request(2, entries=2)))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert (await _code(stub, _request(2, entries=1)))[0] == grpc.StatusCode.OK


async def test_grpc_a_message_over_the_size_is_refused_unread() -> None:
    async with _grpc() as (stub, _):
        code, details = await _code(stub, _request(1, value="x" * 2_000_000))  # 2 MB, under gRPC's 4 MB default
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert (await _code(stub, _request(1, value="x" * 500_000)))[0] == grpc.StatusCode.OK
    async with _grpc(max_message_size=100_000) as (stub, _):
        assert (await _code(stub, _request(1, value="x" * 200_000)))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- SPOE: time limits and connections (finding 10) ------------------------------------------------------


@asynccontextmanager
async def _agent(**bounds: Any) -> AsyncIterator[int]:
    """A bounded agent on a loopback socket: its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    sock.setblocking(False)
    app = _app()
    agent = SpoeAgent(app, **bounds)
    port = sock.getsockname()[1]
    server = await start_agent(app, sock, agent)
    try:
        yield port
    finally:
        await stop_agent(server, agent)


async def _connect(port: int) -> Spop:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return Spop(reader, writer)


async def _read(conn: Spop, timeout: float) -> Received | None:
    """The next frame, ``None`` when the agent closed the connection."""
    try:
        length = int.from_bytes(await asyncio.wait_for(conn.reader.readexactly(4), timeout), "big")
        data = await asyncio.wait_for(conn.reader.readexactly(length), timeout)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    kind, flags = struct.unpack_from(">BI", data)
    return Received(kind, flags, data[5], data[6], data[7:])  # ids below 240: one byte each


async def _ended(conn: Spop, timeout: float) -> int | None:
    """The status of the AGENT-DISCONNECT that ends the connection (``None``: closed without one)."""
    status = None
    while (answer := await _read(conn, timeout)) is not None:
        assert answer.kind == AGENT_DISCONNECT, answer
        found = answer.pairs()["status-code"]
        assert isinstance(found, int)
        status = found
    return status


@pytest.mark.usefixtures("spoe_front")
async def test_spoe_unfinished_hello_frame_or_idle_connections_are_ended_in_time() -> None:
    async with _agent(timeout_hello=0.3, timeout_frame=0.3, timeout_idle=0.6) as port:
        started = time.monotonic()
        silent = [await _connect(port) for _ in range(50)]
        half_hello = [await _connect(port) for _ in range(50)]
        for conn in half_hello:
            await conn.send(hello()[:20])
        half_frame = await _connect(port)
        await half_frame.hello()
        await half_frame.send(frame(NOTIFY, string("check") + b"\x00", 1, 1)[:9])
        idle = await _connect(port)
        await idle.hello()
        every = (*silent, *half_hello, half_frame, idle)
        statuses = await asyncio.gather(*(_ended(c, SLACK) for c in every))
        assert set(statuses) == {2}  # AGENT-DISCONNECT "a timeout occurred", then closed
        assert time.monotonic() - started < 0.6 + SLACK
        for conn in every:
            await conn.close()
        working = await _connect(port)  # served as before
        await working.hello()
        assert (await working.check(headers={"X-API-Key": "pk-alice"}))["status"] == 200
        await working.close()


@pytest.mark.usefixtures("spoe_front")
async def test_spoe_connections_over_the_cap_are_disconnected() -> None:
    async with _agent(max_connections=3) as port:
        held = [await _connect(port) for _ in range(3)]
        for conn in held:
            await conn.hello()
        extra = await _connect(port)
        assert await _ended(extra, SLACK) == 13  # "resource allocation error"
        await extra.close()
        await held[0].close()
        await asyncio.sleep(0.2)
        again = await _connect(port)
        await again.hello()
        assert (await again.check(headers={"X-API-Key": "pk-alice"}))["status"] == 200
        for conn in (*held[1:], again):
            await conn.close()


# -- SPOE: one decision per frame, an ACK within the frame size (finding 11) ----------------------------


def _message(name: str, uri: str = "/api/items", key: str = "trial-1") -> bytes:
    args = {"method": "GET", "uri": uri, "headers": hdrs_bin({"X-API-Key": key})}
    return string(name) + bytes((len(args),)) + b"".join(string(n) + typed(v) for n, v in args.items())


@pytest.mark.usefixtures("spoe_front")
async def test_spoe_a_notify_of_many_messages_is_one_decision_of_check() -> None:
    async with _agent() as port:
        conn = await _connect(port)
        await conn.hello()
        many = _message("other") + _message("check") + _message("check") * 120 + _message("ignored") * 30
        packed = frame(NOTIFY, many, 1, 1)
        assert len(packed) - 4 <= 16380
        await conn.send(packed)
        answer = await _read(conn, SLACK)
        assert answer is not None and answer.kind == ACK
        variables = answer.variables()  # each variable once
        assert variables["status"] == 200 and variables["x_ratelimit_remaining"] == "4"  # basic: 5/min, one charged
        assert (await conn.check(2, 1, headers={"X-API-Key": "trial-1"}))["x_ratelimit_remaining"] == "3"
        await conn.send(frame(NOTIFY, _message("not-check") * 20, 3, 1))
        answer = await _read(conn, SLACK)
        assert answer is not None
        assert answer.variables()["status"] == 400 and "'check'" in str(answer.variables()["body"])
        await conn.close()
    async with _agent(message="ratelimit") as port:
        conn = await _connect(port)
        await conn.hello()
        await conn.send(frame(NOTIFY, _message("check") + _message("ratelimit"), 1, 1))
        answer = await _read(conn, SLACK)
        assert answer is not None and answer.variables()["status"] == 200
        await conn.close()


@pytest.mark.usefixtures("spoe_front")
async def test_spoe_an_ack_never_exceeds_the_agreed_frame_size() -> None:
    async with _agent() as port:
        conn = await _connect(port)
        assert (await conn.hello(max_frame_size=256))["max-frame-size"] == 256
        sizes = []
        statuses = []
        for frame_id in range(1, 8):  # the anonymous group: 3/min, then refusals with their problem+json body
            await conn.send(frame(NOTIFY, _anonymous(), 1, frame_id))
            answer = await _read(conn, SLACK)
            assert answer is not None and answer.kind == ACK
            sizes.append(7 + len(answer.payload))
            statuses.append(answer.variables()["status"])
        assert statuses == [200, 200, 200, 429, 429, 429, 429]
        assert max(sizes) <= 256
        too_small = await _connect(port)
        await too_small.send(hello(max_frame_size=100))
        assert await _ended(too_small, SLACK) == 9
        await too_small.close()
        await conn.close()


def _anonymous() -> bytes:
    args = {"method": "GET", "uri": "/api/items/" + "p" * 60, "headers": hdrs_bin({})}
    return string("check") + bytes((len(args),)) + b"".join(string(n) + typed(v) for n, v in args.items())


# -- HTTP: time, header size and connections (finding 10), JSON (finding 13) -----------------------------


def _serve(tmp_path: Path, *options: str) -> Iterator[Serve]:
    policy = tmp_path / "policy.toml"
    policy.write_text(CLI_POLICY.replace("{basic}", "5/hour"))
    server = Serve(tmp_path, str(policy), *options)
    try:
        yield server.ready()
    finally:
        server.stop()


@pytest.fixture
def bounded_serve(tmp_path: Path) -> Iterator[Serve]:
    yield from _serve(tmp_path, "--http-timeout", "0.5", "--http-max-header-size", "8192", "--http-max-connections", "20")


@pytest.fixture(scope="module")
def default_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from _serve(tmp_path_factory.mktemp("serve"))


def _raw(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=SLACK)
    if data:
        sock.sendall(data)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (within SLACK seconds)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:  # closed with the request unread: the answer may be lost
        pass
    sock.close()
    return out


def test_http_unfinished_requests_are_408_and_closed(bounded_serve: Serve) -> None:
    port = bounded_serve.port
    started = time.monotonic()
    silent = _raw(port, b"")
    half_head = _raw(port, b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /api/")
    half_body = _raw(port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"path\"")
    answers = [_answer(s) for s in (silent, half_head, half_body)]
    assert time.monotonic() - started < 0.5 + SLACK
    assert answers[0].startswith(b"HTTP/1.1 408 ") and answers[1].startswith(b"HTTP/1.1 408 ")
    assert b"not received whole within 0.5 seconds" in answers[1]
    assert answers[2] == b"" or answers[2].startswith(b"HTTP/1.1 4")  # the app was reading the body: closed
    # a request sent in time, on a kept-alive connection, then the next one slowly: the second is timed too
    keep = _raw(port, b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /api/items\r\n\r\n")
    first = keep.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    keep.sendall(b"GET /check HTTP/1.1\r\nHost: x\r\n")
    assert _answer(keep).startswith(b"HTTP/1.1 408 ")


def test_http_oversized_headers_are_431(bounded_serve: Serve) -> None:
    sock = _raw(bounded_serve.port, b"GET /check HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000)  # unfinished
    assert _answer(sock).startswith(b"HTTP/1.1 431 ")
    many = b"".join(b"h%d: vvvvv\r\n" % i for i in range(800))  # about 9 KB of small headers, sent whole
    sock = _raw(bounded_serve.port, b"GET /check HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert _answer(sock).startswith(b"HTTP/1.1 431 ")
    sock = _raw(bounded_serve.port, b"GET /check HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 7_000 + b"\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    sock.close()


def test_http_headers_over_the_default_bound_are_431(default_serve: Serve) -> None:
    head = b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /api/items\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    answer = _answer(_raw(default_serve.port, head))
    assert answer.startswith(b"HTTP/1.1 431 ") and b"larger than 65536 bytes" in answer


def test_http_connections_over_the_cap_are_503_at_once_and_checks_go_on(bounded_serve: Serve) -> None:
    held = [_raw(bounded_serve.port, b"GET /check HTTP/1.1\r\n") for _ in range(30)]
    answers = [_answer(sock) for sock in held]
    refused = [a for a in answers if not a.startswith(b"HTTP/1.1 408 ")]
    assert len(refused) >= 10  # over the cap: refused at once (503, or reset with the request unread)
    assert all(a == b"" or a.startswith(b"HTTP/1.1 503 ") for a in refused)
    answer = httpx.get(f"{bounded_serve.url}/check", headers={"X-Original-URI": "/api/items"}, timeout=SLACK)
    assert answer.status_code == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 30_000 + b"]" * 30_000, "nested too deeply"),
        (b'{"path": "/api/items", "headers": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "nested too deeply"),
        (b'{"path": "/api/items", "headers": null}', "'headers' must be an object, got null"),
        (b'{"path": "/api/items", "method": null}', "'method' must be a string, got null"),
    ],
)
def test_http_json_that_cannot_be_used_is_400(default_serve: Serve, body: bytes, says: str) -> None:
    answer = httpx.post(f"{default_serve.url}/v1/check", content=body, timeout=SLACK)
    assert answer.status_code == 400 and says in answer.json()["error"]
    assert "Traceback" not in default_serve.log.read_text()


def test_bounds_options_must_be_positive(tmp_path: Path) -> None:
    import subprocess
    import sys

    policy = tmp_path / "policy.toml"
    policy.write_text(CLI_POLICY.replace("{basic}", "5/hour"))
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "serve", str(policy), "--http", f"127.0.0.1:{free_port()}",
                          "--spoe-timeout-idle", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--spoe-timeout-idle must be more than 0" in out.stderr


def test_http_a_flood_under_a_256_file_limit_is_refused_not_a_hang(tmp_path: Path) -> None:
    """The issue's case: ``ulimit -n 256``, 300 unfinished requests. The caps are lowered to fit
    (``bounds_lowered``), checks meanwhile get an answer at once, and one succeeds once the flood is cut off."""
    import resource
    import signal
    import subprocess
    import sys

    def small_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    policy = tmp_path / "policy.toml"
    policy.write_text(CLI_POLICY.replace("{basic}", "5/hour"))
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ratewarden.cli", "serve", str(policy), "--http", f"127.0.0.1:{port}", "--http-timeout", "1"],
            stdout=subprocess.DEVNULL, stderr=err, preexec_fn=small_limit)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 20
        while b"worker_started" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert b'"event": "bounds_lowered"' in log.read_bytes()
        for _ in range(300):
            held.append(_raw(port, b"GET /check HTTP/1.1\r\nHost: x\r\n"))
        url = f"http://127.0.0.1:{port}/check"
        during = httpx.get(url, headers={"X-Original-URI": "/api/items"}, timeout=SLACK)
        assert during.status_code in (200, 503)
        for sock in held:
            _answer(sock)  # each one closed by the service: a 408 within --http-timeout, or a 503 at once
        assert httpx.get(url, headers={"X-Original-URI": "/api/items"}, timeout=SLACK).status_code == 200
    finally:
        for sock in held:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
