"""``ratewarden serve --spoe``: an agent for HAProxy's Stream Processing Offload Engine (SPOE).

HAProxy keeps a few connections to the agent open and sends each request's description over them
as a NOTIFY frame (``spoe.conf``'s ``check`` message: ``method``, ``uri``, ``headers`` from
``req.hdrs_bin`` and ``ip``), many in flight at once; the agent answers each with an ACK setting
transaction variables: ``status`` (200, 429, 403, or 503 when the store is down under
``--on-error closed``), the rate-limit headers (``ratelimit``, ``ratelimit_policy``,
``x_ratelimit_limit``, ``x_ratelimit_remaining``, ``x_ratelimit_reset``, ``retry_after``, and
``ratelimit_shadow`` when a shadow limit would have refused) and, for a refusal, its problem+json ``body``. The decision is ``ServeApp.decide_steps``'s, the one ``/check``
makes: the same policy, tiers, bans and counts.

No connection per check and no HTTP to parse: the cheapest way for HAProxy to ask a service.

Bounds (docs/serve.md#bounds), after HAProxy's own SPOE timeouts: a connection has ``timeout_hello``
seconds to send its HELLO, ``timeout_idle`` to begin its next frame and ``timeout_frame`` to finish a
frame it began (else AGENT-DISCONNECT status 2, a timeout); at most ``max_connections`` are open
(one more gets status 13); a NOTIFY frame is one decision, of its first message named ``message``;
an ACK is never larger than the frame size agreed in the HELLO; a connection whose peer leaves more
than ``MAX_BUFFERED`` bytes of ACKs unread is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field

from ..steps import drive
from . import bounds
from .http import ServeApp, ServeError, _address
from .http_io import Headers
from .spop import (
    HAPROXY_DISCONNECT,
    HAPROXY_HELLO,
    NOTIFY,
    Frame,
    Message,
    SpopError,
    Value,
    ack,
    agent_disconnect,
    agent_hello,
    header_list,
    kv_list,
    messages,
    read_frame,
    set_text,
    set_var,
)

__all__ = ["MAX_BUFFERED", "MAX_FRAME_SIZE", "MAX_IN_FLIGHT", "MIN_FRAME_SIZE", "SpoeAgent", "hello", "receive_frame",
           "start_spoe"]

log = logging.getLogger("ratewarden.serve")

#: The largest frame the agent accepts (HAProxy's default ``tune.bufsize`` 16384, less the length).
MAX_FRAME_SIZE = 16380
#: NOTIFY frames of one connection decided at once; more wait for one of them to finish.
MAX_IN_FLIGHT = 256
#: The smallest frame size a HELLO may offer (HAProxy's own least, 256 bytes); less is status 9.
MIN_FRAME_SIZE = 256
#: Bytes of answers a connection may leave unread; HAProxy reads its ACKs at once, so more drops it.
MAX_BUFFERED = 1024 * 1024
#: The answer's headers set as variables (``-`` becomes ``_`` in the variable's name).
_KEPT = (b"ratelimit", b"ratelimit-policy", b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset",
         b"retry-after", b"ratelimit-shadow")
_VARIABLES = {name: name.decode().replace("-", "_") for name in _KEPT}
_PLAIN_TEXT = "text/plain; charset=utf-8"


@dataclass(eq=False)
class SpoeAgent:
    """Answers HAProxy's SPOE connections with ``app``'s decisions.

    Args:
        app: The service's app; its ``decide`` answers, its trusted proxies say whose ``ip`` is believed.
        max_frame_size: The largest frame accepted (HAProxy's, if smaller, wins).
        max_connections: Connections open at once; one more gets AGENT-DISCONNECT status 13 and is closed.
        timeout_hello: Seconds for a new connection to send its HAPROXY-HELLO.
        timeout_idle: Seconds a connection may wait before beginning its next frame.
        timeout_frame: Seconds to finish a frame once its length arrived.
        message: The message decided (spoe.conf's ``spoe-message``); a frame's other messages are ignored.
    """

    app: ServeApp
    max_frame_size: int = MAX_FRAME_SIZE
    _: KW_ONLY
    max_connections: int = bounds.SPOE_MAX_CONNECTIONS
    timeout_hello: float = bounds.SPOE_TIMEOUT_HELLO
    timeout_idle: float = bounds.SPOE_TIMEOUT_IDLE
    timeout_frame: float = bounds.SPOE_TIMEOUT_FRAME
    message: str = bounds.SPOE_MESSAGE
    _connections: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    async def close(self) -> None:
        """End the open connections (HAProxy reconnects, to another worker if there is one); checks
        still in flight are dropped, and HAProxy answers them as unanswered."""
        connections = list(self._connections)
        for connection in connections:
            connection.cancel()
        await asyncio.gather(*connections, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from HAProxy: HELLO, then NOTIFY frames until DISCONNECT or EOF."""
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # Shutting down cancels the connections HAProxy keeps open (the connection is closed by
            # then). Ended, not re-raised: Python 3.11's asyncio.start_server logs a cancelled
            # handler as "Unhandled exception in client_connected_cb", one traceback per connection.
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        peer = writer.get_extra_info("peername")
        trusted = self.app.is_trusted(peer[0] if isinstance(peer, tuple) else None)
        pending: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            if len(self._connections) > self.max_connections:
                writer.write(agent_disconnect(13, f"this agent has {self.max_connections} connections open"))
                return
            timer = loop.call_later(self.timeout_hello, _expire, writer, f"no HAPROXY-HELLO within {self.timeout_hello:g}s")
            limit = await hello(reader, writer, self.max_frame_size)
            timer.cancel()
            if limit is None:
                return
            idle = f"no frame begun within {self.timeout_idle:g}s"
            slow = f"a frame not finished within {self.timeout_frame:g}s"
            while True:
                timer = loop.call_later(self.timeout_idle, _expire, writer, idle)
                await writer.drain()  # no more frames read while HAProxy leaves its answers unread
                length = int.from_bytes(await reader.readexactly(4), "big")
                timer.cancel()
                if length > limit:
                    raise SpopError(3, f"a frame of {length} bytes is larger than the {limit} agreed")
                timer = loop.call_later(self.timeout_frame, _expire, writer, slow)
                frame = read_frame(await reader.readexactly(length))
                timer.cancel()
                if frame.kind == NOTIFY:
                    if len(pending) >= MAX_IN_FLIGHT:
                        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    found = _message(frame.payload, self.message)
                    check = asyncio.create_task(self._answer(writer, frame.stream_id, frame.frame_id, limit, found,
                                                             trusted, peer))
                    pending.add(check)
                    check.add_done_callback(pending.discard)
                elif frame.kind == HAPROXY_DISCONNECT:
                    if pending:
                        await asyncio.wait(pending)
                    writer.write(agent_disconnect(0, "normal"))
                    return
                else:
                    raise SpopError(4, f"unexpected frame type {frame.kind}")
        except SpopError as exc:
            log.warning("spoe: %s; closing the connection", exc, extra={"event": "spoe_error"})
            writer.write(agent_disconnect(exc.status, str(exc)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # HAProxy closed the connection
        finally:
            if timer is not None:
                timer.cancel()
            for check in pending:
                check.cancel()
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, stream_id: int, frame_id: int, limit: int,
                      found: Message | None, trusted: bool, peer: object) -> None:
        """Decide a NOTIFY's message and ACK it: never more than ``limit`` bytes (else its status alone)."""
        actions = await self.actions(found, trusted, peer)
        if writer.is_closing():
            return
        if writer.transport.get_write_buffer_size() > MAX_BUFFERED:  # HAProxy is not reading its answers
            writer.transport.abort()
            return
        answer = ack(stream_id, frame_id, actions)
        if len(answer) - 4 > limit:
            answer = ack(stream_id, frame_id, actions[:1])
        writer.write(answer)

    async def actions(self, found: Message | None, trusted: bool, peer: object) -> list[bytes]:
        """The SET-VAR actions answering a NOTIFY frame whose ``message`` is ``found`` (``None``: the
        frame has none), from a peer (``(host, port)``) that is a trusted proxy or not; the compiled
        front door (``serve.front_spoe``) answers with these too. The message is translated, the
        core's step machine driven (``ServeApp.decide_steps``) and its answer sent as variables."""
        if found is None:
            return [set_var("status", 400), set_var("body", f"the NOTIFY frame has no {self.message!r} message"),
                    set_var("content_type", _PLAIN_TEXT)]
        try:
            answered = drive(self.app.decide_steps(*_described(found, trusted, peer)))
            status, answer, body = answered if isinstance(answered, tuple) else await answered
        except (ServeError, SpopError) as exc:  # a description that cannot be used (a malformed headers arg: 400)
            status = exc.status if isinstance(exc, ServeError) else 400
            return [set_var("status", status), set_var("body", str(exc)), set_var("content_type", _PLAIN_TEXT)]
        except Exception as exc:  # a bug or a broken store client: answered (and failed closed by the config)
            log.exception("spoe check failed: %s: %s", type(exc).__name__, exc, extra={"event": "check_failed"})
            return [set_var("status", 500)]
        return _variables(status, answer, body)


def _described(message: Message, trusted: bool, peer: object) -> tuple[str, str, Headers, str | None, str]:
    """What a ``check`` message describes: the original request's method, URI, headers, client
    address (HAProxy's ``ip`` from a trusted peer, else the peer's own) and scheme."""
    args = message.args
    method = _text(args.get("method"), "GET")
    uri = _text(args.get("uri"), "") or _text(args.get("path"), "/")
    query = _text(args.get("query"), "")
    if query and "?" not in uri:
        uri = f"{uri}?{query}"
    raw = args.get("headers")
    headers = list(header_list(raw)) if isinstance(raw, bytes) else []
    return method, uri, headers, _client(args.get("ip"), trusted, peer), "https" if args.get("ssl") is True else "http"


def _message(payload: bytes, name: str) -> Message | None:
    """The first message called ``name`` of a NOTIFY payload (all of it is read: malformed is status 4)."""
    for message in messages(payload):
        if message.name == name:
            return message
    return None


def _expire(writer: asyncio.StreamWriter, why: str) -> None:
    """End a connection that ran out of time: AGENT-DISCONNECT status 2 (a timeout), then closed."""
    transport = writer.transport
    if transport.is_closing():
        return
    log.debug("spoe: %s; closing the connection", why, extra={"event": "spoe_timeout"})
    writer.write(agent_disconnect(2, why))
    if transport.get_write_buffer_size():  # a peer that does not read: no waiting for it
        transport.abort()
    else:
        transport.close()


def _text(value: Value, default: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return default


def _client(ip: Value, trusted: bool, peer: object) -> str | None:
    """The client address: HAProxy's ``ip`` argument from a trusted peer, else the peer's own."""
    if trusted and isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ip)
    if trusted and isinstance(ip, str):  # as /check reads X-Real-IP: an address, else the peer's own
        address = _address(ip)
        if address is not None:
            return address
    return peer[0] if isinstance(peer, tuple) and peer else None


def _variables(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> list[bytes]:
    """SET-VAR actions for a decision: its status, its rate-limit headers (repeated ones joined with
    commas, as HTTP joins them) and, for a refusal, its body and content type."""
    values: dict[str, bytes] = {}
    content_type = b""
    for name, value in headers:
        variable = _VARIABLES.get(name)
        if variable is not None:
            seen = values.get(variable)
            values[variable] = value if seen is None else seen + b", " + value
        elif name == b"content-type":
            content_type = value
    actions = [set_var("status", status)]
    actions += [set_text(variable, value) for variable, value in values.items()]
    if status >= 400:
        actions += [set_text("body", body), set_text("content_type", content_type)]
    return actions


async def receive_frame(reader: asyncio.StreamReader, limit: int) -> Frame:
    """The next frame; one over ``limit`` bytes is refused (status 3)."""
    length = int.from_bytes(await reader.readexactly(4), "big")
    if length > limit:
        raise SpopError(3, f"a frame of {length} bytes is larger than the {limit} agreed")
    return read_frame(await reader.readexactly(length))


async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_size: int) -> int | None:
    """Answer a connection's HAPROXY-HELLO with AGENT-HELLO: the frame size both sides accept, or
    ``None`` for a health check (the connection then ends)."""
    frame = await receive_frame(reader, max_frame_size)
    if frame.kind != HAPROXY_HELLO:
        raise SpopError(4, f"the first frame must be HAPROXY-HELLO, got type {frame.kind}")
    offer = kv_list(frame.payload)
    versions = str(offer.get("supported-versions") or "")
    if not any(v.strip().startswith("2.") for v in versions.split(",")):
        raise SpopError(8, f"unsupported SPOP versions {versions!r}: this agent speaks 2.0")
    theirs = offer.get("max-frame-size")
    if not isinstance(theirs, int) or isinstance(theirs, bool):
        raise SpopError(6, "max-frame-size value not found")
    if theirs < MIN_FRAME_SIZE:
        raise SpopError(9, f"max-frame-size {theirs} is smaller than {MIN_FRAME_SIZE}")
    limit = min(theirs, max_frame_size)
    writer.write(agent_hello(limit))
    return None if offer.get("healthcheck") is True else limit


async def start_spoe(app: ServeApp, sock: socket.socket, agent: SpoeAgent | None = None) -> asyncio.Server:
    """Serve HAProxy's SPOE connections on the listening ``sock`` with ``app``'s decisions (through
    ``agent``, whose ``close`` ends the open connections)."""
    return await asyncio.start_server((agent or SpoeAgent(app)).handle, sock=sock)
