"""The one place that relies on redis-py beyond its documented API; each reliance is listed in
``RELIED_ON`` and checked against the installed redis-py by
``tests/stores/test_redis_client_internals.py``, so a release that changes one fails there,
by name, rather than in production.

* Our own connections (standalone, Sentinel) come from the client's pool without being checked
  out (``make_connection``), with no socket timeout: our own timer bounds each exchange.
* Replies are read from the connection's parser (``conn._parser.read_response``), skipping the
  connection's per-reply wrapper (timeout context, health bookkeeping); it returns an error
  reply as its exception instead of raising it.
* A Sentinel set-up's clients of each Sentinel (``Sentinel.sentinels``) are closed by the store:
  closing the primary's client leaves them open.
* Host names are resolved in a daemon thread of our own (``_Resolving``), by overriding the
  connection's ``_connect`` and ``_connection_arguments``.
* Replies arriving on our own connections are counted (``arrivals``) by wrapping the feed of the
  connection's ``asyncio.StreamReader`` (``conn._reader``); the kernel's unread bytes are seen on
  the socket of ``conn._writer``'s transport. A timeout then tells a store that does not answer
  from a reply our own busy event loop has not read yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import select
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from ._redis import aioredis

__all__ = [
    "RELIED_ON", "Arrivals", "ResolvingConnection", "ResolvingSSLConnection", "new_connection", "reply_reader", "sentinel_clients",
]

#: Every redis-py attribute or behaviour used here beyond the documented API, and what for.
RELIED_ON = {
    "ConnectionPool.make_connection": "a new connection of the pool's class and arguments, not checked out "
    "(BlockingConnectionPool, SentinelConnectionPool)",
    "Connection._reader": "the connected connection's asyncio.StreamReader, fed by its protocol's "
    "data_received (arrivals counts the feed)",
    "Connection._writer": "the connected connection's asyncio.StreamWriter, whose transport has the socket",
    "Connection.socket_timeout": "read at each exchange; None lets our own timer bound it",
    "Connection._parser": "the connection's parser once connected (hiredis when installed)",
    "_parser.read_response": "a coroutine reading one reply; an error reply as its ResponseError subclass "
    "(NoScriptError for NOSCRIPT; returned, or raised by older parsers), later replies still in step",
    "Sentinel.sentinels": "the Redis client of each Sentinel, which the store closes (redis-py 5 has no "
    "Sentinel.aclose)",
    "Connection._connect": "opens the socket to self.host and self.port (called by connect())",
    "Connection._connection_arguments": "the keyword arguments of asyncio.open_connection, with 'ssl' on an "
    "SSLConnection (we add server_hostname)",
}


def new_connection(client: Any) -> Any:
    """A connection of ``client``'s pool kind (a Sentinel one finds the primary on connect)
    that the pool does not hand out, with no socket timeout: our own timer bounds it."""
    conn = client.connection_pool.make_connection()
    conn.socket_timeout = None
    return conn


def reply_reader(conn: Any) -> Callable[[], Awaitable[Any]]:
    """The connected ``conn``'s parser's ``read_response``: one reply each call, an error
    reply as its exception, returned or raised (any failure disconnects the connection: our
    caller does)."""
    parser = getattr(conn, "_parser", None)
    return conn.read_response if parser is None else parser.read_response  # type: ignore[no-any-return]


class Arrivals:
    """What one connection has received: ``chunks`` handed to its reader by our event loop, and
    ``fd``, its socket, for bytes still unread in the kernel."""

    __slots__ = ("chunks", "fd")

    def __init__(self, fd: int) -> None:
        self.chunks = 0
        self.fd = fd

    def waiting(self) -> bool:
        """Whether bytes from the server wait in the kernel, unread by our loop yet (``poll``:
        ``select`` refuses descriptors from 1024 up, which a server with 1,000 clients has)."""
        if self.fd < 0:
            return False
        try:
            if not hasattr(select, "poll"):  # Windows
                return bool(select.select([self.fd], [], [], 0)[0])
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):  # closed meanwhile
            return False


def arrivals(conn: Any) -> Arrivals | None:
    """The arrival count of the connected ``conn`` (set up on its first call and again after a
    reconnect gives it a new reader), or ``None`` when its stream is not the expected kind."""
    reader = getattr(conn, "_reader", None)
    if not isinstance(reader, asyncio.StreamReader):
        return None
    counted: Arrivals | None = getattr(reader, "_ratewarden_arrivals", None)
    if counted is not None:
        return counted
    sock = None
    writer = getattr(conn, "_writer", None)
    if writer is not None:
        sock = writer.transport.get_extra_info("socket")
    counted = Arrivals(sock.fileno() if sock is not None else -1)
    feed = reader.feed_data

    def feed_counted(data: bytes) -> None:
        counted.chunks += 1
        feed(data)

    reader.feed_data = feed_counted  # type: ignore[method-assign,assignment]
    reader._ratewarden_arrivals = counted  # type: ignore[attr-defined]
    return counted


def sentinel_clients(sentinel: Any) -> list[Any]:
    """The client of each Sentinel that ``sentinel`` asks: closing its primary's client leaves them open."""
    return list(sentinel.sentinels)


class _Resolving:
    """Resolve the host name in a daemon thread of its own, not in the event loop's default
    executor: ``asyncio.run`` waits for that executor on exit, so a resolver that hangs (a host
    that never resolves) would hold the program for the resolver's own timeout after ``close``."""

    host: str
    port: int
    socket_connect_timeout: float | None
    _server_hostname: str | None = None

    async def _connect(self) -> None:
        host = self.host
        addresses = await _within(_resolve(host, self.port), self.socket_connect_timeout)
        self._server_hostname = host
        error: OSError | None = None
        try:
            for address in addresses:
                self.host = address
                try:
                    await super()._connect()  # type: ignore[misc]
                    return
                except OSError as exc:
                    error = exc
        finally:
            self.host = host
        raise error if error is not None else OSError(f"{host} resolved to no address")

    def _connection_arguments(self) -> dict[str, Any]:
        kwargs = dict(super()._connection_arguments())  # type: ignore[misc]
        if kwargs.get("ssl") is not None and self._server_hostname is not None:
            kwargs["server_hostname"] = self._server_hostname  # certificates name the host
        return kwargs


class ResolvingConnection(_Resolving, aioredis.Connection):
    pass


class ResolvingSSLConnection(_Resolving, aioredis.SSLConnection):
    pass


async def _within(future: asyncio.Future[list[str]], timeout: float | None) -> list[str]:
    """``future``'s result, waiting at most ``timeout``. Not ``asyncio.wait_for``: before Python
    3.12 it swallows a cancellation that arrives as the future completes (always, for a future
    already done: an IP address), and the cancelled check then runs on unbounded."""
    if not future.done():
        done, _ = await asyncio.wait((future,), timeout=timeout)
        if not done:
            future.cancel()
            raise asyncio.TimeoutError
    return future.result()


def _resolve(host: str, port: int) -> asyncio.Future[list[str]]:
    """The addresses of ``host`` (itself when it is one), looked up in a daemon thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[str]] = loop.create_future()
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        future.set_result([host])
        return future

    def settle(result: list[str] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or [])

    def lookup() -> None:
        result: list[str] | None = None
        error: BaseException | None = None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            result = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except OSError as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=lookup, name=f"ratewarden-resolve-{host}", daemon=True).start()
    return future
