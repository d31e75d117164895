"""The compiled HTTP front door (``--http-front compiled``: hyper in ``ratewarden._front``) against the
python one (``--http-front python``: uvicorn with httptools) on requests no well-behaved client sends,
over raw sockets: what llhttp refuses (a lower-case or unknown method, bare LF line ends,
``Transfer-Encoding`` with ``Content-Length``, strict chunks) the compiled door refuses with
uvicorn's bytes, hyper's own bodiless 400/414/431 are sent as the python door's answers, an
HTTP/1.0 request is answered as uvicorn answers it; the differences left are the ones
docs/security.md lists, asserted here; and an idle kept-alive connection closes ``keep_alive``
seconds after its last answer, on both doors."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ratewarden.serve import bounds
from tests.front_door import require_compiled_front

from .test_serve_cli import POLICY, Serve

SLACK = 10.0  # seconds an answer may take on a busy machine
SETTLE = 1.0  # seconds without a byte after a whole answer: the connection is kept open

#: uvicorn's answer to what its parser refuses (``httptools_impl.send_400_response``).
INVALID = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 30\r\n"
           b"connection: close\r\n\r\nInvalid HTTP request received.")


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_front()


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Serve]]:
    """Both HTTP doors, on the default bounds, side by side."""
    started: dict[str, Serve] = {}
    try:
        for front in ("python", "compiled"):
            directory = tmp_path_factory.mktemp(front)
            policy = directory / "policy.toml"
            policy.write_text(POLICY.replace("{basic}", "1000/hour"))
            server = Serve(directory, str(policy), "--watch", "0", "--workers", "1", "--http-front", front,
                           "--no-metrics")
            started[front] = server
            server.ready(1)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _whole(out: bytes) -> bool:
    head, sep, body = out.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length: *(\d+)\r$", head + b"\r\n")
    return len(body) >= (int(length.group(1)) if length else 0)


def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """``data`` sent on a new connection: everything answered, and whether the door closed the
    connection (else nothing came for ``SETTLE`` seconds after a whole answer)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SLACK)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before all of it was sent
        sock.sendall(data)
    out = b""
    try:
        while True:
            if _whole(out):
                sock.settimeout(SETTLE)
            chunk = sock.recv(65536)
            if not chunk:
                return out, True
            out += chunk
    except TimeoutError:
        return out, False
    except ConnectionResetError:  # closed with bytes unread (uvicorn): the answer came first
        return out, True
    finally:
        sock.close()


_TIMES = [  # seconds to the window's end: the same on both doors but for a second boundary between them
    (re.compile(rb";t=\d+"), b";t=T"),
    (re.compile(rb"(x-ratelimit-reset|retry-after): \d+"), rb"\1: T"),
    (re.compile(rb'"(reset|retry_after)": [\d.]+'), rb'"\1": T'),
    (re.compile(rb'"(x-ratelimit-reset|retry-after)": "\d+"'), rb'"\1": "T"'),
]


def _normal(answer: tuple[bytes, bool]) -> tuple[bytes, bool]:
    out, closed = answer
    timed = b'"reset": ' in out  # a body with times in it: its length varies with them
    for pattern, replacement in _TIMES:
        out = pattern.sub(replacement, out)
    if timed:
        out = re.sub(rb"content-length: \d+", b"content-length: N", out)
    return out, closed


def _both(doors: dict[str, Serve], data: bytes) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
    python, compiled = (_normal(_exchange(doors[front].port, data)) for front in ("python", "compiled"))
    return python, compiled


def _check(key: str, *, version: bytes = b"1.1", extra: bytes = b"", method: bytes = b"GET",
           target: bytes = b"/check", ends: bytes = b"\r\n") -> bytes:
    lines = [method + b" " + target + b" HTTP/" + version, b"Host: x", b"X-Original-URI: /api/items",
             b"X-API-Key: " + key.encode()]
    return ends.join(lines) + ends + extra + ends


_POST = b"POST /v1/check HTTP/1.1\r\nHost: x\r\n"
_CHECK = b'{"path": "/api/items"}'

#: What both doors answer alike (the python door's answer asserted: ``INVALID``, or ``None``: served).
PARITY: dict[str, tuple[bytes, bytes | None]] = {
    "lower-case method": (_check("lower", method=b"get"), INVALID),
    "unknown method": (_check("foo", method=b"FOO"), INVALID),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", INVALID),
    "no HTTP at all": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, INVALID),
    "bare LF line ends": (_check("lf", ends=b"\n"), INVALID),
    "one bare LF": (_check("lf1", extra=b"X-A: 1\nX-B: 2\r\n"), INVALID),
    "Transfer-Encoding and Content-Length": (
        _POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", INVALID),
    "Content-Length and Transfer-Encoding on /check": (
        _check("clte", extra=b"Content-Length: 0\r\nTransfer-Encoding: chunked\r\n") + b"0\r\n\r\n", INVALID),
    "Content-Length twice": (_POST + b"Content-Length: 22\r\nContent-Length: 22\r\n\r\n" + _CHECK, INVALID),
    "Transfer-Encoding chunked twice": (
        _POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", INVALID),
    "white space after a chunk size": (_POST + b"Transfer-Encoding: chunked\r\n\r\n2 \r\n{}\r\n0\r\n\r\n", INVALID),
    "white space in a chunk extension": (
        _POST + b"Transfer-Encoding: chunked\r\n\r\n2; a=b\r\n{}\r\n0\r\n\r\n", INVALID),
    "a trailer with no colon": (_POST + b"Transfer-Encoding: chunked\r\n\r\n0\r\nbad\r\n\r\n", INVALID),
    # hyper's own answers (it sends them without a body)
    "space in the target (hyper's 400)": (_check("space", target=b"/ch eck"), INVALID),
    "Content-Length not a number (hyper's 400)": (_POST + b"Content-Length: 2x\r\n\r\n{}", INVALID),
    "head over twice the bound (hyper's 431)": (
        _check("big", extra=b"X-Big: " + b"a" * (3 * bounds.HTTP_MAX_HEADER_SIZE) + b"\r\n"),
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\ncontent-length: 84\r\n"
        b'connection: close\r\n\r\n{"status": 431, "error": '
        b'"the request line and headers are larger than 65536 bytes"}'),
    "target over 65,535 bytes (hyper's 414)": (_check("long", target=b"/check?" + b"a" * 65533), INVALID),
    # HTTP/1.0 (nginx's auth_request speaks it by default) and Connection: close
    "HTTP/1.0 /check": (_check("http10", version=b"1.0"), None),
    "HTTP/1.0 /v1/check": (
        b"POST /v1/check HTTP/1.0\r\nContent-Length: 22\r\nConnection: keep-alive\r\n\r\n" + _CHECK, None),
    "HTTP/1.0 /healthz": (b"GET /healthz HTTP/1.0\r\n\r\n", None),
    "Connection: close on /check": (_check("close", extra=b"Connection: close\r\n"), None),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_odd_requests_are_answered_as_the_python_door(doors: dict[str, Serve], case: str) -> None:
    request, expected = PARITY[case]
    python, compiled = _both(doors, request)
    if expected is None:
        assert python[0].startswith(b"HTTP/1.1 200 OK\r\n") and python[1], python
    else:
        assert python == (expected, True)
    assert compiled == python
    # the door goes on: a normal check answers alike
    python, compiled = _both(doors, _check(f"after {case}", extra=b"Connection: close\r\n"))
    assert python[0].startswith(b"HTTP/1.1 200 OK\r\n") and python[1]
    assert compiled == python


def test_a_request_smuggled_behind_te_and_cl_is_never_answered(doors: dict[str, Serve]) -> None:
    smuggled = _check("smuggled", target=b"/check?deny_status=403")
    request = _POST + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % 5 + smuggled
    python, compiled = _both(doors, request)
    assert python == (INVALID, True)
    assert compiled == (INVALID, True)  # one answer, the refusal: the request after the chunks was never read


#: What the compiled door answers where it differs from the python door (docs/security.md, the
#: compiled HTTP front door's row): the request, the compiled door's answer (``None``: served, 200), and
#: whether the python door's answer is asserted to differ (it is not where it depends on its reads).
DIFFERENCES: dict[str, tuple[bytes, bytes | None, bool]] = {
    "HTTP/2.0 in the request line": (_check("v2", version=b"2.0"), INVALID, True),
    "HTTP/0.9 request line": (b"GET /check\r\nX-Original-URI: /api/items\r\n\r\n", INVALID, True),
    "two spaces after the method": (_check("spaces", method=b"GET "), INVALID, True),
    'a " in the target': (_check("quote", target=b'/check?a="b"'), INVALID, True),
    "< or > in the target": (_check("angle", target=b"/check?a=<b>"), INVALID, True),
    "CONNECT": (_check("connect", method=b"CONNECT"), INVALID, True),
    "HTTP/1.0 with a chunked body": (
        b"POST /v1/check HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n16\r\n" + _CHECK + b"\r\n0\r\n\r\n",
        INVALID, True),
    "more than 1,000 header lines": (
        _check("many", extra=b"".join(b"X-%d: v\r\n" % n for n in range(1001))),
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\ncontent-length: 71\r\n"
        b'connection: close\r\n\r\n{"status": 431, "error": "the request has more than 1000 header lines"}', True),
    "a target of exactly 65,535 bytes": (b"GET /check?" + b"a" * 65529 + b" HTTP/1.1\r\n\r\n", INVALID, False),
    "a WebSocket upgrade": (_check("ws", extra=b"Connection: Upgrade\r\nUpgrade: websocket\r\n"), None, True),
}


def test_the_documented_differences(doors: dict[str, Serve]) -> None:
    for case, (request, answer, differs) in DIFFERENCES.items():
        python, compiled = _both(doors, request)
        if answer is None:
            assert compiled[0].startswith(b"HTTP/1.1 200 OK\r\n"), (case, compiled)
        else:
            assert compiled == (answer, True), case
        if differs:
            assert python != compiled, (case, python)


def _idle_for(port: int, key: str) -> float:
    """Seconds a kept-alive connection stays open after its answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SLACK)
    try:
        sock.sendall(_check(key))
        out = b""
        while not _whole(out):
            chunk = sock.recv(65536)
            assert chunk, out
            out += chunk
        answered = time.monotonic()
        assert out.startswith(b"HTTP/1.1 200 OK\r\n"), out
        sock.settimeout(bounds.HTTP_TIMEOUT_KEEP_ALIVE + SLACK)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(65536) == b""
        return time.monotonic() - answered
    finally:
        sock.close()


def test_an_idle_connection_closes_keep_alive_seconds_after_its_answer(doors: dict[str, Serve]) -> None:
    idle: dict[str, float] = {}

    def measure(front: str) -> None:
        idle[front] = _idle_for(doors[front].port, f"idle {front}")

    threads = [threading.Thread(target=measure, args=(front,)) for front in doors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keep_alive = bounds.HTTP_TIMEOUT_KEEP_ALIVE
    for front, seconds in idle.items():
        assert keep_alive - 0.5 <= seconds <= keep_alive + 1, (front, idle)
