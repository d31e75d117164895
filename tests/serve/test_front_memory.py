"""What a hostile gRPC or SPOE client can make a ``ratewarden serve`` worker hold, in bytes and in
seconds (issue 36, items 3 and 5), measured on the real process: the sum of ``VmRSS`` over the serve
process and its children, sampled every 50 ms while the attack runs, against the same sum just before.

- **gRPC, unfinished messages.** One raw HTTP/2 connection (the ``h2`` library, flow control obeyed)
  opens 1,024 calls, each announcing a 1 MiB message and sending all of it but the last byte. The audit
  saw the compiled door go from 35 to 1,079 MB and hold the calls 104 s past ``--grpc-timeout``,
  answering nothing; the Python door likewise (256 calls, 312 MB). Now every call is answered
  (``RESOURCE_EXHAUSTED`` over a budget, ``DEADLINE_EXCEEDED`` at the deadline) within the deadline
  and a second, and the memory stays within the budgets; an honest client on another connection is
  answered meanwhile.
- **gRPC, headers only.** Thousands of calls over several connections, headers sent, no message.
- **SPOE, pipelined NOTIFYs.** 64 connections each pipelining 256 NOTIFYs of 15.7 KB and never reading
  an ACK (the audit: 34 to 292 MB, an honest check 2.23 s late, past HAProxy's 500 ms ``timeout
  processing``). Now each connection has at most 64 KiB of frames queued or being decided, so an
  honest check waits behind at most 64 x 64 KiB of them.

Each attack's bound is stated next to its test in docs/security.md ("What a worker holds"). These are
the suite's heavy tests: about 30 s together (the Python door's 10 s deadline the longest), a worker
busy at 100 % and up to 320 MiB of RSS while they run; the measured numbers print with ``-s``.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.services import free_port
from ratewarden.serve import bounds
from tests.front_door import require_compiled_front

from .test_serve_cli import POLICY, Serve, _write
from .test_spoe import ACK, AGENT_HELLO, hello, notify, unvarint

grpc = pytest.importorskip("grpc")
h2_config = pytest.importorskip("h2.config")
h2_connection = pytest.importorskip("h2.connection")
h2_events = pytest.importorskip("h2.events")
h2_exceptions = pytest.importorskip("h2.exceptions")
rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")
ratelimit_pb2 = pytest.importorskip("envoy.extensions.common.ratelimit.v3.ratelimit_pb2")

ENVOY = """
domain: front
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
MiB = 1024 * 1024
#: What the compiled door counts for a call being received besides the bytes it sent (rust/src/lib.rs
#: ``STREAM_BYTES``; serve.bounds' GRPC_MAX_RECEIVING docstring).
STREAM_BYTES = 8 * 1024
#: The compiled door's deadline in these tests (``--grpc-timeout``), short so that they are quick.
TIMEOUT = 3.0
#: How much later than its deadline a call may be seen ended: the deadline's timer, the answer's write
#: and this test's reader, on two cores that other tests share. Under two CPU hogs beside the suite's
#: two workers, the reader saw a whole batch of deadline answers 1.6 s late at once (1.0 was too tight).
LATE = 2.0


# -- the worker's memory --------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """``VmRSS`` (KiB) of ``pid`` and of its descendants (``serve``'s workers), summed."""
    total, todo = 0, [pid]
    while todo:
        process = todo.pop()
        try:
            status = Path(f"/proc/{process}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{process}/task").iterdir():
                todo.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue  # a process that ended meanwhile (or a zombie: no VmRSS)
    return total


class Sampler:
    """The serve process group's RSS every ``every`` seconds on a thread, while in its ``with``."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid, self.every = pid, every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(rss_kib(self.pid))
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float:
        return max(self.samples) / 1024


def baseline_mib(pid: int) -> float:
    """The group's RSS at rest: the largest of a few samples, so that the bound is on what the attack adds."""
    samples = []
    for _ in range(5):
        samples.append(rss_kib(pid))
        time.sleep(0.05)
    return max(samples) / 1024


# -- gRPC: a raw HTTP/2 attacker --------------------------------------------------------------------------


@dataclass
class Call:
    """One attacking call: when its headers were sent, how much of its message is left to send, and
    when and how the server ended it (``grpc-status N`` answered, ``reset N``, ``goaway``, ``closed``)."""

    opened: float
    left: int
    sent: int = 0
    ended: float | None = None
    how: str = ""


@dataclass
class Connection:
    sock: socket.socket
    h2: Any
    calls: dict[int, Call] = field(default_factory=dict)
    settings: bool = False
    closed: bool = False


class Attack:
    """``connections`` raw HTTP/2 connections, each opening calls whose messages are never finished.

    Flow control is obeyed (DATA only within the stream's and the connection's windows, opened again
    by the server's WINDOW_UPDATEs), as the audit's client did: the server is never sent more than it
    allowed."""

    def __init__(self, address: str, connections: int) -> None:
        host, port = address.rsplit(":", 1)
        self.connections: list[Connection] = []
        for _ in range(connections):
            sock = socket.create_connection((host, int(port)), timeout=10)
            conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True, header_encoding="utf-8"))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
            self.connections.append(Connection(sock, conn))

    def calls(self) -> list[Call]:
        return [call for connection in self.connections for call in connection.calls.values()]

    def close(self) -> None:
        for connection in self.connections:
            connection.sock.close()

    def run(self, per_connection: int, message: int, until: float) -> None:
        """Open ``per_connection`` calls on each connection (as many as the server's
        SETTINGS_MAX_CONCURRENT_STREAMS lets), each announcing a ``message``-byte message and sending
        all of it but its last byte (``message`` 0: headers only); send what the windows allow until
        every call has ended or ``until`` (monotonic) passes."""
        for connection in self.connections:
            while not connection.settings and time.monotonic() < until:
                self._read(connection, 0.1)
        body = memoryview(b"\x00" + message.to_bytes(4, "big") + bytes(message))
        unfinished = 5 + message - 1 if message else 0
        headers = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "rls"),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        for connection in self.connections:
            for _ in range(per_connection):
                stream = connection.h2.get_next_available_stream_id()
                try:
                    connection.h2.send_headers(stream, headers)
                except h2_exceptions.TooManyStreamsError:
                    break
                connection.calls[stream] = Call(time.monotonic(), unfinished)
            connection.sock.sendall(connection.h2.data_to_send())
        while time.monotonic() < until:
            sent = any([self._send(connection, body) for connection in self.connections])
            for connection in self.connections:
                while not connection.closed and self._read(connection, 0 if sent else 0.01):
                    pass
            if all(call.ended is not None for call in self.calls()):
                return

    def _send(self, connection: Connection, body: memoryview) -> bool:
        if connection.closed:
            return False
        sent = False
        for stream, call in connection.calls.items():
            size = min(connection.h2.local_flow_control_window(stream), call.left,
                       connection.h2.max_outbound_frame_size) if call.left > 0 else 0
            if size <= 0:
                continue
            try:
                connection.h2.send_data(stream, body[call.sent : call.sent + size])
            except (h2_exceptions.StreamClosedError, h2_exceptions.ProtocolError):
                call.left = 0
                continue
            call.sent += size
            call.left -= size
            sent = True
        data = connection.h2.data_to_send()
        if data:
            connection.sock.sendall(data)
        return sent

    def _read(self, connection: Connection, timeout: float) -> bool:
        """Handle what the server sent within ``timeout``; whether anything came."""
        if not select.select([connection.sock], [], [], timeout)[0]:
            return False
        try:
            data = connection.sock.recv(1 << 20)
        except ConnectionError:
            data = b""
        now = time.monotonic()
        if not data:
            self._end_all(connection, now, "closed")
            return False
        try:
            events = connection.h2.receive_data(data)
        except h2_exceptions.ProtocolError as exc:  # e.g. a frame after the server's GOAWAY
            self._end_all(connection, now, f"h2 error: {exc}")
            return False
        for event in events:
            if isinstance(event, h2_events.RemoteSettingsChanged):
                connection.settings = True
            elif isinstance(event, (h2_events.ResponseReceived, h2_events.TrailersReceived)):
                status = dict(event.headers).get("grpc-status")
                if status is not None:
                    self._end(connection, event.stream_id, now, f"grpc-status {status}")
            elif isinstance(event, h2_events.StreamEnded):
                self._end(connection, event.stream_id, now, "ended")
            elif isinstance(event, h2_events.StreamReset):
                self._end(connection, event.stream_id, now, f"reset {int(event.error_code)}")
            elif isinstance(event, h2_events.DataReceived):
                connection.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2_events.ConnectionTerminated):
                self._end_all(connection, now, "goaway")
        data = connection.h2.data_to_send()
        if data and not connection.closed:
            connection.sock.sendall(data)
        return True

    @staticmethod
    def _end(connection: Connection, stream: int, now: float, how: str) -> None:
        call = connection.calls.get(stream)
        if call is not None and call.ended is None:
            call.ended, call.how, call.left = now, how, 0

    def _end_all(self, connection: Connection, now: float, how: str) -> None:
        connection.closed = True
        for stream in connection.calls:
            self._end(connection, stream, now, how)


def honest_calls(address: str, connected: threading.Event, done: threading.Event) -> list[tuple[float, Any]]:
    """An honest client's calls on a connection of its own (``connected`` set once it is open), one
    every 50 ms until ``done`` is set and one more after, each with a 1 s deadline: ``(seconds,
    overall code or status code)`` of each."""
    message = rls_pb2.RateLimitRequest(domain="front", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="honest")])])
    out: list[tuple[float, Any]] = []
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        stub.ShouldRateLimit(message, timeout=10)
        connected.set()
        last = False
        while not last:
            last = done.is_set()
            started = time.monotonic()
            try:
                code = stub.ShouldRateLimit(message, timeout=1.0).overall_code
            except grpc.RpcError as exc:
                code = exc.code()
            out.append((time.monotonic() - started, code))
            time.sleep(0.05)
    return out


@dataclass
class Outcome:
    calls: list[Call]
    honest: list[tuple[float, Any]]
    baseline: float
    peak: float

    def held(self) -> float:
        """The longest any attacking call was open, from its headers to its end."""
        return max((call.ended or time.monotonic()) - call.opened for call in self.calls)

    def report(self) -> str:
        hows = Counter(call.how or "open" for call in self.calls)
        worst = max((seconds for seconds, _ in self.honest), default=0.0)
        return (f"{len(self.calls)} calls {dict(hows)}, held at most {self.held():.2f} s; RSS {self.baseline:.0f} "
                f"-> {self.peak:.0f} MiB; {len(self.honest)} honest calls, the slowest {worst * 1000:.0f} ms")


def attack(server: Serve, address: str, connections: int, per_connection: int, message: int,
           deadline: float) -> Outcome:
    """Run the attack on a thread while an honest client calls and the RSS is sampled; the attack
    runs until its calls have all ended, or ``deadline`` + ``LATE`` + 2 s."""
    honest: list[tuple[float, Any]] = []
    connected, done = threading.Event(), threading.Event()
    client = threading.Thread(target=lambda: honest.extend(honest_calls(address, connected, done)))
    baseline = baseline_mib(server.proc.pid)
    hostile = Attack(address, connections)
    runner = threading.Thread(target=hostile.run,
                              args=(per_connection, message, time.monotonic() + deadline + LATE + 2))
    try:
        with Sampler(server.proc.pid) as sampler:
            client.start()
            assert connected.wait(10), "the honest client did not connect"
            runner.start()
            runner.join()
    finally:
        done.set()
        client.join()
        hostile.close()
    return Outcome(hostile.calls(), honest, baseline, sampler.peak_mib)


def answered(outcome: Outcome, deadline: float) -> None:
    """Every attacking call was answered with a gRPC status (not left open, nor only reset) within its
    deadline and ``LATE``."""
    late = [call for call in outcome.calls if call.ended is None or call.ended - call.opened > deadline + LATE]
    assert not late, f"{len(late)} calls held past {deadline} s + {LATE} s: {outcome.report()}"
    assert {call.how for call in outcome.calls} <= {"grpc-status 4", "grpc-status 8"}, outcome.report()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        server = Serve(tmp_path, *args)
        started.append(server)
        return server.ready()

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
        (Path("/dev/shm") / f"ratewarden-serve-{server.proc.pid}.shm").unlink(missing_ok=True)


def grpc_serve(serve: Callable[..., Serve], tmp_path: Path, front: str, *args: str) -> tuple[Serve, str]:
    config = tmp_path / "envoy.yaml"
    _write(config, ENVOY)
    address = f"127.0.0.1:{free_port()}"
    server = serve(str(config), "--grpc", address, "--watch", "0", "--front", front, *args)
    assert server.events("started")[0]["front"] == front
    return server, address


# -- the compiled gRPC door ---------------------------------------------------------------------------------


def test_unfinished_messages_on_one_connection_are_answered_by_the_deadline_within_the_budget(
    serve: Callable[..., Serve], tmp_path: Path
) -> None:
    """1,024 calls on one connection, each sending 1 MiB - 1 byte of a 1 MiB message: the connection's
    budget (4 MiB of calls being received, 8 KiB a call plus what it sent) holds three of them to the
    deadline and refuses the rest at once; none is held past ``--grpc-timeout``, the worker's memory
    grows by a few budgets at most (the audit: +1,044 MB, held 104 s past the deadline), and an
    honest client on another connection is answered meanwhile."""
    require_compiled_front()
    server, address = grpc_serve(serve, tmp_path, "compiled", "--grpc-timeout", str(TIMEOUT))
    outcome = attack(server, address, 1, 1024, bounds.GRPC_MAX_MESSAGE_SIZE, TIMEOUT)
    print(outcome.report())  # the measured numbers, with -s or -rA
    assert len(outcome.calls) == 1024, outcome.report()
    answered(outcome, TIMEOUT)
    held = [call for call in outcome.calls if call.how == "grpc-status 4"]  # DEADLINE_EXCEEDED at the deadline
    assert 1 <= len(held) <= bounds.GRPC_MAX_RECEIVING_PER_CONNECTION // bounds.GRPC_MAX_MESSAGE_SIZE, outcome.report()
    # the connection's 4 MiB and the buffers of the HTTP/2 windows (1 MiB a stream and a connection,
    # hyper's defaults): 64 MiB is twice the worker's whole 32 MiB budget
    assert outcome.peak - outcome.baseline < 64, outcome.report()
    assert outcome.peak < 250, outcome.report()
    assert outcome.honest and all(code in (rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT)
                                  for _, code in outcome.honest), outcome.report()
    assert server.stop() == 0


def test_headers_only_calls_on_several_connections_are_answered_by_the_deadline_within_the_budget(
    serve: Callable[..., Serve], tmp_path: Path
) -> None:
    """5,000 calls over five connections, headers only (the audit: ~9 KB each, held past the
    deadline): each connection's budget holds 512 of them (4 MiB at 8 KiB a call) to the deadline and
    refuses the rest at once; the worker's memory grows by at most its 32 MiB budget and the streams'
    state; an honest client on another connection is answered meanwhile."""
    require_compiled_front()
    server, address = grpc_serve(serve, tmp_path, "compiled", "--grpc-timeout", str(TIMEOUT))
    outcome = attack(server, address, 5, 1000, 0, TIMEOUT)
    print(outcome.report())
    assert len(outcome.calls) == 5000, outcome.report()
    answered(outcome, TIMEOUT)
    per_connection = bounds.GRPC_MAX_RECEIVING_PER_CONNECTION // STREAM_BYTES
    held = sum(call.how == "grpc-status 4" for call in outcome.calls)
    assert 0 < held <= 5 * per_connection, outcome.report()
    assert outcome.peak - outcome.baseline < 64, outcome.report()
    assert outcome.peak < 250, outcome.report()
    assert outcome.honest and all(code in (rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT)
                                  for _, code in outcome.honest), outcome.report()
    assert server.stop() == 0


# -- the Python gRPC door (grpc.aio) ------------------------------------------------------------------------


def test_the_python_door_answers_unfinished_messages_by_the_deadline_within_its_call_cap(
    serve: Callable[..., Serve], tmp_path: Path
) -> None:
    """The same attack on ``--front python``: grpc.aio holds at most ``MAX_CONCURRENT_RPCS`` (256) calls
    a worker, refusing more at once with RESOURCE_EXHAUSTED, and each call's message must be whole
    within ``--grpc-timeout`` of its headers (``serve.grpc``: its handler reads it under that deadline),
    else DEADLINE_EXCEEDED ends it and frees what it received. grpc core opens each stream's window to
    the 1 MiB its message announces, so the worker holds 256 x 1 MiB at most (the audit: 256 calls,
    312 MB, never answered). Having no per-connection share, the door answers an honest client at once,
    but RESOURCE_EXHAUSTED while one connection holds all 256 calls; OK again once they ended."""
    from ratewarden.serve.grpc import MAX_CONCURRENT_RPCS

    server, address = grpc_serve(serve, tmp_path, "python", "--grpc-timeout", str(TIMEOUT))
    deadline = TIMEOUT
    outcome = attack(server, address, 1, 1024, bounds.GRPC_MAX_MESSAGE_SIZE, deadline)
    print(outcome.report())
    assert len(outcome.calls) == 1024, outcome.report()
    answered(outcome, deadline)
    held = [call for call in outcome.calls if call.how == "grpc-status 4"]
    assert 0 < len(held) <= MAX_CONCURRENT_RPCS, outcome.report()
    refused = [call for call in outcome.calls if call.how == "grpc-status 8"]
    assert all(call.ended is not None and call.ended - call.opened < LATE for call in refused), outcome.report()
    # a call's message buffer in grpc core and the call's state: 1.25 MiB a call (measured: 1.05 MiB)
    assert outcome.peak - outcome.baseline < MAX_CONCURRENT_RPCS * 1.25 * bounds.GRPC_MAX_MESSAGE_SIZE / MiB, \
        outcome.report()
    codes = {rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert outcome.honest and all(seconds < 1 and code in codes for seconds, code in outcome.honest), outcome.report()
    assert outcome.honest[-1][1] == rls_pb2.RateLimitResponse.OK, outcome.report()  # once the attack's calls ended
    assert server.stop() == 0


# -- SPOE ---------------------------------------------------------------------------------------------------


def read_frame(sock: socket.socket) -> bytes:
    """The body of the next SPOP frame (its type, flags, stream and frame ids, payload)."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the agent closed the connection"
            data += chunk
        return data

    return exactly(int.from_bytes(exactly(4), "big"))


def _spoe_connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(hello(max_frame_size=16_380))
    assert read_frame(sock)[0] == AGENT_HELLO
    return sock


def _flood(port: int, frames: bytes, stop: Any, sent: Any) -> None:
    """In a child process: 64 connections each send ``frames`` again and again, never reading an ACK,
    until ``stop``; ``sent`` counts the rounds sent."""
    hostile = [_spoe_connect(port) for _ in range(64)]

    def flood(sock: socket.socket) -> None:
        try:
            while not stop.is_set():
                sock.sendall(frames)  # blocks while the agent reads no more of this connection
                with sent.get_lock():
                    sent.value += 1
        except OSError:
            pass  # closed below

    threads = [threading.Thread(target=flood, args=(sock,), daemon=True) for sock in hostile]
    for thread in threads:
        thread.start()
    stop.wait(120)
    for sock in hostile:
        sock.close()
    for thread in threads:
        thread.join(10)


def test_pipelined_notifies_left_unanswered_on_64_connections_are_bounded(
    serve: Callable[..., Serve], tmp_path: Path
) -> None:
    """64 connections each pipeline 256 NOTIFYs of 15.7 KB (an argument carrying a long string; frames
    of up to 16,380 bytes agreed), again and again, and never read an ACK. The compiled agent reads no
    further frame from a connection holding 64 KiB of frames queued or being decided
    (``SPOE_MAX_BYTES_IN_FLIGHT``), so an honest connection's check waits behind at most 64 x 64 KiB
    of them, and the worker holds that much: honest NOTIFYs are ACKed within HAProxy's 500 ms
    ``timeout processing`` (the audit: 2.23 s; the tail: see below), and the worker's memory grows
    far less than the 4 MiB each connection sends at a time (the audit: 34 to 292 MB)."""
    require_compiled_front()
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    port = free_port()
    server = serve(str(policy), "--spoe", f"127.0.0.1:{port}", "--spoe-front", "compiled", "--watch", "0")
    frames = b"".join(notify(stream, 1, pad="x" * 15_600) for stream in range(1, 257))
    assert len(frames) // 256 > 15_600 and len(notify(1, 1, pad="x" * 15_600)) <= 16_380 + 4

    honest = _spoe_connect(port)
    stop = multiprocessing.get_context("spawn").Event()
    sent = multiprocessing.get_context("spawn").Value("i", 0)
    # The flood runs in a process of its own: its 64 threads then never hold this process's GIL while
    # the honest check's wait is timed here.
    flooder = multiprocessing.get_context("spawn").Process(target=_flood, args=(port, frames, stop, sent))
    waits: list[float] = []
    baseline = baseline_mib(server.proc.pid)
    try:
        with Sampler(server.proc.pid) as sampler:
            flooder.start()
            deadline = time.monotonic() + 60
            while sent.value < 64 and time.monotonic() < deadline:  # every connection sent its frames once
                time.sleep(0.05)
            for stream in range(1, 31):  # 30 checks over about 3 s
                started = time.monotonic()
                honest.sendall(notify(stream, 1, headers={"X-API-Key": "pk-alice"}))
                answer = read_frame(honest)
                waits.append(time.monotonic() - started)
                assert answer[0] == ACK and unvarint(answer, 5)[0] == stream
                time.sleep(0.1)
    finally:
        stop.set()
        honest.close()
        flooder.join(30)
        if flooder.is_alive():
            flooder.kill()
    rounds = {"sent": sent.value}
    report = (f"RSS {baseline:.0f} -> {sampler.peak_mib:.0f} MiB; {rounds['sent']} rounds of 256 NOTIFYs sent; "
              f"honest waits (ms): {sorted(round(w * 1000) for w in waits)}")
    print(report)
    assert rounds["sent"] >= 64, report  # every connection sent its 256 at least once
    # What a check waits behind is bounded: 64 connections x 64 KiB of frames, about 260 of these,
    # decided in 10-45 ms on two cores at a load of 5 (measured), a tenth of HAProxy's 500 ms
    # `timeout processing`: every check is held to it (the audit: 2.23 s), and without the bound a
    # sustained flood's queue grows without end.
    assert max(waits) < 0.5, report
    # 64 x 64 KiB = 4 MiB in flight, plus each connection's frame being read and the agent's buffers
    assert sampler.peak_mib - baseline < 100, report
    assert sampler.peak_mib < 250, report
    assert server.stop() == 0
