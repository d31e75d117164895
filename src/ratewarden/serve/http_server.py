"""uvicorn's HTTP protocol with the bounds uvicorn leaves open (docs/serve.md#bounds): a connection
beyond ``max_connections`` is answered 503 and closed at once, a request not received whole within
``timeout`` seconds of its start (or of the connection's) is answered 408 and closed, and a request
line and headers over ``max_header_size`` bytes are answered 431 and closed (with h11, h11 itself
refuses them: uvicorn's ``h11_max_incomplete_event_size``).

Imported only by ``ratewarden serve``'s workers (it needs uvicorn).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

__all__ = ["bounded_protocol"]

_BASES = {
    "httptools": ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
    "h11": ("uvicorn.protocols.http.h11_impl", "H11Protocol"),
}
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def _refuse(transport: asyncio.BaseTransport, status: int, message: str) -> None:
    """Answer ``status`` with the service's JSON error and close the connection."""
    assert isinstance(transport, asyncio.WriteTransport)
    body = json.dumps({"status": status, "error": message}).encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status, _REASONS[status], len(body))
    transport.write(head + body)
    transport.close()


def _answer(status: int, message: str) -> Any:
    """An ASGI app answering every request ``status`` with the service's JSON error, then closing."""
    body = json.dumps({"status": status, "error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), (b"connection", b"close")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class _Bounded:
    """The bounds of one connection, mixed in before a uvicorn protocol class (``bounded_protocol``
    sets the class attributes)."""

    max_connections: int
    timeout: float
    max_header_size: int
    too_large: Any  # the ASGI app answering 431
    # The uvicorn protocol's own attributes read here.
    app: Any
    connections: Any
    transport: Any
    cycle: Any
    loop: Any
    url: Any
    headers: Any
    _timer: asyncio.TimerHandle | None = None
    _waiting: Any = None  # the request cycle current when the timer started (not the one it waits for)
    _in_head = False
    _head = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.max_connections:
            _refuse(transport, 503, f"this worker has {self.max_connections} connections open: try again")
            return
        self._start()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._timer is None:  # the previous request was received whole: a new one begins
            self._start()
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self._in_head:
            self._head += len(data)
            if self._head > self.max_header_size:
                self._refuse(431, f"the request line and headers are larger than {self.max_header_size} bytes")
                return
        if self._timer is not None and not self._receiving():
            self._timer.cancel()
            self._timer = None

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head = 0
        super().on_message_begin()  # type: ignore[misc]

    def on_headers_complete(self) -> None:
        self._in_head = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size <= self.max_header_size:
            super().on_headers_complete()  # type: ignore[misc]
            return
        app = self.app  # a head received whole in one read: answered by uvicorn, 431 and closed
        self.app = self.too_large
        try:
            super().on_headers_complete()  # type: ignore[misc]
        finally:
            self.app = app

    def _start(self) -> None:
        self._waiting = self.cycle
        self._timer = self.loop.call_later(self.timeout, self._expired)

    def _receiving(self) -> bool:
        """Whether a request has begun and is not yet received whole."""
        cycle = self.cycle
        return cycle is self._waiting or bool(cycle.more_body)

    def _expired(self) -> None:
        self._timer = None
        if self._receiving() and not self.transport.is_closing():
            self._refuse(408, f"the request was not received whole within {self.timeout:g} seconds")

    def _refuse(self, status: int, message: str) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            _refuse(self.transport, status, message)
        else:  # an answer is being written on this connection: no other one can be
            self.transport.close()


def bounded_protocol(http: str, *, max_connections: int, timeout: float, max_header_size: int) -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class (``"httptools"`` or ``"h11"``) with the service's bounds, to
    give ``uvicorn.Config(http=...)``.

    Args:
        http: Which uvicorn protocol.
        max_connections: Open connections of this worker; one more is answered 503 and closed.
        timeout: Seconds to receive a whole request (line, headers, body) once it begins.
        max_header_size: Bytes of a request's line and headers (counted by the read: httptools only).
    """
    module, name = _BASES[http]
    base: Any = getattr(importlib.import_module(module), name)
    too_large = _answer(431, f"the request line and headers are larger than {max_header_size} bytes")
    bounds = {"max_connections": max_connections, "timeout": timeout, "max_header_size": max_header_size,
              "too_large": staticmethod(too_large), "__doc__": "The protocol of one connection, bounded."}
    protocol: type[asyncio.Protocol] = type(f"Bounded{name}", (_Bounded, base), bounds)
    return protocol
