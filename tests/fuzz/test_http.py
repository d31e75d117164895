"""Fuzzing the HTTP check API on both running HTTP doors (compiled: hyper in ``ratewarden._front``;
python: uvicorn), over raw sockets (an HTTP client would refuse to send most of it): random header
names and values on ``/check`` (any byte a request line or header can carry, and some it cannot),
random JSON and broken JSON as ``/v1/check`` and ``/json`` bodies.

Every request is answered with a status of the expected set (never a 500), or, when it is no HTTP
at all, a 400 or the close; the door answers a normal check afterwards.
"""

from __future__ import annotations

import itertools
import json
import socket
import string
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from .conftest import fuzz
from .doors import HOST, PROBE_KEY, SLACK, Door, Hang

#: ``/check``: allowed, refused (429, or the 401/403 ``deny_status`` asks for), a description it cannot
#: use (400), headers over the bound (431).
CHECK_STATUSES = {200, 400, 401, 403, 429, 431}
#: ``/v1/check`` and ``/json``: answered (``/json``: 429 when over), a body it cannot use (400), too
#: large (413).
JSON_STATUSES = {200, 400, 413, 429}

# -- requests -------------------------------------------------------------------------------------------

_TCHAR = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
#: Headers that frame the request or change the connection: left to the HTTP servers' own tests (a
#: random Content-Length would only make the door wait for a body).
_FRAMING = {"content-length", "transfer-encoding", "connection", "expect", "upgrade", "host", "te", "trailer",
            "keep-alive", "http2-settings"}
_KNOWN = ["X-Original-URI", "X-Original-Method", "X-Forwarded-Uri", "X-Forwarded-Method", "X-Forwarded-Proto",
          "X-Real-IP", "X-Forwarded-For", "X-API-Key", "Authorization", "X-User", "Cookie", "Forwarded"]

_names = st.one_of(st.sampled_from(_KNOWN), st.text(_TCHAR, min_size=1, max_size=24)).filter(
    lambda n: n.lower() not in _FRAMING)
#: What a header value may carry: visible ASCII, spaces and tabs inside, obs-text (0x80-0xFF).
_VALUE_BYTES = bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100))
_values = st.one_of(
    st.binary(max_size=60).map(lambda b: bytes(_VALUE_BYTES[c % len(_VALUE_BYTES)] for c in b)),
    st.builds(lambda a, b: a + b" \t " + b, st.text(_TCHAR, max_size=10).map(str.encode),
              st.text(_TCHAR, max_size=10).map(str.encode)),
    st.sampled_from([b"/api/items", b"/login", b"/health", b"api/no-slash", b"/api/%ff%00", b"POST", b"G T",
                     b"https", b"1.2.3.4", b"::1", b"[::1]:80", b"fe80::1%eth0", b"Bearer pk-probe", b"pk-small",
                     b"/" + b"a" * 3000, b"10.0.0.1, 2001:db8::1"]),
    st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
#: Bytes no header may carry (the servers answer 400, or close).
_bad_values = st.builds(lambda v, bad, at: v[:at] + bad + v[at:], _values, st.sampled_from([b"\x00", b"\x01", b"\x7f",
                        b"\r", b"\n", b"\r\nX: y"]), st.integers(0, 8))
_bad_names = st.one_of(st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass") + b"("),
                       st.sampled_from([b"", b" X", b"X Y", b"X:Y", b"\xff", b"X\x00"]))
_queries = st.one_of(st.just(b""), st.sampled_from([b"?deny_status=403", b"?deny_status=401", b"?deny_status=500",
                                                     b"?deny_status=", b"?deny_status=%ff", b"?api_key=pk-small"]),
                     st.text(_TCHAR + "=&%", max_size=30).map(lambda q: b"?" + q.encode()))


def head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b"",
         chunks: list[int] | None = None) -> bytes:
    """The request's bytes: the body with its Content-Length, or chunked at the offsets ``chunks``."""
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: fuzz", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    if chunks is not None:
        lines.append(b"Transfer-Encoding: chunked")
        cuts = sorted({0, len(body), *(c for c in chunks if 0 < c < len(body))})
        parts = [body[a:b] for a, b in itertools.pairwise(cuts)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    elif body or method == b"POST":
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(door: Door, request: bytes) -> tuple[int | None, bytes]:
    """Send ``request`` on a new connection and read until the door closes it: ``(status, body)``,
    ``(None, b"")`` when it closed without an answer."""
    with socket.create_connection((HOST, door.http_port), timeout=SLACK) as sock:
        answer = b""
        try:
            sock.sendall(request)
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed with the request unread: the answer may be lost
        except TimeoutError:
            raise Hang(f"no answer and no close within {SLACK:g} s (read so far: {answer[:200]!r})") from None
    if not answer:
        return None, b""
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    status = int(answer[9:12])
    body = answer.partition(b"\r\n\r\n")[2]
    return status, body


def probe(door: Door) -> None:
    """A normal check is answered 200: the door is alive and serving."""
    status, _ = exchange(door, head(b"GET", b"/check", [(b"X-Original-URI", b"/api/items"), (b"X-API-Key", PROBE_KEY.encode())]))
    assert status == 200, status
    door.alive()


def no_500(status: int | None, body: bytes) -> None:
    assert status != 500, body[:500]


# -- /check -----------------------------------------------------------------------------------------------


def test_check_with_random_headers(door: Door) -> None:
    """Well-formed requests with any header names and values: a status of ``CHECK_STATUSES``."""

    @fuzz(200)
    @given(st.lists(st.tuples(_names.map(str.encode), _values), max_size=8), _queries)
    def property(headers: list[tuple[bytes, bytes]], query: bytes) -> None:
        request = head(b"GET", b"/check" + query, headers)
        with door.guard(request):
            status, body = exchange(door, request)
            no_500(status, body)
            assert status in CHECK_STATUSES, (status, body[:300])
            probe(door)

    property()


def test_check_with_malformed_headers(door: Door) -> None:
    """Header lines no server may accept (control bytes, bad names, bare CR or LF): a 400, or the
    connection closed unanswered; never a 500, and the door goes on."""

    @fuzz(100)
    @given(st.lists(st.tuples(_names.map(str.encode), _values), max_size=3),
           st.one_of(st.tuples(_names.map(str.encode), _bad_values), st.tuples(_bad_names, _values)))
    def property(headers: list[tuple[bytes, bytes]], bad: tuple[bytes, bytes]) -> None:
        request = head(b"GET", b"/check", [*headers, bad])
        with door.guard(request):
            status, body = exchange(door, request)
            no_500(status, body)
            assert status in {None, *CHECK_STATUSES}, (status, body[:300])
            probe(door)

    property()


# -- /v1/check and /json bodies ----------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                     st.text(max_size=20))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_check_fields = st.fixed_dictionaries({}, optional={
    "method": st.one_of(st.sampled_from(["GET", "POST", "G T", "", "get"]), _json),
    "path": st.one_of(st.sampled_from(["/api/items", "/login", "/x?api_key=pk-small", "api/x", "/%ff", ""]),
                      st.text(max_size=30), _json),
    "headers": st.one_of(st.dictionaries(st.one_of(st.sampled_from(_KNOWN), st.text(max_size=10)),
                                         st.one_of(st.text(max_size=20), _json), max_size=4), _json),
    "client": st.one_of(st.sampled_from(["1.2.3.4", "::1", "[::1]:80", "fe80::1%eth0", "1.2.3.4:5", "x"]), _json),
    "cost": st.one_of(st.sampled_from([0, 1, 2.5, -1, 10**9, 10**30, 1e308]), _json),
})
_rls_fields = st.fixed_dictionaries({}, optional={
    "domain": st.one_of(st.just("fuzz"), st.text(max_size=10), _json),
    "descriptors": st.one_of(st.lists(st.fixed_dictionaries({}, optional={
        "entries": st.one_of(st.lists(st.fixed_dictionaries({}, optional={
            "key": st.one_of(st.sampled_from(["user", "small", "open", "free"]), _json),
            "value": st.one_of(st.text(max_size=10), _json)}), max_size=3), _json),
        "limit": st.one_of(st.fixed_dictionaries({}, optional={
            "requests_per_unit": st.one_of(st.integers(-1, 2**33), _json),
            "unit": st.one_of(st.sampled_from(["SECOND", "HOUR", "UNKNOWN", "DECADE", 3, 99]), _json)}), _json),
        "hits_addend": st.one_of(st.integers(-1, 2**65), st.sampled_from(["18446744073709551615", "1e3"]), _json),
    }), max_size=3), _json),
    "hits_addend": st.one_of(st.integers(-1, 2**33), _json),
})


def _broken(text: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from([text[:cut] for cut in range(len(text))]).map(str.encode)


_not_json = st.one_of(
    st.binary(max_size=60),
    _broken('{"path": "/api/items", "headers": {"X-API-Key": "pk-small"}, "cost": 2}'),
    st.sampled_from([b"[" * 5000, b'{"a":' * 3000, b"NaN", b'{"path": "/x", "cost": NaN}', b'{"path": "/x", "cost": Infinity}',
                     b"1" * 5000, b'{"path": "/x", "cost": ' + b"9" * 5000 + b"}", b'{"path": "\\ud800"}', b"\xef\xbb\xbf{}",
                     b'{"path": "/x"}' + b" " * 10 + b"x", b'{"path": "/x", "path": 1}', b'"\\u0000"']),
)


def _bodies(fields: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    return st.one_of(fields.map(lambda d: json.dumps(d).encode()), fields.map(lambda d: json.dumps(d).encode()),
                     _json.map(lambda v: json.dumps(v).encode()), _not_json)


#: Sent with a Content-Length, or chunked (at random offsets: the servers collect the body).
_chunked = st.one_of(st.none(), st.lists(st.integers(0, 200), max_size=5))


def _posted(door: Door, path: bytes, body: bytes, chunks: list[int] | None) -> None:
    request = head(b"POST", path, [(b"Content-Type", b"application/json")], body, chunks)
    with door.guard(request):
        status, answer = exchange(door, request)
        no_500(status, answer)
        assert status in JSON_STATUSES, (status, answer[:300])
        decoded = json.loads(answer)  # every answer of these endpoints is JSON, errors too
        assert isinstance(decoded, dict), decoded
        if path == b"/v1/check" and status == 200:
            assert isinstance(decoded["allowed"], bool) and isinstance(decoded["status"], int), decoded
        elif status == 400:
            assert decoded.get("error"), decoded
        probe(door)


def test_v1_check_with_random_bodies(door: Door) -> None:
    @fuzz(200)
    @given(_bodies(_check_fields), _chunked)
    def property(body: bytes, chunks: list[int] | None) -> None:
        _posted(door, b"/v1/check", body, chunks)

    property()


def test_json_rls_with_random_bodies(door: Door) -> None:
    """``POST /json`` (Envoy's ``ShouldRateLimit`` as JSON) reads the network too."""

    @fuzz(100)
    @given(_bodies(_rls_fields), _chunked)
    def property(body: bytes, chunks: list[int] | None) -> None:
        _posted(door, b"/json", body, chunks)

    property()
