"""A Sanic app served for real: ``create_server`` on a loopback socket in the test's event loop,
and a raw HTTP/1.1 client that sends the method as given (httpx upper-cases it)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

from sanic import Sanic

_names = itertools.count()


def new_app() -> Sanic:  # type: ignore[type-arg]
    """A Sanic app with a name of its own (Sanic keeps every app by name), in Sanic's test mode: a
    second app's start-up then rewrites Sanic's own request handler from its source again (as
    sanic-testing's clients do), not from the first app's rewrite of it."""
    Sanic.test_mode = True
    return Sanic(f"rw_test_{next(_names)}")


@contextlib.asynccontextmanager
async def serving(app: Sanic) -> AsyncIterator[int]:  # type: ignore[type-arg]
    """Serve ``app`` on 127.0.0.1 until the block ends; yields the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = await app.create_server(sock=sock, return_asyncio_server=True, access_log=False)
    assert server is not None
    await server.startup()
    await server.before_start()
    await server.after_start()
    try:
        yield sock.getsockname()[1]
    finally:
        await server.before_stop()
        await server.close()
        await server.after_stop()
        sock.close()


async def send(
    port: int, method: str, target: str, headers: Mapping[str, str] | None = None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request on its own connection: (status, headers in order with lower-case names, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {target} HTTP/1.1", "Host: testserver", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in header_lines)]
    return int(status_line.split(" ")[1]), parsed, body


@contextlib.asynccontextmanager
async def started(app: Sanic) -> AsyncIterator[Sanic]:  # type: ignore[type-arg]
    """``app`` as an ASGI app, started and stopped through the ASGI lifespan protocol (as an ASGI
    server runs Sanic), for a client that sets the peer's address (httpx's ``ASGITransport``)."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield app
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task
