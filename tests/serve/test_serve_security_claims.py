"""Claims of docs/security.md about ``ratewarden serve`` that no other test checked (issue 36), each
tried on the real door: the compiled front door's queues (gRPC ``RESOURCE_EXHAUSTED``, HTTP 503 over
``max_pending`` or ``max_pending_bytes``), its HTTP body bound (413) and a ``/check`` body never read,
an SPOE message dropped undecided past ``SPOE_TIMEOUT_PROCESSING``, the open-files limit raised to fit
the connection caps, chunk framing llhttp refuses refused alike by both HTTP doors, the documented
difference of a head over the bound in raw bytes only, and start-up refusals (a port above 65535, a
misspelled store scheme or algorithm)."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.services import free_port
from ratewarden.limiter import Limiter
from ratewarden.serve import bounds
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.front import start_front
from ratewarden.serve.front_http import start_http_front
from ratewarden.serve.front_spoe import start_spoe_front
from ratewarden.serve.http_io import MAX_BODY
from ratewarden.serve.rls import RateLimitService
from ratewarden.stores import MemoryStore
from tests.front_door import loopback_listener, require_compiled_front
from tests.servers import wait_until

from .test_front_http_parity import _CHECK, _POST, INVALID, _both, _exchange, doors  # noqa: F401 (doors: a fixture)
from .test_serve_cli import POLICY
from .test_spoe import ACK, AGENT_HELLO, Received, _app, hello, notify, unvarint

grpc = pytest.importorskip("grpc")
rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")
ratelimit_pb2 = pytest.importorskip("envoy.extensions.common.ratelimit.v3.ratelimit_pb2")

ENVOY = """
domain: claims
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""
BLOCKED = 1.5  # seconds the event loop is blocked while requests queue in the front door
REQUESTS = 80  # HTTP requests at once, a connection each
MiB = 1024 * 1024


def _request(user: str) -> Any:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    return rls_pb2.RateLimitRequest(domain="claims", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])


def _grpc_flood(address: str, users: list[str]) -> list[Any]:
    """One call per user, all at once, each with a 10 s deadline: their status codes (OK when answered)."""
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        calls: list[Future[Any]] = [stub.ShouldRateLimit.future(_request(user), timeout=10) for user in users]
        codes = []
        for call in calls:
            try:
                call.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        return codes


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_front()


# -- the compiled gRPC door's queue -------------------------------------------------------------------------


@pytest.mark.parametrize("bound", ["max_pending", "max_pending_bytes"])
async def test_grpc_calls_over_the_queue_are_resource_exhausted_at_once(bound: str) -> None:
    """docs/security.md: "over the queue's size RESOURCE_EXHAUSTED" (``GRPC_MAX_PENDING`` calls,
    ``GRPC_MAX_PENDING_BYTES`` of them). The event loop is blocked, so calls wait in the front door's
    queue: past its bound (lowered here) they are refused at once, the rest answered once it runs."""
    domain = parse_envoy_config(ENVOY)
    service = RateLimitService({domain.domain: domain}, Limiter(MemoryStore()))
    options = {"max_pending": 5} if bound == "max_pending" else {"max_pending_bytes": 2 * MiB}  # its least
    front = start_front(service, "127.0.0.1", 0, **options)  # type: ignore[arg-type]
    users = [f"u{i}-" + "x" * 200_000 for i in range(40)]  # 200 KB a call: about 10 of them fill 2 MiB
    loop = asyncio.get_running_loop()
    try:
        flood = loop.run_in_executor(None, _grpc_flood, f"127.0.0.1:{front.port}", users)
        time.sleep(BLOCKED)  # the loop is blocked: the calls queue in Rust
        codes = Counter(await flood)
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 20, codes
        assert 1 <= codes[grpc.StatusCode.OK] <= (5 if bound == "max_pending" else 11), codes
        assert front.adapter.requests == codes[grpc.StatusCode.OK]  # the refused were never decided
    finally:
        await front.stop(1.0)


# -- the compiled HTTP door ----------------------------------------------------------------------------------



def _answer(port: int, data: bytes) -> bytes:
    """``data`` sent on its own connection: everything answered until the door closes it (or 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def _check_request(key: str, extra: bytes = b"") -> bytes:
    return (b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /api/items\r\nX-API-Key: " + key.encode()
            + b"\r\nConnection: close\r\n" + extra + b"\r\n")


@pytest.mark.parametrize("bound", ["max_pending", "max_pending_bytes"])
async def test_http_requests_over_the_queue_are_503_at_once(bound: str) -> None:
    """docs/security.md: "at most 10,000 queued per worker, more get 503" (``GRPC_MAX_PENDING``
    requests, ``GRPC_MAX_PENDING_BYTES`` of them, lowered here), tried with the loop blocked."""
    listener = loopback_listener()
    port = listener.getsockname()[1]
    options = {"max_pending": 5} if bound == "max_pending" else {"max_pending_bytes": 2 * MiB}  # its least
    server = start_http_front(_app(), listener, **options)
    serving = asyncio.ensure_future(server.serve())
    loop = asyncio.get_running_loop()

    def flood() -> list[bytes]:
        with socket.socket() as probe:  # the front door accepts before the flood
            probe.settimeout(10)
            probe.connect(("127.0.0.1", port))
        pad = b"X-Pad: " + b"p" * 60_000 + b"\r\n"  # 60 KB a request: about 35 of them fill 2 MiB
        requests = [_check_request(f"k{i}", pad) for i in range(REQUESTS)]
        with ThreadPoolExecutor(REQUESTS) as pool:
            return [f.result() for f in [pool.submit(_answer, port, r) for r in requests]]

    try:
        answers = loop.run_in_executor(None, flood)
        time.sleep(BLOCKED)  # the loop is blocked: the requests queue in Rust
        statuses = Counter(int(a.split(b" ", 2)[1]) for a in await answers if a)
        assert set(statuses) <= {200, 503}, statuses
        assert sum(statuses.values()) == REQUESTS, statuses
        assert statuses[503] >= 40, statuses
        assert 1 <= statuses[200] <= (5 if bound == "max_pending" else 35), statuses
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_http_a_body_over_64_kib_is_413_and_a_check_body_is_never_read() -> None:
    """docs/security.md: "a body is read only off ``/check``, over 64 KiB 413", on the compiled door."""
    listener = loopback_listener()
    port = listener.getsockname()[1]
    server = start_http_front(_app(), listener)
    serving = asyncio.ensure_future(server.serve())
    loop = asyncio.get_running_loop()
    big = b'{"path": "/api/items", "pad": "' + b"x" * 70_000 + b'"}'
    under = b'{"path": "/api/items", "pad": "' + b"x" * 60_000 + b'"}'

    def exchanges() -> tuple[bytes, bytes, bytes]:
        over = _answer(port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(big), big))
        fits = _answer(port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(under), under))
        # /check with a 1 MB body announced and never sent: answered at once, the body not waited for
        check = _answer(port, _check_request("body", b"Content-Length: 1000000\r\n"))
        return over, fits, check

    try:
        over, fits, check = await loop.run_in_executor(None, exchanges)
        assert over.startswith(b"HTTP/1.1 413 ") and b"the body is larger than 65536 bytes" in over, over[:200]
        assert fits.startswith(b"HTTP/1.1 200 "), fits[:200]
        assert check.startswith(b"HTTP/1.1 200 "), check[:200]
        assert MAX_BODY == 64 * 1024
    finally:
        server.should_exit = True
        await serving
        listener.close()


# -- both HTTP doors: chunk framing, and a head over the bound in raw bytes only -----------------------------

#: Chunk framing llhttp refuses (docs/security.md: "a bare LF", "a malformed extension or trailer"),
#: beside tests/serve/test_front_http_parity.py's white space cases.
CHUNKS = {
    "a bare LF after a chunk size": _POST + b"Transfer-Encoding: chunked\r\n\r\n16\n" + _CHECK + b"\r\n0\r\n\r\n",
    "a bare LF after a chunk's data": _POST + b"Transfer-Encoding: chunked\r\n\r\n16\r\n" + _CHECK + b"\n0\r\n\r\n",
    "a bare LF in a trailer": _POST + b"Transfer-Encoding: chunked\r\n\r\n16\r\n" + _CHECK + b"\r\n0\r\nX: y\n\r\n",
    "an extension with no name": _POST + b"Transfer-Encoding: chunked\r\n\r\n16;\r\n" + _CHECK + b"\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("case", list(CHUNKS))
def test_chunk_framing_llhttp_refuses_is_uvicorns_400_on_both_doors(doors: dict[str, Any], case: str) -> None:  # noqa: F811
    python, compiled = _both(doors, CHUNKS[case])
    assert python == (INVALID, True)
    assert compiled == (INVALID, True)
    fine = _POST + b"Transfer-Encoding: chunked\r\n\r\n16;a=b\r\n" + _CHECK + b"\r\n0\r\n\r\n"  # a valid extension
    assert _exchange(doors["compiled"].port, fine)[0].startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_head_over_the_bound_in_raw_bytes_only_sent_in_pieces(doors: dict[str, Any]) -> None:  # noqa: F811
    """The documented difference: a head the compiled door counts within 64 KiB (a header's value
    without its padding) but over it in raw bytes, sent in two pieces: served by the compiled door,
    431 from uvicorn (the bytes of the reads before the head's last pass the bound)."""
    first = (b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /api/items\r\nX-API-Key: pieces\r\nX-Pad:"
             + b" " * (bounds.HTTP_MAX_HEADER_SIZE + 500))

    def pieces(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(first)
            time.sleep(0.3)  # a read of its own
            sock.sendall(b"v\r\nConnection: close\r\n\r\n")
            out = b""
            try:
                while chunk := sock.recv(65536):
                    out += chunk
            except (TimeoutError, ConnectionResetError):
                pass
        return out

    assert pieces(doors["compiled"].port).startswith(b"HTTP/1.1 200 OK\r\n")
    assert pieces(doors["python"].port).startswith(b"HTTP/1.1 431 ")


# -- SPOE: a message waiting past SPOE_TIMEOUT_PROCESSING -----------------------------------------------------


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the agent closed the connection"
            data += chunk
        return data

    return exactly(int.from_bytes(exactly(4), "big"))


async def test_spoe_a_message_waiting_past_the_processing_timeout_is_dropped_undecided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/security.md: "a message waiting more than 1 s for its decision is dropped undecided"
    (``SPOE_TIMEOUT_PROCESSING``, lowered to 0.3 s here): with the loop blocked past it, the message is
    never decided (nothing charged, no ACK), and the next one is answered."""
    assert bounds.SPOE_TIMEOUT_PROCESSING == 1.0
    monkeypatch.setattr(bounds, "SPOE_TIMEOUT_PROCESSING", 0.3)
    listener = loopback_listener()
    port = listener.getsockname()[1]
    server = start_spoe_front(_app(), listener)
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def queue_one() -> None:
        sock.sendall(hello())
        assert _read_frame(sock)[0] == AGENT_HELLO
        sock.sendall(notify(1, 1, headers={"X-API-Key": "trial-late"}))

    try:
        queued = loop.run_in_executor(None, queue_one)
        time.sleep(BLOCKED)  # the loop is blocked past the message's 0.3 s
        await queued
        await asyncio.sleep(0.2)  # the loop takes the queue: the late message is dropped
        sock.sendall(notify(2, 1, headers={"X-API-Key": "trial-late"}))
        answer = await loop.run_in_executor(None, _read_frame, sock)
        stream, at = unvarint(answer, 5)
        frame_id, at = unvarint(answer, at)
        assert (answer[0], stream, frame_id) == (ACK, 2, 1)  # the first ACK is the second message's
        variables = Received(ACK, 0, stream, frame_id, answer[at:]).variables()
        assert variables["status"] == 200
        assert variables["x_ratelimit_remaining"] == "4"  # basic: 5/min, one charged: the dropped one was not
    finally:
        sock.close()
        server.close()
        await server.end()


def _acks(sock: socket.socket, quiet: float = 1.5) -> int:
    """ACKs read from ``sock`` until nothing comes for ``quiet`` seconds."""
    sock.settimeout(quiet)
    count = 0
    try:
        while True:
            assert _read_frame(sock)[0] == ACK
            count += 1
    except TimeoutError:
        return count


@pytest.mark.parametrize(
    ("bound", "connections", "frames", "queued"),
    [("connection", 1, 40, 4), ("worker", 3, 6, 4)],
)
async def test_spoe_frames_past_the_bytes_in_flight_are_left_unread(
    monkeypatch: pytest.MonkeyPatch, bound: str, connections: int, frames: int, queued: int
) -> None:
    """docs/security.md: "no further frame is read from a connection that has 64 KiB of NOTIFY frames
    ... queued or being decided, nor from any once the worker's connections hold 32 MiB"
    (``SPOE_MAX_BYTES_IN_FLIGHT``, ``SPOE_MAX_BYTES``; the worker's lowered to 64 KiB here, with the
    connection's, its least). With the loop blocked, NOTIFYs of 15.7 KB queue until the bound; those
    queued pass ``SPOE_TIMEOUT_PROCESSING`` (0.3 s here) and are dropped, while those left unread (and
    the one read and waiting for room) are decided once the loop runs: the ACKs count the unread."""
    monkeypatch.setattr(bounds, "SPOE_TIMEOUT_PROCESSING", 0.3)
    if bound == "worker":
        monkeypatch.setattr(bounds, "SPOE_MAX_BYTES_IN_FLIGHT", 64 * 1024)
        monkeypatch.setattr(bounds, "SPOE_MAX_BYTES", 64 * 1024)
    else:
        assert bounds.SPOE_MAX_BYTES_IN_FLIGHT == 64 * 1024 and bounds.SPOE_MAX_BYTES == 32 * 1024 * 1024
    listener = loopback_listener()
    port = listener.getsockname()[1]
    server = start_spoe_front(_app(), listener)
    loop = asyncio.get_running_loop()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(connections)]

    def send_all() -> None:
        for n, sock in enumerate(socks):
            sock.sendall(hello())
            assert _read_frame(sock)[0] == AGENT_HELLO
            sock.sendall(b"".join(notify(i, 1, headers={"X-API-Key": f"pk-{n}-{i}"}, pad="x" * 15_600)
                                  for i in range(1, frames + 1)))

    try:
        sent = loop.run_in_executor(None, send_all)
        time.sleep(BLOCKED)  # the loop is blocked: frames are read and queued up to the bound
        await sent
        acks = await asyncio.gather(*(loop.run_in_executor(None, _acks, sock) for sock in socks))
        total = connections * frames
        # without the bound every frame would have queued and been dropped: no ACK at all
        assert total - queued <= sum(acks) < total, (acks, total)
    finally:
        for sock in socks:
            sock.close()
        server.close()
        await server.end()


# -- the open-files limit ------------------------------------------------------------------------------------


def test_the_open_files_limit_is_raised_to_fit_the_connection_caps(tmp_path: Path) -> None:
    """docs/security.md: "the open-file limit is raised to fit" (``serve.process.fit_open_files``):
    started with a soft limit of 256 under a hard one that fits every cap, ``serve`` raises its soft
    limit to the caps' sum (HTTP 1,000 + gRPC 1,000 + 64) and lowers no cap."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = bounds.HTTP_MAX_CONNECTIONS + bounds.GRPC_MAX_CONNECTIONS + 64
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-files limit ({hard}) is below {wanted}")
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(ENVOY)
    log = tmp_path / "serve.log"

    def small_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(envoy), "--http", f"127.0.0.1:{free_port()}",
            "--grpc", f"127.0.0.1:{free_port()}", "--front", "compiled", "--watch", "0"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=small_soft_limit,
                                start_new_session=True)
    try:
        wait_until(lambda: b"worker_started" in log.read_bytes(), 30, "the worker")
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert re.split(r"\s{2,}", line)[1] == str(wanted), line
        assert b"bounds_lowered" not in log.read_bytes()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


# -- start-up refusals ---------------------------------------------------------------------------------------


def _serve(tmp_path: Path, policy: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(path), "--watch", "0", *args]
    if "--http" not in args:
        argv += ["--http", f"127.0.0.1:{free_port()}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "policy", "named"),
    [
        (("--http", "127.0.0.1:70000"), "", "--http '127.0.0.1:70000': expected HOST:PORT"),
        (("--grpc", "127.0.0.1:65536"), "", "--grpc '127.0.0.1:65536': expected HOST:PORT"),
        (("--store", "redsi://localhost"), "", "did you mean redis://?"),
        ((), 'algorithm = "token-bucket"', "unknown algorithm 'token-bucket'; did you mean 'token_bucket'?"),
    ],
    ids=["http-port", "grpc-port", "store-scheme", "algorithm"],
)
def test_a_typo_or_a_port_out_of_range_is_refused_at_start_up(
    tmp_path: Path, args: tuple[str, ...], policy: str, named: str
) -> None:
    """docs/security.md, "Configuration mistakes": refused at start-up (exit 2), the likely name suggested."""
    text = POLICY.replace("{basic}", "5/hour")
    if policy:
        text = text.replace('tiered = true', f"tiered = true\n{policy}")
    result = _serve(tmp_path, text, *args)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not any(json.loads(line).get("event") == "started" for line in result.stderr.splitlines()
                   if line.startswith("{"))
