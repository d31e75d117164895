"""The gateway bench's floor service: ``ratewarden serve``'s own stack answering a fixed OK.

Run as ``python -m ratewarden.bench.gateway_floor --http PORT [--grpc PORT] [--spoe PORT]``. It serves exactly as a
``ratewarden serve`` worker does (``serve.worker``: uvicorn on asyncio's loop with httptools, no
lifespan, access log, server or date header; a pre-bound listening socket; ``grpc.aio`` in the same
event loop), but the HTTP app answers every request with a fixed ``200`` and an empty body and the
gRPC servicer every ``ShouldRateLimit`` with a fixed ``OK``, checking nothing. The capacity ratio
ours / floor is then the cost of deciding, nothing else.

With ``--grpc-front PORT`` it starts the compiled gRPC front door (``ratewarden._front``, the one
``ratewarden serve`` runs by default) told to answer every well-formed call allowed at once without
asking Python (``fixed_ok``), with an allowed counted answer's fields: the least that door can do
for a call, which the gRPC rows beside envoyproxy/ratelimit are set against.

With ``--headers`` the fixed ``200`` also carries the rate-limit headers an allowed ``/check`` answer
does (``DECISION_HEADERS``: the same names, values of the same length), so the ratio against it is the
decision alone, without the cost of writing the headers every gateway answer must carry.

With ``--spoe`` it is also (or only) an agent for HAProxy's SPOE on the stack ``ratewarden serve
--spoe`` uses (an asyncio server on a socket bound as ``serve.process`` binds it, in the same event
loop as the HTTP server, frames read and written with ``serve.spop``): HELLO (and health checks) and
DISCONNECT answered as the real agent answers them, every NOTIFY acknowledged at once, its messages
not even decoded, with the variables an allowed check sets (``SPOE_VARIABLES``: ``status`` 200 and
``DECISION_HEADERS`` as ``ratelimit``, ``ratelimit_policy``, ``x_ratelimit_*``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from typing import Any

from ..serve.spoe import MAX_FRAME_SIZE, hello, receive_frame
from ..serve.spop import HAPROXY_DISCONNECT, NOTIFY, SpopError, ack, agent_disconnect, set_var
from ..types import ASGIApp, Receive, Scope, Send

__all__ = [
    "DECISION_HEADERS",
    "SPOE_VARIABLES",
    "FloorSpoeAgent",
    "fixed_front",
    "fixed_ok",
    "floor_app",
    "floor_servicer",
    "headers_floor_app",
    "main",
    "start_floor_spoe",
]

#: The header list of an allowed ``/check`` answer for the bench's capacity key (header style
#: ``both``), fixed: what ``--headers`` answers.
DECISION_HEADERS: list[tuple[bytes, bytes]] = [
    (b"ratelimit-policy", b'"api.bulk";q=1000000000;w=60'),
    (b"ratelimit", b'"api.bulk";r=999999999;t=60'),
    (b"x-ratelimit-limit", b"1000000000"),
    (b"x-ratelimit-remaining", b"999999999"),
    (b"x-ratelimit-reset", b"60"),
    (b"content-length", b"0"),
]


def fixed_ok(headers: list[tuple[bytes, bytes]]) -> ASGIApp:
    """ASGI: a fixed ``200`` with ``headers`` and an empty body for every HTTP request, checking nothing."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    return app


floor_app = fixed_ok([(b"content-length", b"0")])
"""The floor: a fixed ``200``, no headers but its length."""
headers_floor_app = fixed_ok(DECISION_HEADERS)
"""The floor with an allowed check's rate-limit headers (``--headers``)."""


#: The SET-VAR actions ``--spoe`` answers every NOTIFY with: what the agent sets for an allowed check
#: (``status`` 200, then the rate-limit headers of ``DECISION_HEADERS``, ``-`` as ``_``), fixed.
SPOE_VARIABLES: list[tuple[str, int | str]] = [("status", 200)] + [
    (name.decode().replace("-", "_"), value.decode()) for name, value in DECISION_HEADERS if name != b"content-length"]


class FloorSpoeAgent:
    """An SPOE agent answering every NOTIFY with ``SPOE_VARIABLES``, deciding nothing: the floor of
    ``ratewarden serve --spoe`` (``serve.spoe.SpoeAgent``), the same connection handling without the
    decision (nor the decoding of the messages it needs)."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self.actions = b"".join(set_var(name, value) for name, value in SPOE_VARIABLES)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from HAProxy: HELLO, then NOTIFY frames until DISCONNECT or EOF."""
        try:
            limit = await hello(reader, writer, self.max_frame_size)
            if limit is None:
                return
            while True:
                frame = await receive_frame(reader, limit)
                if frame.kind == NOTIFY:
                    writer.write(ack(frame.stream_id, frame.frame_id, (self.actions,)))
                elif frame.kind == HAPROXY_DISCONNECT:
                    writer.write(agent_disconnect(0, "normal"))
                    return
                else:
                    raise SpopError(4, f"unexpected frame type {frame.kind}")
        except SpopError as exc:
            writer.write(agent_disconnect(exc.status, str(exc)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # HAProxy closed the connection
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def start_floor_spoe(sock: socket.socket) -> asyncio.Server:
    """Serve the fixed SPOE answers on the listening ``sock`` (as ``serve.spoe.start_spoe`` does)."""
    return await asyncio.start_server(FloorSpoeAgent().handle, sock=sock)


def floor_servicer() -> Any:
    """An Envoy ``RateLimitService`` servicer answering every ``ShouldRateLimit`` with a fixed ``OK``
    (one ``OK`` status per descriptor), checking nothing. Needs the ``serve`` extra."""
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

    ok = rls_pb2.RateLimitResponse.Code.OK

    class Floor(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
        async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
            return rls_pb2.RateLimitResponse(
                overall_code=ok,
                statuses=[rls_pb2.RateLimitResponse.DescriptorStatus(code=ok) for _ in request.descriptors])

    return Floor()


def fixed_front(port: int) -> Any:
    """The compiled gRPC front door on ``port`` answering every call allowed without asking Python,
    with ``ratewarden serve``'s default bounds; ``ImportError`` without ``ratewarden._front``."""
    from ..serve import bounds as b
    from ..serve.front import open_front, queue_settings
    from ..serve.rls_messages import RequestDescriptor

    grpc = {"host": "127.0.0.1", "port": port, "reuse_port": False, "fixed_ok": True,
            "max_message_size": b.GRPC_MAX_MESSAGE_SIZE, "max_descriptors": b.MAX_DESCRIPTORS,
            "max_entries": b.MAX_ENTRIES, "max_connections": b.GRPC_MAX_CONNECTIONS,
            "handshake_timeout": b.GRPC_HANDSHAKE_TIMEOUT, "max_receiving": b.GRPC_MAX_RECEIVING,
            "max_receiving_per_connection": b.GRPC_MAX_RECEIVING_PER_CONNECTION}
    queue = queue_settings(b.GRPC_MAX_PENDING, b.GRPC_MAX_PENDING_BYTES, b.GRPC_TIMEOUT)
    return open_front(RequestDescriptor, {"queue": queue, "grpc": grpc})


def _server(sock: socket.socket, headers: bool) -> Any:
    """The uvicorn server ``ratewarden serve`` builds (``serve.worker.uvicorn_server``), for the floor app."""
    from ..serve.worker import uvicorn_server

    make: Any = uvicorn_server
    return make(headers_floor_app if headers else floor_app, sock)


def _bind(port: int) -> socket.socket:
    """The listening socket as ``ratewarden serve`` binds it (``serve.process._bind``: IPPROTO_TCP, so
    asyncio sets TCP_NODELAY on its connections)."""
    from ..serve import process

    bind: Any = process._bind
    sock: socket.socket = bind("127.0.0.1", port)
    return sock


async def _serve(http_port: int, grpc_port: int, headers: bool = False, spoe_port: int = 0,
                 front_port: int = 0) -> None:
    front = fixed_front(front_port) if front_port else None
    spoe_server = await start_floor_spoe(_bind(spoe_port)) if spoe_port else None
    sock = _bind(http_port) if http_port else None
    server = _server(sock, headers) if sock is not None else None
    grpc_server: Any = None
    if grpc_port:
        import grpc  # type: ignore[import-untyped, unused-ignore]
        from envoy.service.ratelimit.v3 import rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

        grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(floor_servicer(), grpc_server)
        grpc_server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await grpc_server.start()
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def stop() -> None:
        stopped.set()
        if server is not None:
            server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        if server is not None:
            await server.serve(sockets=[sock])
        else:
            await stopped.wait()
    finally:
        if front is not None:
            front.close()
        if spoe_server is not None:
            spoe_server.close()
        if grpc_server is not None:
            await grpc_server.stop(0.5)
        if sock is not None:
            sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden.bench.gateway_floor")
    parser.add_argument("--http", type=int, default=0, help="HTTP port (none when 0)")
    parser.add_argument("--grpc", type=int, default=0, help="gRPC port (none when 0)")
    parser.add_argument("--spoe", type=int, default=0, help="HAProxy SPOE agent port (none when 0)")
    parser.add_argument("--grpc-front", type=int, default=0,
                        help="gRPC port of the compiled front door answering every call allowed (none when 0)")
    parser.add_argument("--headers", action="store_true", help="answer with an allowed check's rate-limit headers")
    args = parser.parse_args(argv)
    if not (args.http or args.grpc or args.spoe or args.grpc_front):
        parser.error("give at least one of --http, --grpc, --spoe, --grpc-front")
    asyncio.run(_serve(args.http, args.grpc, args.headers, args.spoe, args.grpc_front))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
