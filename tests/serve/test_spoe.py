"""``ratewarden serve --spoe``: the SPOE agent over a real loopback socket, spoken to by a small
SPOP 2.0 client written here from HAProxy's ``doc/SPOE.txt`` (not with the module's encoders):
HELLO negotiation, the same decisions as ``/check``, exact counts with checks pipelined on one or
several connections, the ``ip`` argument believed only from trusted proxies, malformed frames
(AGENT-DISCONNECT with the status that says why), HAPROXY-DISCONNECT and a store that fails.

Every test runs against both agents, ``--spoe-front python`` (asyncio) and ``compiled``
(``ratewarden._front``), which must answer the same frames byte for byte."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ratewarden import Decision, Limit, Limiter, MemoryStore
from ratewarden.errors import StoreError
from ratewarden.policy import parse_policy
from ratewarden.serve import spoe
from ratewarden.serve.front_spoe import SPOE_FRONTS, CompiledSpoe, start_spoe_front
from ratewarden.serve.http import ServeApp
from ratewarden.serve.spoe import SpoeAgent, start_spoe
from ratewarden.steps import Await, Pause
from tests.front_door import require_compiled_front

POLICY = """
version = 1

[identity]
sources = ["header:X-API-Key", "bearer", "query:api_key"]
unknown_group = "basic"
anonymous_group = "anonymous"

[identity.keys]
"pk-alice" = "premium"
"cron" = "internal"

[groups.premium]
limits = "100/min"

[groups.basic]
limits = "5/min"

[groups.anonymous]
limits = "3/min"

[groups.internal]
unlimited = true

[[rules]]
path = "/health"
bypass = true

[[rules]]
name = "api"
path = "/api/**"
tiered = true
"""

NOW = 1_000_000.0  # a fixed clock: windows never roll over during a test

#: The agent ``serving`` and ``start_agent`` start (``spoe_front`` sets it for each test).
FRONT = {"name": "python"}


@pytest.fixture(params=SPOE_FRONTS)
def spoe_front(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each SPOE front door in turn (the compiled one required where it could be built)."""
    if request.param == "compiled":
        require_compiled_front()
    FRONT["name"] = request.param
    yield request.param
    FRONT["name"] = "python"


@pytest.fixture(autouse=True)
def _every_front(spoe_front: str) -> None:
    """This module's tests run on both front doors."""


Started = asyncio.Server | CompiledSpoe


async def start_agent(app: ServeApp, sock: socket.socket, agent: SpoeAgent | None = None) -> Started:
    """The agent ``FRONT`` names, serving on ``sock`` (``stop_agent`` ends it)."""
    if FRONT["name"] == "compiled":
        return start_spoe_front(app, sock, agent)
    return await start_spoe(app, sock, agent)


async def stop_agent(server: Started, agent: SpoeAgent | None = None) -> None:
    """End what ``start_agent`` started, open connections included."""
    server.close()
    if isinstance(server, CompiledSpoe):
        await server.end()
        return
    if agent is not None:
        await agent.close()
    await server.wait_closed()


def _app(limiter: Limiter | None = None, **kwargs: Any) -> ServeApp:
    limiter = limiter or Limiter(MemoryStore(clock=lambda: NOW))
    return ServeApp(limiter, parse_policy(POLICY, "toml", "test.toml"), **kwargs)


# -- a SPOP client, from SPOE.txt ----------------------------------------------------------------------

HAPROXY_HELLO, HAPROXY_DISCONNECT, NOTIFY = 1, 2, 3
AGENT_HELLO, AGENT_DISCONNECT, ACK = 101, 102, 103
FIN = 1


def varint(value: int) -> bytes:
    if value < 240:
        return bytes((value,))
    out = [(value & 0xFF) | 0xF0]
    value = (value - 240) >> 4
    while value >= 128:
        out.append((value & 0xFF) | 0x80)
        value = (value - 128) >> 7
    out.append(value)
    return bytes(out)


def unvarint(data: bytes, at: int) -> tuple[int, int]:
    value = data[at]
    at += 1
    if value < 240:
        return value, at
    shift = 4
    while True:
        byte = data[at]
        at += 1
        value += byte << shift
        shift += 7
        if byte < 128:
            return value, at


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return varint(len(raw)) + raw


def typed(value: object) -> bytes:
    if value is None:
        return b"\x00"
    if isinstance(value, bool):
        return b"\x11" if value else b"\x01"
    if isinstance(value, int):
        return b"\x03" + varint(value)
    if isinstance(value, ipaddress.IPv4Address):
        return b"\x06" + value.packed
    if isinstance(value, ipaddress.IPv6Address):
        return b"\x07" + value.packed
    if isinstance(value, str):
        return b"\x08" + string(value)
    assert isinstance(value, bytes)
    return b"\x09" + string(value)


def untyped(data: bytes, at: int) -> tuple[object, int]:
    kind = data[at] & 0x0F
    at += 1
    if kind == 0:
        return None, at
    if kind == 1:
        return bool(data[at - 1] & 0x10), at
    if kind in (2, 3, 4, 5):
        return unvarint(data, at)
    if kind in (8, 9):
        length, at = unvarint(data, at)
        raw = data[at : at + length]
        return (raw.decode() if kind == 8 else raw), at + length
    raise AssertionError(f"the agent sent type {kind}")


def frame(kind: int, payload: bytes = b"", stream: int = 0, frame_id: int = 0, flags: int = FIN) -> bytes:
    body = struct.pack(">BI", kind, flags) + varint(stream) + varint(frame_id) + payload
    return struct.pack(">I", len(body)) + body


def kv(**pairs: object) -> bytes:
    return b"".join(string(name.replace("_", "-")) + typed(value) for name, value in pairs.items())


def hello(versions: str = "2.0", max_frame_size: int | None = 16380, healthcheck: bool = False) -> bytes:
    pairs: dict[str, object] = {"supported_versions": versions, "capabilities": "pipelining"}
    if max_frame_size is not None:
        pairs["max_frame_size"] = max_frame_size
    if healthcheck:
        pairs["healthcheck"] = True
    return frame(HAPROXY_HELLO, kv(**pairs))


def hdrs_bin(headers: dict[str, str]) -> bytes:
    """HAProxy's ``req.hdrs_bin``: name and value strings, up to an empty name and value."""
    return b"".join(string(n) + string(v) for n, v in headers.items()) + b"\x00\x00"


def notify(stream: int, frame_id: int, *, uri: str = "/api/items", method: str = "GET",
           headers: dict[str, str] | None = None, ip: object = None, **more: object) -> bytes:
    args: dict[str, object] = {"method": method, "uri": uri, "headers": hdrs_bin(headers or {}), **more}
    if ip is not None:
        args["ip"] = ip
    payload = string("check") + bytes((len(args),)) + b"".join(string(n) + typed(v) for n, v in args.items())
    return frame(NOTIFY, payload, stream, frame_id)


@dataclass
class Received:
    kind: int
    flags: int
    stream: int
    frame_id: int
    payload: bytes

    def pairs(self) -> dict[str, object]:
        out: dict[str, object] = {}
        at = 0
        while at < len(self.payload):
            length, at = unvarint(self.payload, at)
            name = self.payload[at : at + length].decode()
            out[name], at = untyped(self.payload, at + length)
        return out

    def variables(self) -> dict[str, object]:
        """An ACK's SET-VAR actions (all transaction-scoped), as name -> value."""
        assert self.kind == ACK
        out: dict[str, object] = {}
        at = 0
        while at < len(self.payload):
            action, count, scope = self.payload[at : at + 3]
            assert (action, count, scope) == (1, 3, 2)  # SET-VAR, 3 arguments, scope transaction
            length, at = unvarint(self.payload, at + 3)
            name = self.payload[at : at + length].decode()
            assert name not in out
            out[name], at = untyped(self.payload, at + length)
        return out


class Spop:
    """One connection to the agent, as HAProxy holds it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def read(self) -> Received:
        length = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), 5), "big")
        data = await asyncio.wait_for(self.reader.readexactly(length), 5)
        kind, flags = struct.unpack_from(">BI", data)
        stream, at = unvarint(data, 5)
        frame_id, at = unvarint(data, at)
        return Received(kind, flags, stream, frame_id, data[at:])

    async def closed(self) -> bool:
        """Whether the agent closed the connection (nothing more to read)."""
        return await asyncio.wait_for(self.reader.read(1), 5) == b""

    async def hello(self, max_frame_size: int = 16380) -> dict[str, object]:
        await self.send(hello(max_frame_size=max_frame_size))
        answer = await self.read()
        assert answer.kind == AGENT_HELLO
        return answer.pairs()

    async def acks(self, n: int) -> dict[tuple[int, int], dict[str, object]]:
        """The next ``n`` frames, all ACKs (each id once), by (stream id, frame id)."""
        out: dict[tuple[int, int], dict[str, object]] = {}
        for _ in range(n):
            answer = await self.read()
            assert answer.kind == ACK and answer.flags & FIN
            key = (answer.stream, answer.frame_id)
            assert key not in out, f"{key} answered twice"
            out[key] = answer.variables()
        return out

    async def check(self, stream: int = 1, frame_id: int = 1, **kwargs: Any) -> dict[str, object]:
        await self.send(notify(stream, frame_id, **kwargs))
        return (await self.acks(1))[(stream, frame_id)]

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()


Connect = Callable[[], Awaitable[Spop]]


@asynccontextmanager
async def serving(app: ServeApp) -> AsyncIterator[Connect]:
    """The agent on a loopback socket; yields a function opening connections to it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    server = await start_agent(app, sock)
    opened: list[Spop] = []

    async def connect() -> Spop:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append(Spop(reader, writer))
        return opened[-1]

    try:
        yield connect
    finally:
        for conn in opened:
            await conn.close()
        await stop_agent(server)
        for _ in range(200):  # the agent's side of the connections ends too
            if not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                break
            await asyncio.sleep(0.005)


# -- HELLO ---------------------------------------------------------------------------------------------


async def test_hello_negotiates_the_smaller_frame_size() -> None:
    async with serving(_app()) as connect:
        small = await connect()
        assert await small.hello(max_frame_size=4000) == {
            "version": "2.0", "max-frame-size": 4000, "capabilities": "pipelining"}
        assert (await small.check(headers={"X-API-Key": "pk-alice"}))["status"] == 200
        big = await connect()
        assert (await big.hello(max_frame_size=65532))["max-frame-size"] == 16380


async def test_healthcheck_closes_after_hello() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.send(hello(healthcheck=True))
        answer = await conn.read()
        assert answer.kind == AGENT_HELLO and answer.pairs()["version"] == "2.0"
        assert await conn.closed()


@pytest.mark.parametrize(
    ("first", "status"),
    [
        (hello(versions="1.0"), 8),
        (hello(versions="3.0,1.5"), 8),
        (hello(max_frame_size=None), 6),
        (frame(NOTIFY, b""), 4),  # the first frame must be HAPROXY-HELLO
        (frame(HAPROXY_HELLO, kv(supported_versions="2.0", max_frame_size=16380), flags=0), 10),
    ],
)
async def test_a_hello_the_agent_cannot_use(first: bytes, status: int) -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.send(first)
        answer = await conn.read()
        assert answer.kind == AGENT_DISCONNECT
        assert answer.pairs()["status-code"] == status and answer.pairs()["message"]
        assert await conn.closed()


# -- the decision: the one /check makes ------------------------------------------------------------------


async def _check_http(client: httpx.AsyncClient, uri: str, headers: dict[str, str], method: str = "GET") -> httpx.Response:
    return await client.get("/check", headers={"X-Original-URI": uri, "X-Original-Method": method, **headers})


VARIABLES = {"ratelimit": "ratelimit", "ratelimit_policy": "ratelimit-policy", "x_ratelimit_limit": "x-ratelimit-limit",
             "x_ratelimit_remaining": "x-ratelimit-remaining", "x_ratelimit_reset": "x-ratelimit-reset",
             "retry_after": "retry-after"}


async def test_notify_answers_what_check_answers() -> None:
    """The same requests to two apps with the same policy (and fixed clocks), one over HTTP
    ``/check``, one over SPOE: the same statuses, header values and bodies."""
    requests: list[tuple[str, str, dict[str, str]]] = (
        [("GET", "/api/items?page=2", {"X-API-Key": "trial-7"})] * 7  # basic: 5/min
        + [("POST", "/api/items", {"Authorization": "Bearer pk-alice"})] * 2  # premium
        + [("GET", "/api/a", {"X-API-Key": "cron"})]  # unlimited
        + [("GET", "/api/q?api_key=trial-8", {})] * 2  # the key in the query
        + [("GET", "/health", {})] + [("GET", "/elsewhere", {"X-API-Key": "trial-7"})]
        + [("GET", "/api/anon", {})] * 4  # anonymous: 3/min, by the client address
    )
    http_app, spoe_app = _app(), _app()
    transport = httpx.ASGITransport(app=http_app, client=("127.0.0.1", 40000))
    seen_refusal = False
    async with httpx.AsyncClient(transport=transport, base_url="http://rw") as client, serving(spoe_app) as connect:
        conn = await connect()
        await conn.hello()
        for index, (method, uri, headers) in enumerate(requests):
            expected = await _check_http(client, uri, {**headers, "X-Real-IP": "203.0.113.9"}, method)
            got = await conn.check(1, index, method=method, uri=uri, headers=headers,
                                   ip=ipaddress.IPv4Address("203.0.113.9"))
            assert got["status"] == expected.status_code, (index, uri, headers)
            for variable, header in VARIABLES.items():
                assert got.get(variable) == expected.headers.get(header), (index, variable)
            if expected.status_code >= 400:
                seen_refusal = True
                assert got["body"] == expected.text and got["content_type"] == expected.headers["content-type"]
                assert int(str(got["retry_after"])) > 0
            else:
                assert "body" not in got and "content_type" not in got
    assert seen_refusal


async def test_a_description_the_app_cannot_use_is_400_or_404_with_a_body() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        bad = await conn.check(uri="api/items")
        assert bad["status"] == 400 and "/" in str(bad["body"]) and bad["content_type"]
        bad = await conn.check(2, 1, method="G T")
        assert bad["status"] == 400 and bad["body"]
        assert (await conn.check(3, 1, headers={"X-API-Key": "pk-alice"}))["status"] == 200
    async with serving(ServeApp(Limiter(MemoryStore()))) as connect:  # no policy loaded
        conn = await connect()
        await conn.hello()
        none = await conn.check()
        assert none["status"] == 404 and "policy" in str(none["body"])


async def test_path_query_ssl_and_ipv6_arguments() -> None:
    """``path`` + ``query`` instead of ``uri``; ``ip`` as IPv6 and IPv4-mapped IPv6 (one client)."""
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        remaining = []
        for index, ip in enumerate([ipaddress.IPv4Address("198.51.100.4"),
                                    ipaddress.IPv6Address("::ffff:198.51.100.4")]):
            got = await conn.check(1, index, uri="", path="/api/x", query="api_key=trial-q", ssl=True, ip=ip)
            remaining.append(got["x_ratelimit_remaining"])
        assert remaining == ["4", "3"]  # the query's api_key counted (basic, 5/min)
        v6 = [await conn.check(2, i, uri="/api/anon", ip=ipaddress.IPv6Address("2001:db8::1")) for i in range(4)]
        assert [v["status"] for v in v6] == [200, 200, 200, 429]
        other = await conn.check(3, 1, uri="/api/anon", ip=ipaddress.IPv6Address("2001:db8:0:1::1"))  # another /64
        assert other["status"] == 200


# -- exact under concurrency ----------------------------------------------------------------------------


async def test_pipelined_checks_on_one_connection_are_exact() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        frames = [notify(stream, 1, headers={"X-API-Key": "pk-alice"}) for stream in range(1, 151)]
        await conn.send(*frames)
        acks = await conn.acks(150)
    assert set(acks) == {(stream, 1) for stream in range(1, 151)}
    assert Counter(a["status"] for a in acks.values()) == {200: 100, 429: 50}
    remaining = sorted(int(str(a["x_ratelimit_remaining"])) for a in acks.values() if a["status"] == 200)
    assert remaining == list(range(100))  # each count handed out once


async def test_checks_split_over_connections_are_exact() -> None:
    async with serving(_app()) as connect:
        conns = [await connect() for _ in range(3)]
        for conn in conns:
            await conn.hello()
        for part in range(5):  # interleaved: 10 frames per connection at a time
            for index, conn in enumerate(conns):
                await conn.send(*(notify(index + 1, part * 10 + i, headers={"X-API-Key": "pk-alice"}) for i in range(10)))
        answers = await asyncio.gather(*(conn.acks(50) for conn in conns))
    for index, acks in enumerate(answers):
        assert set(acks) == {(index + 1, i) for i in range(50)}
    statuses = Counter(a["status"] for acks in answers for a in acks.values())
    assert statuses == {200: 100, 429: 50}


async def test_more_checks_in_flight_than_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_IN_FLIGHT`` checks at once, the agent waits for one to finish: none lost."""
    monkeypatch.setattr(spoe, "MAX_IN_FLIGHT", 4)
    app = _app()
    decide = app.decide_steps
    running = 0
    most = 0

    def slow(*args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            yield Pause(0.001)
            return (yield from decide(*args, **kwargs))
        finally:
            running -= 1

    app.decide_steps = slow  # type: ignore[method-assign]
    async with serving(app) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(*(notify(7, i, headers={"X-API-Key": "pk-alice"}) for i in range(150)))
        acks = await conn.acks(150)
    assert set(acks) == {(7, i) for i in range(150)}
    assert Counter(a["status"] for a in acks.values()) == {200: 100, 429: 50}
    assert 1 < most <= 4


async def test_acks_come_back_as_checks_finish() -> None:
    """Pipelining: a slow check does not hold back the ACKs of the checks after it."""
    app = _app()
    decide = app.decide_steps
    release = asyncio.Event()

    def held(method: str, uri: str, *args: Any, **kwargs: Any) -> Any:
        if uri == "/api/slow":
            yield Await(release.wait(), "the test")
        return (yield from decide(method, uri, *args, **kwargs))

    app.decide_steps = held  # type: ignore[method-assign]
    async with serving(app) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(notify(1, 1, uri="/api/slow"), notify(2, 1), notify(3, 1))
        first = [await conn.read(), await conn.read()]
        assert {(f.stream, f.frame_id) for f in first} == {(2, 1), (3, 1)}
        release.set()
        last = await conn.read()
        assert (last.stream, last.frame_id) == (1, 1) and last.variables()["status"] == 200


# -- the client address ------------------------------------------------------------------------------


async def test_ip_argument_of_an_untrusted_peer_is_ignored() -> None:
    """The SPOE peer (127.0.0.1) is not a trusted proxy: the ``ip`` argument is not believed, every
    anonymous check counts against the peer's address."""
    claims = [ipaddress.IPv4Address(f"10.9.0.{i}") for i in range(1, 7)]
    async with serving(_app(trusted_proxies=["10.0.0.0/8"])) as connect:
        conn = await connect()
        await conn.hello()
        untrusted = [(await conn.check(1, i, uri="/api/anon", ip=ip))["status"] for i, ip in enumerate(claims)]
    assert untrusted == [200, 200, 200, 429, 429, 429]  # one anonymous count (3/min)
    async with serving(_app()) as connect:  # 127.0.0.1 trusted (the default): one count per address
        conn = await connect()
        await conn.hello()
        trusted = [(await conn.check(1, i, uri="/api/anon", ip=ip))["status"] for i, ip in enumerate(claims)]
    assert trusted == [200] * 6


async def test_ip_as_a_string_is_read_as_check_reads_x_real_ip() -> None:
    """An ``ip`` argument sent as a string (e.g. ``req.hdr(x-forwarded-for)``) from a trusted peer:
    an address counts as that client (normalised, with a port or IPv4-mapped); anything else is not
    believed and the peer's own address is the client, as ``/check`` does with ``X-Real-IP``."""
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        same = ["198.51.100.7", " 198.51.100.7:5555", "::ffff:198.51.100.7"]
        assert [(await conn.check(1, i, uri="/api/anon", ip=ip))["status"] for i, ip in enumerate(same)] == [200] * 3
        assert (await conn.check(1, 9, uri="/api/anon", ip=ipaddress.IPv4Address("198.51.100.7")))["status"] == 429
        junk = ["not an address", "evil; 1.2.3.4", "", "x" * 50]
        assert [(await conn.check(2, i, uri="/api/anon", ip=ip))["status"] for i, ip in enumerate(junk)] == [
            200, 200, 200, 429]  # one client: the peer, 127.0.0.1
        assert (await conn.check(3, 1, uri="/api/anon"))["status"] == 429  # no ip: the peer too


async def test_malformed_headers_argument_is_a_400_and_the_connection_goes_on() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        payload = (string("check") + b"\x02" + string("uri") + typed("/api/items")
                   + string("headers") + typed(string("x-api-key") + b"\x30pk"))  # a value past the end
        await conn.send(frame(NOTIFY, payload, 1, 1))
        bad = (await conn.acks(1))[(1, 1)]
        assert bad["status"] == 400 and bad["body"] and bad["content_type"]
        assert (await conn.check(2, 1, headers={"X-API-Key": "pk-alice"}))["status"] == 200


# -- malformed frames, DISCONNECT ---------------------------------------------------------------------


async def _disconnected(conn: Spop) -> int:
    """The AGENT-DISCONNECT the agent sends (after any ACKs), then the connection closes: its status."""
    while True:
        answer = await conn.read()
        if answer.kind != ACK:
            break
    assert answer.kind == AGENT_DISCONNECT, answer
    pairs = answer.pairs()
    assert isinstance(pairs["message"], str)
    assert await conn.closed()
    status = pairs["status-code"]
    assert isinstance(status, int)
    return status


async def test_an_oversize_frame_is_status_3() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello(max_frame_size=1000)
        big = notify(1, 1, headers={"X-Padding": "p" * 990})
        assert len(big) - 4 > 1000
        await conn.send(big)
        assert await _disconnected(conn) == 3
        oversize_hello = await connect()
        await oversize_hello.send(struct.pack(">I", 16381) + b"\x01" * 16381)
        assert await _disconnected(oversize_hello) == 3
        # the agent still answers new connections
        fresh = await connect()
        await fresh.hello(max_frame_size=1000)
        assert (await fresh.check())["status"] == 200


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 3) + b"\x03\x00\x00",  # shorter than a frame's header
        struct.pack(">I", 12) + b"\x03\x00\x00\x00\x01" + b"\xf0" * 7,  # an id cut inside its varint
        frame(NOTIFY, string("check") + b"\x02" + string("uri") + b"\x08\x30/api", 1, 1),  # a string past the end
        frame(NOTIFY, string("check") + b"\x01" + string("uri") + b"\x0c", 1, 1),  # type 12
        frame(NOTIFY, string("check"), 1, 1),  # no argument count
        frame(77, b"", 1, 1),  # no such frame type
        frame(HAPROXY_HELLO, kv(supported_versions="2.0", max_frame_size=16380)),  # a second HELLO
    ],
)
async def test_garbage_is_status_4(garbage: bytes) -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        assert (await conn.check(headers={"X-API-Key": "pk-alice"}))["status"] == 200
        await conn.send(garbage)
        assert await _disconnected(conn) == 4


async def test_a_fragmented_notify_is_status_10() -> None:
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        whole = notify(1, 1)
        await conn.send(whole[:4] + whole[4:5] + b"\x00\x00\x00\x00" + whole[9:])  # flags without FIN
        assert await _disconnected(conn) == 10


async def test_haproxy_disconnect_after_pending_checks() -> None:
    app = _app()
    decide = app.decide_steps

    def slow(*args: Any, **kwargs: Any) -> Any:
        yield Pause(0.05)
        return (yield from decide(*args, **kwargs))

    app.decide_steps = slow  # type: ignore[method-assign]
    async with serving(app) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(*(notify(1, i, headers={"X-API-Key": "pk-alice"}) for i in range(5)),
                        frame(HAPROXY_DISCONNECT, kv(status_code=0, message="normal")))
        acks = await conn.acks(5)  # every pending check answered before the AGENT-DISCONNECT
        assert set(acks) == {(1, i) for i in range(5)}
        assert all(a["status"] == 200 for a in acks.values())
        assert await _disconnected(conn) == 0


async def test_checks_still_deciding_when_their_connection_ends_are_cancelled() -> None:
    """HAProxy closing a connection with checks in flight: their decisions are cancelled (a store call
    not sent yet is never sent), so nothing is charged for checks nobody will read the answer of."""
    app = _app()
    decide = app.decide_steps
    release = asyncio.Event()
    started = cancelled = finished = 0

    async def wait_for_release() -> None:
        nonlocal cancelled
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise

    def held(*args: Any, **kwargs: Any) -> Any:
        nonlocal started, finished
        started += 1
        yield Await(wait_for_release(), "the test")
        answer = yield from decide(*args, **kwargs)
        finished += 1
        return answer

    app.decide_steps = held  # type: ignore[method-assign]
    async with serving(app) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(*(notify(1, i, headers={"X-API-Key": "pk-alice"}) for i in range(3)))
        for _ in range(500):
            if started == 3:
                break
            await asyncio.sleep(0.01)
        assert started == 3
        await conn.close()
        for _ in range(500):
            if cancelled == 3:
                break
            await asyncio.sleep(0.01)
        assert cancelled == 3
        release.set()
        app.decide_steps = decide  # type: ignore[method-assign]
        fresh = await connect()
        await fresh.hello()
        assert (await fresh.check(2, 1, headers={"X-API-Key": "pk-alice"}))["x_ratelimit_remaining"] == "99"
    assert finished == 0


async def test_a_refused_frame_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The connection a bad frame ends is logged (``spoe_error``, with why), by both agents."""
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(frame(77, b"", 1, 1))
        assert await _disconnected(conn) == 4
        for _ in range(500):
            if any(getattr(r, "event", None) == "spoe_error" for r in caplog.records):
                break
            await asyncio.sleep(0.01)
    logged = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "spoe_error"]
    assert logged == ["spoe: unexpected frame type 77; closing the connection"]


async def test_a_peer_that_leaves_its_acks_unread_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that pipelines checks and never reads its ACKs: once more than ``MAX_BUFFERED`` bytes of
    them wait (the kernel's buffers full), the connection is dropped, and others are served."""
    monkeypatch.setattr(spoe, "MAX_BUFFERED", 4096)
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        conn.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        batch = b"".join(notify(1, i, headers={"X-API-Key": "trial-9"}) for i in range(500))  # refusals: large ACKs
        dropped = False
        for _ in range(400):  # up to 200,000 checks; the kernel's buffers take a few thousand ACKs
            try:
                conn.writer.write(batch)
                await asyncio.wait_for(conn.writer.drain(), 30)
            except ConnectionError:  # reset: the agent dropped the connection (a timeout here fails the test)
                dropped = True
                break
        assert dropped
        fresh = await connect()
        await fresh.hello()
        assert (await fresh.check(headers={"X-API-Key": "pk-alice"}))["status"] == 200


# -- failures -------------------------------------------------------------------------------------------


class FlakyStore(MemoryStore):
    """A MemoryStore that fails every check while ``down``."""

    down = True

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        if self.down:
            raise StoreError("the store is down", reason="unreachable")
        return super().hit_now(keys, limits, costs)

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        if self.down:
            raise StoreError("the store is down", reason="unreachable")
        return super().hit_one(key, limit, cost)

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.hit_now(keys, limits, costs)


async def test_a_failing_store_closed_is_503_and_the_agent_keeps_serving() -> None:
    store = FlakyStore(clock=lambda: NOW)
    async with serving(_app(Limiter(store, on_error="closed"))) as connect:
        conn = await connect()
        await conn.hello()
        for i in range(3):
            failed = await conn.check(1, i, headers={"X-API-Key": "pk-alice"})
            assert failed["status"] == 503 and failed["body"] and failed["content_type"]
        store.down = False
        back = await conn.check(2, 1, headers={"X-API-Key": "pk-alice"})
        assert back["status"] == 200 and back["x_ratelimit_remaining"] == "99"


async def test_an_unexpected_error_is_status_500(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    calls = 0
    decide = app.decide_steps

    def broken(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return (yield from decide(*args, **kwargs))

    app.decide_steps = broken  # type: ignore[method-assign]
    async with serving(app) as connect:
        conn = await connect()
        await conn.hello()
        assert await conn.check(1, 1) == {"status": 500}
        assert (await conn.check(1, 2))["status"] == 200
    assert any(getattr(r, "event", None) == "check_failed" for r in caplog.records)


async def test_cancelled_connections_end_without_an_error(caplog: pytest.LogCaptureFixture, spoe_front: str) -> None:
    """Shutting down cancels the connections HAProxy keeps open: no "Unhandled exception" logged."""
    if spoe_front == "compiled":
        pytest.skip("the compiled agent's connections are no asyncio tasks (ended by CompiledSpoe.end)")
    async with serving(_app()) as connect:
        conn = await connect()
        await conn.hello()
        await conn.send(notify(1, 1))
        await conn.acks(1)
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert handlers
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await asyncio.sleep(0.01)  # the done callbacks run
        assert await conn.closed()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


# -- both front doors, byte for byte ----------------------------------------------------------------------

_BIG_URI = "/api/anon/" + "p" * 120  # a refusal whose body does not fit a 256-byte ACK: cut to its status
_CONVERSATIONS: dict[str, list[tuple[bytes, int]]] = {  # what is sent, then how many frames are read (-1: to EOF)
    "checks, a refusal, no message, bad headers, then DISCONNECT": [
        (hello(), 1),
        *[(notify(1, i, uri="/api/anon", headers={"X-Forwarded-For": "1.2.3.4"}), 1) for i in range(5)],
        (notify(2, 300, headers={"X-API-Key": "pk-alice"}, ssl=True, ip=ipaddress.IPv6Address("2001:db8::7")), 1),
        (frame(NOTIFY, string("other") + b"\x00", 3, 1), 1),
        (frame(NOTIFY, string("check") + b"\x01" + string("headers") + typed(b"\x05ab"), 4, 1), 1),
        (frame(NOTIFY, string("check") + b"\x01" + string("uri") + b"\x02\xf5\x81\x01", 5, 1), 1),  # an int32 uri
        (frame(HAPROXY_DISCONNECT, kv(status_code=0, message="bye")), -1),
    ],
    "an ACK cut to the frame size": [(hello(max_frame_size=256), 1),
                                     *[(notify(1, i, uri=_BIG_URI), 1) for i in range(5)], (b"", 0)],
    "health check": [(hello(healthcheck=True), -1)],
    "version 1.0": [(hello(versions="1.0, 1.5"), -1)],
    "a version quoted": [(hello(versions="it's 3"), -1)],
    "no max-frame-size": [(hello(max_frame_size=None), -1)],
    "max-frame-size 100": [(hello(max_frame_size=100), -1)],
    "NOTIFY first": [(frame(NOTIFY, b""), -1)],
    "a fragmented HELLO": [(frame(HAPROXY_HELLO, kv(supported_versions="2.0", max_frame_size=16380), flags=0), -1)],
    "an oversize HELLO": [(struct.pack(">I", 16381) + b"\x01" * 16381, -1)],
    "an oversize NOTIFY": [(hello(max_frame_size=1000), 1), (notify(1, 1, headers={"X-Padding": "p" * 990}), -1)],
    "a fragmented NOTIFY": [(hello(), 1), (frame(NOTIFY, string("check") + b"\x00", 1, 1, flags=0), -1)],
    "a short frame": [(hello(), 1), (struct.pack(">I", 3) + b"\x03\x00\x00", -1)],
    "an id cut in its varint": [(hello(), 1), (struct.pack(">I", 12) + b"\x03\x00\x00\x00\x01" + b"\xf0" * 7, -1)],
    "an 11-byte varint": [(hello(), 1), (struct.pack(">I", 18) + b"\x03\x00\x00\x00\x01" + b"\xff" * 11 + b"\x00\x00", -1)],
    "a string past the end": [(hello(), 1), (frame(NOTIFY, string("check") + b"\x02" + string("uri") + b"\x08\x30/a", 1, 1), -1)],
    "type 12": [(hello(), 1), (frame(NOTIFY, string("check") + b"\x01" + string("uri") + b"\x0c", 1, 1), -1)],
    "a cut IPv6": [(hello(), 1), (frame(NOTIFY, string("check") + b"\x01" + string("ip") + b"\x07\x20\x01", 1, 1), -1)],
    "no argument count": [(hello(), 1), (frame(NOTIFY, string("check"), 1, 1), -1)],
    "frame type 77": [(hello(), 1), (frame(77, b"", 1, 1), -1)],
    "a second HELLO": [(hello(), 1), (hello(), -1)],
}


async def _transcript(port: int, steps: list[tuple[bytes, int]]) -> list[bytes]:
    """Every frame the agent sends back over one conversation, as raw bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out: list[bytes] = []
    try:
        for data, count in steps:
            if data:
                writer.write(data)
                await writer.drain()
            while count != 0:
                try:
                    head = await asyncio.wait_for(reader.readexactly(4), 10)
                    out.append(head + await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), 10))
                except asyncio.IncompleteReadError as exc:
                    assert count < 0 and not exc.partial, (count, exc.partial)
                    out.append(b"EOF")
                    break
                count -= 1
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()
    return out


async def _converse(front: str, app: ServeApp) -> dict[str, list[bytes]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    FRONT["name"] = front
    server = await start_agent(app, sock)
    try:
        return {name: await _transcript(port, steps) for name, steps in _CONVERSATIONS.items()}
    finally:
        await stop_agent(server)


async def test_both_front_doors_answer_byte_for_byte(spoe_front: str) -> None:
    """The same conversations with the Python agent and the compiled front door: the same frames, byte
    for byte (HELLO, ACKs with their SET-VAR actions, refusals cut to the frame size, and the
    AGENT-DISCONNECT status and message of each malformed frame), then the same close."""
    if spoe_front == "python":
        pytest.skip("compares the python agent with the compiled one: run once, with the compiled one")
    python = await _converse("python", _app())
    compiled = await _converse("compiled", _app())
    for name in _CONVERSATIONS:
        assert compiled[name] == python[name], name
    statuses = Counter(frame[4] for frames in python.values() for frame in frames if frame != b"EOF")
    assert statuses[ACK] == 14 and statuses[AGENT_DISCONNECT] == 19, statuses


async def test_both_front_doors_fail_closed_alike(spoe_front: str) -> None:
    """A store that fails under ``on_error="closed"``: the same 503 ACK from both, and both go on."""
    if spoe_front == "python":
        pytest.skip("compares the python agent with the compiled one: run once, with the compiled one")
    answers = {}
    for front in SPOE_FRONTS:
        store = FlakyStore(clock=lambda: NOW)
        FRONT["name"] = front
        async with serving(_app(Limiter(store, on_error="closed"))) as connect:
            conn = await connect()
            await conn.hello()
            failed = await conn.check(1, 1, headers={"X-API-Key": "pk-alice"})
            store.down = False
            answers[front] = (failed, await conn.check(1, 2, headers={"X-API-Key": "pk-alice"}))
    assert answers["python"][0]["status"] == 503 and answers["python"][1]["status"] == 200
    assert answers["compiled"] == answers["python"]
