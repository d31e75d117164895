"""The HTTP check API through the compiled front door (``--http-front compiled``): ``ratewarden._front``
reads each HTTP/1.1 request (hyper, within the service's HTTP bounds) and queues it; this module
answers every waiting request in one batch with the app the Python HTTP server runs (``ServeApp``, an
ASGI app), so ``/check``, ``/v1/check``, ``/json``, ``/healthz`` and ``/metrics`` answer the same
status, headers and body on both (docs/serve.md#the-compiled-front-door). ``/check``, the gateways'
hot path, skips the ASGI exchange: it calls ``ServeApp.check``, the translation ASGI ``/check`` runs.

A request decided without suspending (the memory store) is answered in the same batch, with no Task;
one that suspends (Redis) goes on in a Task from where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any, Protocol
from urllib.parse import unquote

from ..types import ASGIApp, Message
from . import bounds
from .front import open_front, queue_settings
from .front_batch import BatchAdapter, stall_problem
from .http import ServeApp
from .http_io import error_answer

__all__ = ["HTTP_FRONTS", "CompiledHttp", "HttpAdapter", "start_http_front"]

log = logging.getLogger("ratewarden.serve")

#: The HTTP servers a worker can run (``--http-front``, whose ``auto`` is ``compiled`` where it imports).
HTTP_FRONTS = ("python", "compiled")

Headers = list[tuple[bytes, bytes]]
#: One answer handed back: the request's id, status, complete header list and body.
HttpItem = tuple[int, int, Headers, bytes]
#: One request taken: id, method, target (path and query), headers, peer, local address, body.
HttpRequest = tuple[int, str, str, Headers, tuple[str, int], tuple[str, int], bytes]

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT: Message = {"type": "http.disconnect"}


class HttpFront(Protocol):
    """What this module uses of ``ratewarden._front.Front`` started with ``http`` settings."""

    def fileno(self) -> int: ...
    def drain(self) -> None: ...
    def take_http(self, limit: int) -> list[HttpRequest]: ...
    def answer_http(self, items: list[HttpItem]) -> None: ...
    def stalled(self) -> tuple[float, float, float]: ...
    def serving(self) -> bool: ...
    def close(self) -> None: ...
    def stop(self, grace: float) -> None: ...


class _Exchange:
    """One request's ASGI ``receive`` and ``send``: the body in one message, the answer collected."""

    __slots__ = ("body", "chunks", "headers", "read", "status")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.read = False
        self.status = 500
        self.headers: Headers = []
        self.chunks: list[bytes] = []

    async def receive(self) -> Message:
        if self.read:
            return _DISCONNECT
        self.read = True
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", ()))
        elif kind == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))


#: From Python 3.12, ``asyncio.wait_for`` (the health check's store probe) needs a current task, so
#: a request is not started inline by ``coro.send`` there: each runs in a task of its own.
_IN_TASK = sys.version_info >= (3, 12)


def _failed(exc: BaseException) -> tuple[int, Headers, bytes]:
    """The service's 500 for an app that raised (``ServeApp`` answers its own failures)."""
    log.error("check failed", exc_info=exc, extra={"event": "check_failed"})
    return error_answer(500, f"the check failed: {type(exc).__name__} (see the service's log)")


async def _answer(app: ASGIApp, scope: dict[str, Any], exchange: _Exchange) -> tuple[int, Headers, bytes]:
    """Run ``app`` for one request: its status, header list and body."""
    try:
        await app(scope, exchange.receive, exchange.send)
    except Exception as exc:
        return _failed(exc)
    return exchange.status, exchange.headers, b"".join(exchange.chunks)


def _scope(
    method: str, raw_path: str, query: str, headers: Headers, peer: tuple[str, int], local: tuple[str, int],
) -> dict[str, Any]:
    """The request's ASGI scope, as uvicorn builds it."""
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": "1.1",
        "server": local,
        "client": peer,
        "scheme": "http",
        "method": method,
        "root_path": "",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("latin-1", "replace"),
        "query_string": query.encode("latin-1", "replace"),
        "headers": headers,
        "state": {},
    }


class HttpAdapter(BatchAdapter[HttpRequest, HttpItem]):
    """Answers a started front door's HTTP requests with ``app`` on the running event loop.

    Args:
        front: The started front door (with ``http`` settings).
        app: The ASGI app that answers (``ServeApp``).
        max_batch: The most requests taken in one crossing.
    """

    in_task = _IN_TASK

    def __init__(self, front: HttpFront, app: ASGIApp, max_batch: int = 1024) -> None:
        self.app = app
        #: ``/check`` answered without an ASGI exchange: the same translation ``ServeApp`` runs for it.
        self._check = app.check if isinstance(app, ServeApp) else None
        super().__init__(front, front.take_http, front.answer_http, max_batch)

    def _begin(self, batch: list[HttpRequest], done: list[HttpItem]) -> None:
        app, check = self.app, self._check
        for rid, method, target, headers, peer, local, body in batch:
            raw_path, _, query = target.partition("?")
            if check is not None and raw_path == "/check":
                coro = check(query.encode("latin-1", "replace"), headers, peer, local)
            else:
                coro = _answer(app, _scope(method, raw_path, query, headers, peer, local), _Exchange(body))
            self._start(rid, coro, done)

    def _item(self, rid: int, value: tuple[int, Headers, bytes]) -> HttpItem:
        status, out, payload = value
        return rid, status, out, payload

    def _failed(self, exc: BaseException) -> tuple[int, Headers, bytes]:
        return _failed(exc)


class CompiledHttp:
    """The worker's HTTP server on the compiled front door, driven as the worker drives uvicorn's:
    ``await serve()`` returns once ``should_exit`` is set and the requests in flight are answered."""

    def __init__(self, front: HttpFront, adapter: HttpAdapter, grace: float, timeout: float = bounds.HTTP_TIMEOUT) -> None:
        self.front = front
        self.adapter = adapter
        self.grace = grace
        self.timeout = timeout
        self._exit = asyncio.Event()

    def stalled(self) -> str | None:
        """Why ``/healthz`` fails for this door (its queue waits past the request timeout), or ``None``."""
        return stall_problem("HTTP", self.front.stalled()[1], self.timeout)

    @property
    def should_exit(self) -> bool:
        """Whether the worker asked it to stop."""
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until ``should_exit``; then no new connection, and the requests in flight are
        answered for up to ``grace`` seconds before the front door's threads stop.

        Args:
            sockets: Ignored (the front door serves the socket it was started with).
        """
        await self._exit.wait()
        loop = asyncio.get_running_loop()
        self.front.close()
        deadline = loop.time() + self.grace
        while self.front.serving() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.adapter.close()
        await asyncio.to_thread(self.front.stop, 0.5)


def start_http_front(
    app: ASGIApp, sock: socket.socket, *, max_connections: int = bounds.HTTP_MAX_CONNECTIONS,
    timeout: float = bounds.HTTP_TIMEOUT, max_header_size: int = bounds.HTTP_MAX_HEADER_SIZE,
    max_pending: int = bounds.GRPC_MAX_PENDING, grace: float = 10.0,
    max_pending_bytes: int = bounds.GRPC_MAX_PENDING_BYTES,
) -> CompiledHttp:
    """Serve the HTTP check API on ``sock`` (a listening socket) through the compiled front door,
    answering with ``app`` on the running event loop; ``ImportError`` without ``ratewarden._front``.

    Args:
        app: The ASGI app that answers (``ServeApp``).
        sock: The listening socket (duplicated: several workers may share it).
        max_connections: Open connections (one more is answered 503 and closed).
        timeout: Seconds to receive a request's head once it begins, and its body (then 408 and
            closed), and from its arrival to its answer (then 503).
        max_header_size: Bytes of a request's line and headers (more: 431).
        max_pending: Requests waiting for an answer (more: 503).
        max_pending_bytes: Bytes of the requests waiting for an answer (more: 503).
        grace: Seconds for the requests in flight when stopping.
    """
    front: HttpFront = open_front(None, {
        "queue": queue_settings(max_pending, max_pending_bytes, timeout),
        "http": {
            "fd": sock.fileno(), "max_connections": max_connections, "max_header_size": max_header_size,
            "timeout": timeout, "keep_alive": float(bounds.HTTP_TIMEOUT_KEEP_ALIVE),
        },
    })
    compiled = CompiledHttp(front, HttpAdapter(front, app), grace, timeout)
    if isinstance(app, ServeApp):
        app.doors.append(compiled.stalled)
    return compiled
