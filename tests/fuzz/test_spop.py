"""Fuzzing the SPOP codec (HAProxy's SPOE): random and mutated frames sent after a valid HELLO to both
running SPOE agents (compiled and python), every truncation of a valid conversation, and the pure
Python codec (``ratewarden.serve.spop``) on its own.

The agents must answer each complete frame with an ACK (a NOTIFY, its ``status`` never 500) or end the
connection with an AGENT-DISCONNECT carrying a status code and a message (or just close it); a frame
left unfinished is ended by the frame timeout; and a new connection's HELLO and NOTIFY are still
answered afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.serve import spop
from tests.serve.test_spoe import (
    ACK,
    AGENT_DISCONNECT,
    AGENT_HELLO,
    HAPROXY_DISCONNECT,
    HAPROXY_HELLO,
    NOTIFY,
    Received,
    frame,
    hdrs_bin,
    hello,
    kv,
    notify,
    string,
    unvarint,
    varint,
)

from .conftest import fuzz
from .doors import (
    HOST,
    PROBE_KEY,
    SLACK,
    SPOE_TIMEOUT_FRAME,
    SPOE_TIMEOUT_HELLO,
    SPOE_TIMEOUT_IDLE,
    Door,
    Hang,
)

MAX_FRAME = 16380  # what our HELLO asks for, and the agents' own bound

# -- what is sent ---------------------------------------------------------------------------------------

_uint64 = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.sampled_from([239, 240, 2287, 2288, 2**32, 2**64 - 1]))
_text = st.one_of(st.text(max_size=30), st.sampled_from(["/api/items", "/login", "/health", "GET", "POST", "", "/"]))
_raw = st.binary(max_size=40)


def _typed(kind: int, body: bytes) -> bytes:
    return bytes((kind,)) + body


_headers = st.one_of(
    st.dictionaries(st.sampled_from(["X-API-Key", "Authorization", "X-User", "Host", "X-Real-IP"]) | st.text(max_size=10),
                    st.sampled_from([PROBE_KEY, "pk-small", "Bearer pk-probe", "1.2.3.4"]) | st.text(max_size=20),
                    max_size=4).map(hdrs_bin),
    st.lists(st.tuples(_raw, _raw), max_size=4).map(lambda pairs: b"".join(string(n) + string(v) for n, v in pairs)),
    st.builds(lambda n: string(b"x-api-key") + varint(n) + b"pk", _uint64),  # a value's length past the end
    _raw,
)

#: A typed value's bytes: each of SPOE.txt's types with random content, or a random type byte.
typed_values = st.one_of(
    st.just(b"\x00"),
    st.sampled_from([b"\x01", b"\x11", b"\x21", b"\xf1"]),
    st.builds(lambda kind, value: _typed(kind, varint(value)), st.sampled_from([2, 3, 4, 5, 0x13, 0xf4]), _uint64),
    st.builds(lambda b: _typed(6, b), st.binary(min_size=4, max_size=4)),
    st.builds(lambda b: _typed(7, b), st.binary(min_size=16, max_size=16)),
    st.builds(lambda t: _typed(8, string(t.encode("utf-8", "surrogatepass"))), _text),
    st.builds(lambda b: _typed(8, string(b)), _raw),
    st.builds(lambda b: _typed(9, string(b)), st.one_of(_raw, _headers)),
    st.builds(lambda kind, n, b: _typed(kind, varint(n) + b), st.sampled_from([8, 9]), _uint64, _raw),  # any length
    st.builds(lambda kind, rest: bytes((kind,)) + rest, st.integers(0, 255), st.binary(max_size=8)),
)

_ARGS = ["method", "uri", "path", "query", "headers", "ip", "ssl"]
_argument = st.tuples(st.one_of(st.sampled_from(_ARGS), _text), typed_values)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """One message of a NOTIFY payload: its name, an argument count (right, or not) and arguments."""
    name = draw(st.one_of(st.just("check"), _text))
    args = draw(st.lists(_argument, max_size=7))
    count = draw(st.one_of(st.just(len(args)), st.just(len(args)), st.just(len(args)), st.integers(0, 255)))
    encoded = b"".join(string(n.encode("utf-8", "surrogatepass")) + v for n, v in args)
    return string(name.encode("utf-8", "surrogatepass")) + bytes((count,)) + encoded


_flags = st.one_of(st.just(1), st.just(1), st.just(3), st.sampled_from([0, 2, 0xFFFFFFFF]), st.integers(0, 2**32 - 1))
_notify = st.builds(lambda payload, stream, frame_id, flags: frame(NOTIFY, payload, stream, frame_id, flags),
                    st.lists(messages(), max_size=3).map(b"".join), _uint64, _uint64, _flags)
_valid_notify = st.builds(
    lambda stream, frame_id, uri, headers: notify(stream, frame_id, uri=uri, headers=headers),
    _uint64, _uint64, st.sampled_from(["/api/items", "/login", "/x", "api/no-slash"]),
    st.dictionaries(st.sampled_from(["X-API-Key", "X-User"]), st.text(max_size=12), max_size=2),
)
_other_frame = st.one_of(
    st.builds(lambda message: frame(HAPROXY_DISCONNECT, kv(status_code=0, message=message)), st.text(max_size=10)),
    st.builds(lambda kind, payload: frame(kind, payload, 1, 1), st.integers(0, 255), _raw),
    st.just(hello()),
)
#: NOTIFY frames, valid or random, then (or not) a frame of another kind.
frames = st.builds(lambda notifies, last: [*notifies, *last], st.lists(st.one_of(_valid_notify, _notify, _notify),
                   min_size=1, max_size=3), st.lists(_other_frame, max_size=1))


@dataclass(frozen=True)
class Mutation:
    """One change to the bytes sent: ``kind`` at ``where`` (a fraction of the length)."""

    kind: str
    where: float
    data: bytes

    def apply(self, data: bytes) -> bytes:
        at = int(self.where * len(data))
        if self.kind == "flip" and data:
            at = min(at, len(data) - 1)
            return data[:at] + bytes((data[at] ^ (self.data[0] if self.data else 0xFF),)) + data[at + 1:]
        if self.kind == "insert":
            return data[:at] + self.data
        if self.kind == "delete":
            return data[:at] + data[at + 1 + len(self.data):]
        if self.kind == "replace":
            return data[:at] + self.data + data[at + len(self.data):]
        if self.kind == "length" and len(data) >= 4:  # a frame's length field: the first 4 bytes
            return struct.pack(">I", int.from_bytes(self.data[:4].rjust(4, b"\x00"), "big")) + data[4:]
        return data


_mutation = st.builds(Mutation, st.sampled_from(["flip", "insert", "delete", "replace", "length"]), st.floats(0, 1),
                      st.binary(min_size=1, max_size=6))
#: No change (a third of the time: the random frames as drawn), or up to three.
mutations = st.one_of(st.just([]), st.lists(_mutation, min_size=1, max_size=3))


def complete(data: bytes, limit: int = MAX_FRAME) -> list[bytes]:
    """``data`` cut into frames by their length fields, the last one finished (zeros added) so that
    every frame the agent reads is whole; a length over ``limit`` ends it (the agent reads no more)."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        head = data[at:at + 4].ljust(4, b"\x00")
        length = int.from_bytes(head, "big")
        if length > limit:
            out.append(head)
            break
        body = data[at + 4:at + 4 + length].ljust(length, b"\x00")
        out.append(head + body)
        at += 4 + length
    return out


def ids_of(chunks: list[bytes]) -> set[tuple[int, int]]:
    """The (stream id, frame id) of every chunk the Python codec reads as a frame."""
    found = set()
    for chunk in chunks:
        with contextlib.suppress(spop.SpopError):
            parsed = spop.read_frame(chunk[4:])
            found.add((parsed.stream_id, parsed.frame_id))
    return found


# -- a blocking SPOP client with a deadline ------------------------------------------------------------


class Conversation:
    """One connection; every read is bounded (a hang fails the test rather than stalling it)."""

    def __init__(self, door: Door) -> None:
        self.sock = socket.create_connection((HOST, door.spoe_port), timeout=SLACK)
        self.buffer = b""
        self.reset = False

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # the agent already closed: its answer is read next
            self.reset = True

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:  # closed with our bytes unread: the DISCONNECT may be lost
            self.reset = True
            return False
        except TimeoutError:
            raise Hang(f"no answer and no close within {SLACK:g} s") from None
        self.buffer += chunk
        return bool(chunk)

    def read(self) -> Received | None:
        """The next frame, ``None`` when the agent closed the connection."""
        while len(self.buffer) < 4 or len(self.buffer) < 4 + int.from_bytes(self.buffer[:4], "big"):
            if not self._fill():
                assert not self.buffer or self.reset, f"the agent closed inside a frame: {self.buffer!r}"
                return None
        length = int.from_bytes(self.buffer[:4], "big")
        data, self.buffer = self.buffer[4:4 + length], self.buffer[4 + length:]
        assert len(data) >= 7, f"the agent sent a frame of {len(data)} bytes"
        kind, flags = struct.unpack_from(">BI", data)
        stream, at = unvarint(data, 5)
        frame_id, at = unvarint(data, at)
        return Received(kind, flags, stream, frame_id, data[at:])

    def closed(self) -> bool:
        return self.read() is None

    def close(self) -> None:
        self.sock.close()


def disconnect_reason(answer: Received) -> tuple[int, str]:
    pairs = answer.pairs()
    status, message = pairs.get("status-code"), pairs.get("message")
    assert isinstance(status, int) and isinstance(message, str) and message, pairs
    return status, message


def converse(door: Door, chunks: list[bytes], notify_ids: set[tuple[int, int]]) -> list[int]:
    """Send ``chunks`` (a HELLO first) at once; read an answer per chunk until a DISCONNECT or the close.
    Returns what was read: the frame types, then -1 for the close."""
    conn = Conversation(door)
    seen: list[int] = []
    try:
        conn.send(b"".join(chunks))
        for _ in chunks:
            answer = conn.read()
            if answer is None:
                seen.append(-1)
                break
            seen.append(answer.kind)
            if answer.kind == AGENT_DISCONNECT:
                disconnect_reason(answer)
                assert conn.closed(), "the connection stayed open after AGENT-DISCONNECT"
                seen.append(-1)
                break
            if answer.kind == ACK:
                assert (answer.stream, answer.frame_id) in notify_ids, (answer.stream, answer.frame_id)
                variables = answer.variables()
                assert variables.get("status") != 500, variables
                assert isinstance(variables.get("status"), int), variables
            else:
                assert answer.kind == AGENT_HELLO and len(seen) == 1, seen
    finally:
        conn.close()
    return seen


def probe(door: Door) -> None:
    """A new connection's HELLO and NOTIFY are answered: the agent is alive and serving."""
    conn = Conversation(door)
    try:
        conn.send(hello() + notify(1, 1, headers={"X-API-Key": PROBE_KEY}))
        first, second = conn.read(), conn.read()
        assert first is not None and first.kind == AGENT_HELLO, first
        assert second is not None and second.kind == ACK and second.variables()["status"] == 200, second
    finally:
        conn.close()
    door.alive()


# -- the running agents -----------------------------------------------------------------------------------


def test_random_and_mutated_frames_after_a_valid_hello(door: Door) -> None:
    @fuzz(150)
    @given(frames, mutations)
    def property(sent: list[bytes], changes: list[Mutation]) -> None:
        data = b"".join(sent)
        for change in changes:
            data = change.apply(data)
        chunks = [hello(), *complete(data)]
        with door.guard(chunks):
            seen = converse(door, chunks, ids_of(chunks))
            assert seen[0] == AGENT_HELLO, seen
            probe(door)

    property()
    probe(door)


_HELLO_KEYS = ["supported-versions", "max-frame-size", "capabilities", "healthcheck", "engine-id"]
_hello_values = st.one_of(
    typed_values,
    st.builds(lambda t: _typed(8, string(t.encode("utf-8", "surrogatepass"))),
              st.sampled_from(["2.0", "2.0,1.0", " 2.0 ", "2", "2.", "1.0", "3.0", ",", "pipelining", "async", ""])),
    st.builds(lambda kind, n: _typed(kind, varint(n)), st.sampled_from([2, 3, 4, 5]),
              st.one_of(st.sampled_from([0, 255, 256, 1000, 16380, 16381, 65535]), _uint64)),
)
#: A HAPROXY-HELLO of random fields: the known ones (each maybe twice), of any type, and others.
_random_hello = st.lists(st.tuples(st.one_of(st.sampled_from(_HELLO_KEYS), _text), _hello_values), max_size=7).map(
    lambda pairs: frame(HAPROXY_HELLO, b"".join(string(k.encode("utf-8", "surrogatepass")) + v for k, v in pairs)))


def test_mutated_hellos(door: Door) -> None:
    """The first frame mutated, or of random fields: an AGENT-HELLO or an AGENT-DISCONNECT (or the
    close), never a hang; a NOTIFY after an AGENT-HELLO is answered."""

    @fuzz(80)
    @given(st.one_of(st.lists(_mutation, min_size=1, max_size=3).map(lambda changes: (hello(), changes)),
                     _random_hello.map(lambda first: (first, []))),
           st.lists(_valid_notify, max_size=2))
    def property(first: tuple[bytes, list[Mutation]], after: list[bytes]) -> None:
        data, changes = first
        for change in changes:
            data = change.apply(data)
        chunks = complete(data + b"".join(after))
        if not chunks:
            return
        with door.guard(chunks):
            seen = converse(door, chunks, ids_of(chunks))
            assert seen[0] in (AGENT_HELLO, AGENT_DISCONNECT, -1), seen
            probe(door)

    property()


def _cuts() -> list[tuple[str, bytes]]:
    """Every strict prefix of a valid conversation that ends inside a frame (its length field included):
    the agent waits for the rest, then must end the connection on its timeout."""
    whole_hello = hello()
    check = notify(7, 9, uri="/api/items", headers={"X-API-Key": PROBE_KEY})
    out = [(f"HELLO cut at {n}", whole_hello[:n]) for n in range(1, len(whole_hello))]
    out += [(f"NOTIFY cut at {n}", whole_hello + check[:n]) for n in range(1, len(check))]
    return out


async def _ended_by_timeout(port: int, data: bytes) -> tuple[float, list[bytes]]:
    """Send ``data``, then read every frame until the agent closes: (seconds it took, the frames)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(HOST, port)
    started = loop.time()
    frames: list[bytes] = []
    try:
        writer.write(data)
        await writer.drain()
        while True:
            try:
                head = await asyncio.wait_for(reader.readexactly(4), SLACK + SPOE_TIMEOUT_IDLE)
                frames.append(await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), SLACK))
            except (asyncio.IncompleteReadError, ConnectionResetError):
                break
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return loop.time() - started, frames


async def test_every_truncated_frame_is_ended_by_a_timeout(door: Door) -> None:
    """Every prefix of HELLO + NOTIFY that stops inside a frame, each on its own connection, all at
    once: each is answered by an AGENT-DISCONNECT status 2 (a timeout) and closed within the hello,
    idle or frame timeout (at most 1 s here) plus slack, and the agent serves afterwards."""
    cuts = _cuts()
    results = await asyncio.gather(*(_ended_by_timeout(door.spoe_port, data) for _, data in cuts))
    bound = max(SPOE_TIMEOUT_FRAME, SPOE_TIMEOUT_IDLE, SPOE_TIMEOUT_HELLO) + SLACK
    for (name, _), (took, got) in zip(cuts, results, strict=True):
        assert took < bound, (name, took)
        kinds = [f[0] for f in got]
        assert kinds and kinds[-1] == AGENT_DISCONNECT, (name, kinds)
        assert kinds[:-1] in ([], [AGENT_HELLO]), (name, kinds)
        last = Received(got[-1][0], 0, 0, 0, got[-1][7:])
        status, message = disconnect_reason(last)
        assert status == 2 and "within" in message, (name, status, message)
    await asyncio.to_thread(probe, door)


# -- the pure Python codec -----------------------------------------------------------------------------


_DECODERS: list[tuple[str, Callable[[bytes], object]]] = [
    ("read_frame", spop.read_frame),
    ("kv_list", spop.kv_list),
    ("messages", spop.messages),
    ("header_list", lambda data: list(spop.header_list(data))),
    ("decode_varint", lambda data: spop.decode_varint(data, 0)),
]


@fuzz(200)
@given(st.one_of(frames.map(b"".join), st.builds(lambda m: m, messages()), _headers, st.binary(max_size=64)), mutations)
def test_the_codec_raises_only_its_own_error(data: bytes, changes: list[Mutation]) -> None:
    """Every decoder of ``serve.spop``, on mutated valid encodings and random bytes (as a whole frame and
    from its 4th byte, a payload): a result or ``SpopError`` with a DISCONNECT status, nothing else."""
    for change in changes:
        data = change.apply(data)
    for name, decode in _DECODERS:
        for part in (data, data[4:], data[11:]):
            try:
                decode(part)
            except spop.SpopError as exc:
                assert exc.status in (3, 4, 10) and str(exc), (name, part, exc.status)


def test_complete_pads_a_cut_frame() -> None:
    """The helper above: a frame cut short is finished with zeros; an oversize length ends the list."""
    whole = frame(NOTIFY, b"abc", 1, 1)
    assert complete(whole[:-2]) == [whole[:-2] + b"\x00\x00"]
    assert complete(whole + struct.pack(">I", MAX_FRAME + 1) + b"x") == [whole, struct.pack(">I", MAX_FRAME + 1)]
    assert complete(b"\x00") == [b"\x00\x00\x00\x00"]
