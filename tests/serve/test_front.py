"""``ratewarden serve --front compiled`` as a real process, spoken to with the published Envoy API's
client (xds-protos' ``RateLimitServiceStub`` on grpc.aio): exact under concurrency on memory, shared
memory (two workers on one port) and Redis, the same error codes and messages as the python front
door, oversize refusal from the same bounds, the connection cap and request timeout, reloads, a
graceful SIGTERM, and how ``--front`` chooses (``--version``, exit 2, the fallback's log line)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.services import free_port
from ratewarden.limiter import Limiter
from ratewarden.serve import bounds
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.front import start_front
from ratewarden.serve.rls import RateLimitService
from ratewarden.stores import MemoryStore, RedisStore
from tests.front_door import require_compiled_front
from tests.servers import RedisStandalone, wait_until

from .test_serve_cli import Serve, _write

grpc = pytest.importorskip("grpc")
rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")
ratelimit_pb2 = pytest.importorskip("envoy.extensions.common.ratelimit.v3.ratelimit_pb2")

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

ENVOY = """
domain: front
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: LIMIT}
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_front()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(limit: int, *args: str) -> tuple[Serve, str, Path]:
        config = tmp_path / "envoy.yaml"
        _write(config, ENVOY.replace("LIMIT", str(limit)))
        address = f"127.0.0.1:{free_port()}"
        server = Serve(tmp_path, str(config), "--grpc", address, "--watch", "0", *args)
        started.append(server)
        return server, address, config

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
        (Path("/dev/shm") / f"ratewarden-serve-{server.proc.pid}.shm").unlink(missing_ok=True)


def request(*descriptors: list[tuple[str, str]], domain: str = "front", hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(
        domain=domain, hits_addend=hits,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d])
            for d in descriptors
        ],
    )


async def concurrent(address: str, message: Any, n: int, channels: int = 1) -> Counter[Any]:
    """``n`` calls at once over ``channels`` connections: the overall codes, or the error codes."""
    opened = [grpc.aio.insecure_channel(address) for _ in range(channels)]
    try:
        stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in opened]
        calls = [stubs[i % channels].ShouldRateLimit(message, timeout=30) for i in range(n)]
        answers = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        for channel in opened:
            await channel.close()
    return Counter(a.code() if isinstance(a, grpc.aio.AioRpcError) else a.overall_code for a in answers)


async def outcome(address: str, message: Any, timeout: float = 30) -> tuple[Any, str]:
    """``(status code, details)`` of one call; ``(OK, overall code)`` when it was answered."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            answer = await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(message, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, rls_pb2.RateLimitResponse.Code.Name(answer.overall_code)


def ready(server: Serve, workers: int = 1) -> Serve:
    server.ready(workers)
    assert server.events("started")[0]["front"] == "compiled"
    return server


def test_exact_under_concurrency_on_memory(serve: Any) -> None:
    server, address, _ = serve(25, "--front", "compiled")
    ready(server)
    codes = asyncio.run(concurrent(address, request([("user", "u1")]), 120, channels=4))
    assert codes == {OK: 25, OVER: 95}
    assert server.stop() == 0


def test_exact_under_concurrency_on_redis(serve: Any, redis_standalone: Any) -> None:
    server, address, _ = serve(30, "--front", "compiled", "--store", redis_standalone.url)
    ready(server)
    user = [("user", uuid.uuid4().hex)]  # the session's Redis: a key no other test charges
    assert asyncio.run(concurrent(address, request(user), 150, channels=4)) == {OK: 30, OVER: 120}
    both = request([("open", uuid.uuid4().hex)], user)  # all or nothing: the refused one charges neither
    assert asyncio.run(concurrent(address, both, 10)) == {OVER: 10}
    assert server.stop() == 0


async def test_a_batch_on_redis_waits_in_one_task_and_stays_exact(redis_standalone: Any) -> None:
    """Decisions of one batch that wait for Redis are resumed by one Task (not one each), exactly."""
    domain = parse_envoy_config(ENVOY.replace("LIMIT", "40"))
    store = RedisStore(redis_standalone.url)
    front = start_front(RateLimitService({domain.domain: domain}, Limiter(store)), "127.0.0.1", 0)
    adapter = front.adapter
    try:
        address = f"127.0.0.1:{front.port}"
        user = [("user", uuid.uuid4().hex)]
        assert await concurrent(address, request(user), 200) == {OK: 40, OVER: 160}
        assert await concurrent(address, request([("open", uuid.uuid4().hex)]), 200) == {OK: 200}
    finally:
        await front.stop(1.0)
        await store.close()
    assert adapter.requests == 400
    assert adapter.batches < adapter.requests  # 200 calls at once on one connection: batched
    assert 0 < adapter.tasks <= adapter.batches


def test_two_workers_share_the_port_stay_exact_and_reload(serve: Any) -> None:
    server, address, config = serve(40, "--front", "compiled", "--workers", "2")
    ready(server, workers=2)
    assert len({e["pid"] for e in server.events("worker_started")}) == 2
    # separate connections, so SO_REUSEPORT hands them to both workers; one shared-memory count
    assert asyncio.run(concurrent(address, request([("user", "w1")]), 160, channels=16)) == {OK: 40, OVER: 120}
    _write(config, ENVOY.replace("LIMIT", "3"))
    os.kill(server.proc.pid, signal.SIGHUP)
    assert len({e["pid"] for e in server.wait_for("reloaded", 2)}) == 2
    assert asyncio.run(concurrent(address, request([("user", "w2")]), 20, channels=8)) == {OK: 3, OVER: 17}
    assert server.stop() == 0


ERRORS = {
    "empty domain": (request([("user", "e")], domain=""), grpc.StatusCode.INVALID_ARGUMENT),
    "no descriptors": (request(), grpc.StatusCode.INVALID_ARGUMENT),
    "unknown domain": (request([("user", "e")], domain="nowhere"), grpc.StatusCode.OK),
    "too many descriptors": (request(*[[("user", str(i))] for i in range(bounds.MAX_DESCRIPTORS + 1)]),
                             grpc.StatusCode.INVALID_ARGUMENT),
    "too many entries": (request(*[[("user", str(i))] * 205 for i in range(5)]), grpc.StatusCode.INVALID_ARGUMENT),
    "over 1 MiB": (request([("user", "x" * bounds.GRPC_MAX_MESSAGE_SIZE)]), grpc.StatusCode.RESOURCE_EXHAUSTED),
}


def _bad_unit() -> Any:
    message = request([("user", "e")])
    message.descriptors[0].limit.requests_per_unit, message.descriptors[0].limit.unit = 5, 99
    return message


def test_errors_and_oversize_are_answered_as_the_python_front_door(serve: Any) -> None:
    """The same status code and message from both front doors, for each bad request; the bounds are
    the ones of ``serve.bounds``, and the Rust side refuses what is too large before deciding."""
    compiled, compiled_address, _ = serve(5, "--front", "compiled")
    python, python_address, _ = serve(5, "--front", "python")
    ready(compiled)
    python.ready()
    assert python.events("started")[0]["front"] == "python"
    cases = {**ERRORS, "unknown unit": (_bad_unit(), grpc.StatusCode.INVALID_ARGUMENT)}
    for name, (message, code) in cases.items():
        got = asyncio.run(outcome(compiled_address, message))
        assert got[0] == code, (name, got)
        theirs = asyncio.run(outcome(python_address, message))
        assert got[0] == theirs[0], name
        assert got[1] == theirs[1] or name == "over 1 MiB", name  # that message is each gRPC library's own
    assert "at most 256 descriptors, got 257" in asyncio.run(outcome(compiled_address, cases["too many descriptors"][0]))[1]
    assert "at most 1024 entries in all, got 1025" in asyncio.run(outcome(compiled_address, cases["too many entries"][0]))[1]

    async def unknown_method() -> Any:
        async with grpc.aio.insecure_channel(compiled_address) as channel:
            call = channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Nope")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call(b"", timeout=10)
            return raised.value.code()

    assert asyncio.run(unknown_method()) == grpc.StatusCode.UNIMPLEMENTED
    assert compiled.stop() == 0 and python.stop() == 0


def test_the_bounds_options_reach_the_compiled_front(serve: Any) -> None:
    server, address, _ = serve(5, "--front", "compiled", "--max-descriptors", "2", "--max-entries", "3",
                               "--grpc-max-message-size", "1000")
    ready(server)
    code, details = asyncio.run(outcome(address, request([("user", "a")], [("user", "b")], [("user", "c")])))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "a request may carry at most 2 descriptors, got 3")
    code, details = asyncio.run(outcome(address, request([("user", "a"), ("x", "1")], [("user", "b"), ("x", "2")])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 3 entries" in details
    assert asyncio.run(outcome(address, request([("user", "x" * 1000)])))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert asyncio.run(outcome(address, request([("user", "a")], [("open", "b")]))) == (grpc.StatusCode.OK, "OK")
    assert server.stop() == 0


def test_one_connection_over_the_cap_is_closed_at_once(serve: Any) -> None:
    server, address, _ = serve(5, "--front", "compiled", "--grpc-max-connections", "2")
    ready(server)
    host, port = address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
    try:
        extra = socket.create_connection((host, int(port)), timeout=10)
        with extra:
            assert extra.recv(1024) == b""  # closed by the server, unread
        held.pop().close()  # a freed place is taken again
        wait_until(lambda: asyncio.run(outcome(address, request([("user", "c")]), timeout=5))[0] == grpc.StatusCode.OK,
                   20, "a call once a connection closed")
    finally:
        for sock in held:
            sock.close()
    assert server.stop() == 0


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes ``sock`` (True) or ``sock``'s timeout passes (False)."""
    try:
        while sock.recv(4096):
            pass  # the server's own SETTINGS first
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_connections_that_never_finish_the_http2_handshake_are_closed(serve: Any) -> None:
    """Silent connections, and one that stops inside its SETTINGS frame, are closed after
    ``--grpc-handshake-timeout`` and so free their places under ``--grpc-max-connections``; a client
    works while they are open and after, and a connection that finished its handshake stays open."""
    server, address, _ = serve(5, "--front", "compiled", "--grpc-max-connections", "5",
                               "--grpc-handshake-timeout", "1")
    ready(server)
    host, port = address.rsplit(":", 1)
    handshaken = socket.create_connection((host, int(port)), timeout=20)
    handshaken.sendall(PREFACE + EMPTY_SETTINGS)
    junk = [socket.create_connection((host, int(port)), timeout=20) for _ in range(3)]
    junk[2].sendall(PREFACE + b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00")  # 6-byte SETTINGS, 1 byte sent
    try:
        assert asyncio.run(outcome(address, request([("user", "h")]))) == (grpc.StatusCode.OK, "OK")
        for sock in junk:
            assert _closed_by_server(sock)  # within the socket's 20 s: the bound is 1 s
        handshaken.settimeout(1.0)
        assert not _closed_by_server(handshaken)  # a finished handshake is not timed
        # the freed places: five connections fit again (the handshaken one and four calls)
        codes = asyncio.run(concurrent(address, request([("open", "h")]), 4, channels=4))
        assert codes == {OK: 4}
    finally:
        for sock in (*junk, handshaken):
            sock.close()
    assert server.stop() == 0


def test_the_python_door_closes_connections_that_never_finish_the_http2_handshake(serve: Any) -> None:
    """``--grpc-handshake-timeout`` bounds the Python gRPC door too (grpc core's server handshake
    deadline): a silent connection is closed after it, and a client is served meanwhile."""
    server, address, _ = serve(5, "--front", "python", "--grpc-handshake-timeout", "1")
    server.ready(1)
    assert server.events("started")[0]["front"] == "python"
    host, port = address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=20)
    try:
        assert asyncio.run(outcome(address, request([("user", "p")]))) == (grpc.StatusCode.OK, "OK")
        assert _closed_by_server(silent)  # within the socket's 20 s (grpc core's default is 120 s)
    finally:
        silent.close()
    assert server.stop() == 0


async def test_a_call_past_its_deadline_in_the_queue_is_never_decided() -> None:
    """A call whose caller's deadline passed while it waited in the front door's queue (here: the
    event loop blocked) is never handed to the decision, so it charges nothing."""
    domain = parse_envoy_config(ENVOY.replace("LIMIT", "1"))
    front = start_front(RateLimitService({domain.domain: domain}, Limiter(MemoryStore())), "127.0.0.1", 0)
    address = f"127.0.0.1:{front.port}"

    def call(timeout: float) -> Any:
        with grpc.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            try:
                return stub.ShouldRateLimit(request([("user", "q")]), timeout=timeout).overall_code
            except grpc.RpcError as exc:
                return exc.code()

    try:
        loop = asyncio.get_running_loop()
        late = loop.run_in_executor(None, call, 0.3)
        time.sleep(1.5)  # the loop is blocked: the call waits in Rust's queue past its deadline
        assert await late == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(0.1)
        assert front.adapter.requests == 0  # never taken
        assert await loop.run_in_executor(None, call, 30) == OK  # the limit of 1 is still whole
    finally:
        await front.stop(1.0)


def test_a_callers_deadline_cancels_its_decision_on_a_paused_redis(serve: Any, paused_redis: RedisStandalone) -> None:
    """A call whose ``grpc-timeout`` (0.3 s) is shorter than ``--grpc-timeout`` is answered
    DEADLINE_EXCEEDED at its deadline, and its decision is cancelled then: queued behind a call in
    flight to the paused store, it is never sent, so nothing is charged once the store answers again."""
    store = f"{paused_redis.url}?timeout=10&pool_size=1"
    server, address, _ = serve(1, "--front", "compiled", "--store", store)
    ready(server)
    assert asyncio.run(outcome(address, request([("open", "warm")]))) == (grpc.StatusCode.OK, "OK")
    paused_redis.server.pause()

    async def behind_a_call_in_flight() -> tuple[Any, Any, float]:
        first = asyncio.create_task(outcome(address, request([("user", "first")])))
        waited = time.monotonic() + 20
        while not paused_redis.server.unread():  # then its pipeline is in flight to the paused store
            assert time.monotonic() < waited, "the first call never reached the paused store"
            await asyncio.sleep(0.02)
        started = time.monotonic()
        cut = await outcome(address, request([("user", "cut")]), timeout=0.3)
        took = time.monotonic() - started
        # The server's deadline runs from when it read the call (gRPC's ``grpc-timeout``): on a busy
        # machine later than our own timer's, so the store answers again only once it has passed.
        await asyncio.sleep(1.0)
        paused_redis.server.resume()
        return cut, await first, took

    cut, first, took = asyncio.run(behind_a_call_in_flight())
    # the server's answer or grpc-python's own timer: DEADLINE_EXCEEDED, at times CANCELLED "Timeout expired"
    assert cut[0] == grpc.StatusCode.DEADLINE_EXCEEDED or cut == (grpc.StatusCode.CANCELLED, "Timeout expired"), cut
    assert took < 5, took  # not --grpc-timeout's 10 s
    assert first == (grpc.StatusCode.OK, "OK")
    assert asyncio.run(outcome(address, request([("user", "cut")]))) == (grpc.StatusCode.OK, "OK"), "charged"
    assert asyncio.run(outcome(address, request([("user", "cut")]))) == (grpc.StatusCode.OK, "OVER_LIMIT")
    assert server.stop() == 0


@pytest.fixture
def paused_redis() -> Iterator[RedisStandalone]:
    server = RedisStandalone().start()
    try:
        yield server
    finally:
        server.server.resume()
        server.close()


def test_request_timeout_and_graceful_stop_on_a_paused_redis(serve: Any, paused_redis: RedisStandalone) -> None:
    """A decision slower than ``--grpc-timeout`` is DEADLINE_EXCEEDED; on SIGTERM every call in flight
    is still decided (here: the store times out and the fail-open insurance limiter decides), then exit 0."""
    store = f"{paused_redis.url}?timeout=3"
    server, address, _ = serve(5, "--front", "compiled", "--store", store, "--grpc-timeout", "1")
    ready(server)
    paused_redis.server.pause()
    code, details = asyncio.run(outcome(address, request([("user", "t")])))
    assert (code, details) == (grpc.StatusCode.DEADLINE_EXCEEDED, "no decision within 1.000 s")
    paused_redis.server.resume()
    server.stop()

    late, late_address, _ = serve(5, "--front", "compiled", "--store", store)
    ready(late)
    assert asyncio.run(outcome(late_address, request([("user", "g0")]))) == (grpc.StatusCode.OK, "OK")
    paused_redis.server.pause()

    async def in_flight_then_term() -> Counter[Any]:
        calls = asyncio.create_task(concurrent(late_address, request([("user", "g1")]), 20))
        await asyncio.sleep(1.0)  # every call is waiting on the paused store now
        late.proc.send_signal(signal.SIGTERM)
        return await calls

    codes = asyncio.run(in_flight_then_term())
    assert sum(codes.values()) == 20 and set(codes) <= {OK, OVER}, codes  # answered, none failed
    assert 1 <= codes[OK] <= 5, codes  # the insurance limiter keeps the limit while the store is out
    assert late.proc.wait(30) == 0
    names = [e["event"] for e in late.events()]
    assert names.index("stopping") < names.index("worker_stopped")


def _cli(*args: str, blocked: bool, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "envoy.yaml"
    config.write_text(ENVOY.replace("LIMIT", "5"))
    block = "sys.modules['ratewarden._front'] = None; " if blocked else ""
    code = f"import sys; {block}from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", str(config), "--http", f"127.0.0.1:{free_port()}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_version_names_the_front_door_and_why_not_compiled(tmp_path: Path) -> None:
    here = _cli("--version", blocked=False, tmp_path=tmp_path)
    assert here.returncode == 0 and "gRPC front door: compiled (tonic in ratewarden._front " in here.stdout, here
    python = _cli("--front", "python", "--version", blocked=False, tmp_path=tmp_path)
    assert "gRPC front door: python (grpc.aio); not compiled: --front python" in python.stdout
    absent = _cli("--version", blocked=True, tmp_path=tmp_path)
    assert absent.returncode == 0 and "gRPC front door: python (grpc.aio); not compiled: ratewarden._front does not import" in absent.stdout


def test_without_the_extension_compiled_exits_2_and_auto_says_why_once(tmp_path: Path) -> None:
    refused = _cli("--front", "compiled", "--grpc", f"127.0.0.1:{free_port()}", blocked=True, tmp_path=tmp_path)
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("ratewarden serve: --front compiled: ratewarden._front does not import")
    assert "Traceback" not in refused.stderr and "started" not in refused.stderr
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "envoy.yaml"
    log = tmp_path / "auto.log"
    code = "import sys; sys.modules['ratewarden._front'] = None; from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", str(config), "--http", f"127.0.0.1:{free_port()}", "--grpc", address,
            "--workers", "2"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until(lambda: log.read_text().count('"worker_started"') == 2, 30, "two workers")
        assert asyncio.run(outcome(address, request([("user", "a")]))) == (grpc.StatusCode.OK, "OK")
        fallbacks = [line for line in log.read_text().splitlines() if '"front_python"' in line]
        assert len(fallbacks) == 1 and "ratewarden._front does not import" in fallbacks[0], log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        (Path("/dev/shm") / f"ratewarden-serve-{proc.pid}.shm").unlink(missing_ok=True)
