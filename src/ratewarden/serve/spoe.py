"""``ratewarden serve --spoe``: an agent for HAProxy's Stream Processing Offload Engine (SPOE).

HAProxy keeps a few connections to the agent open and sends each request's description over them
as a NOTIFY frame (``spoe.conf``'s ``check`` message: ``method``, ``uri``, ``headers`` from
``req.hdrs_bin`` and ``ip``), many in flight at once; the agent answers each with an ACK setting
transaction variables: ``status`` (200, 429, 403, or 503 when the store is down under
``--on-error closed``), the rate-limit headers (``ratelimit``, ``ratelimit_policy``,
``x_ratelimit_limit``, ``x_ratelimit_remaining``, ``x_ratelimit_reset``, ``retry_after``) and, for a
refusal, its problem+json ``body``. The decision is ``ServeApp.decide``'s, the one ``/check``
makes: the same policy, tiers, bans and counts.

No connection per check and no HTTP to parse: the cheapest way for HAProxy to ask a service.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterable

from .http import ServeApp, ServeError, _address
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

__all__ = ["MAX_FRAME_SIZE", "MAX_IN_FLIGHT", "SpoeAgent", "hello", "receive_frame", "start_spoe"]

log = logging.getLogger("ratewarden.serve")

#: The largest frame the agent accepts (HAProxy's default ``tune.bufsize`` 16384, less the length).
MAX_FRAME_SIZE = 16380
#: NOTIFY frames of one connection decided at once; more wait for one of them to finish.
MAX_IN_FLIGHT = 256
#: The answer's headers set as variables (``-`` becomes ``_`` in the variable's name).
_KEPT = (b"ratelimit", b"ratelimit-policy", b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset",
         b"retry-after")
_VARIABLES = {name: name.decode().replace("-", "_") for name in _KEPT}
_PLAIN_TEXT = "text/plain; charset=utf-8"


class SpoeAgent:
    """Answers HAProxy's SPOE connections with ``app``'s decisions.

    Args:
        app: The service's app; its ``decide`` answers, its trusted proxies say whose ``ip`` is believed.
        max_frame_size: The largest frame accepted (HAProxy's, if smaller, wins).
    """

    def __init__(self, app: ServeApp, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self.app = app
        self.max_frame_size = max_frame_size
        self._connections: set[asyncio.Task[None]] = set()

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
        try:
            limit = await hello(reader, writer, self.max_frame_size)
            if limit is None:
                return
            while True:
                frame = await receive_frame(reader, limit)
                if frame.kind == NOTIFY:
                    if len(pending) >= MAX_IN_FLIGHT:
                        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    check = asyncio.create_task(self._answer(writer, frame.stream_id, frame.frame_id,
                                                             messages(frame.payload), trusted, peer))
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
            for check in pending:
                check.cancel()
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, stream_id: int, frame_id: int, found: list[Message],
                      trusted: bool, peer: object) -> None:
        actions: list[bytes] = []
        for message in found:
            actions += await self._decide(message, trusted, peer)
        if not writer.is_closing():
            writer.write(ack(stream_id, frame_id, actions))

    async def _decide(self, message: Message, trusted: bool, peer: object) -> list[bytes]:
        """The variables answering one ``check`` message."""
        args = message.args
        try:
            method = _text(args.get("method"), "GET")
            uri = _text(args.get("uri"), "") or _text(args.get("path"), "/")
            query = _text(args.get("query"), "")
            if query and "?" not in uri:
                uri = f"{uri}?{query}"
            raw = args.get("headers")
            headers = list(header_list(raw)) if isinstance(raw, bytes) else []
            client = _client(args.get("ip"), trusted, peer)
            scheme = "https" if args.get("ssl") is True else "http"
            status, answer, body = await self.app.decide(method, uri, headers, client, scheme)
        except (ServeError, SpopError) as exc:  # a description that cannot be used (a malformed headers arg: 400)
            status = exc.status if isinstance(exc, ServeError) else 400
            return [set_var("status", status), set_var("body", str(exc)), set_var("content_type", _PLAIN_TEXT)]
        except Exception as exc:  # a bug or a broken store client: answered (and failed closed by the config)
            log.exception("spoe check failed: %s: %s", type(exc).__name__, exc, extra={"event": "check_failed"})
            return [set_var("status", 500)]
        return _variables(status, answer, body)


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
    limit = min(theirs, max_frame_size)
    writer.write(agent_hello(limit))
    return None if offer.get("healthcheck") is True else limit


async def start_spoe(app: ServeApp, sock: socket.socket, agent: SpoeAgent | None = None) -> asyncio.Server:
    """Serve HAProxy's SPOE connections on the listening ``sock`` with ``app``'s decisions (through
    ``agent``, whose ``close`` ends the open connections)."""
    return await asyncio.start_server((agent or SpoeAgent(app)).handle, sock=sock)
