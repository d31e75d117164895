"""The gateway bench's floor service: ``ratewarden serve``'s own stack answering a fixed OK.

Run as ``python -m ratewarden.bench.gateway_floor --http PORT [--grpc PORT]``. It serves exactly as a
``ratewarden serve`` worker does (``serve.process``: uvicorn on asyncio's loop with httptools, no
lifespan, access log, server or date header; a pre-bound listening socket; ``grpc.aio`` in the same
event loop), but the HTTP app answers every request with a fixed ``200`` and an empty body and the
gRPC servicer every ``ShouldRateLimit`` with a fixed ``OK``, checking nothing. The capacity ratio
ours / floor is then the cost of deciding, nothing else.

With ``--headers`` the fixed ``200`` also carries the rate-limit headers an allowed ``/check`` answer
does (``DECISION_HEADERS``: the same names, values of the same length), so the ratio against it is the
decision alone, without the cost of writing the headers every gateway answer must carry.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from typing import Any

from ..types import ASGIApp, Receive, Scope, Send

__all__ = ["DECISION_HEADERS", "fixed_ok", "floor_app", "floor_servicer", "headers_floor_app", "main"]

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


def _server(sock: socket.socket, headers: bool) -> Any:
    """The uvicorn server ``ratewarden serve`` builds (``serve.process._uvicorn_server``), for the floor app."""
    from ..serve import process

    make: Any = process._uvicorn_server
    return make(headers_floor_app if headers else floor_app, sock)


def _bind(port: int) -> socket.socket:
    """The listening socket as ``ratewarden serve`` binds it (``serve.process._bind``: IPPROTO_TCP, so
    asyncio sets TCP_NODELAY on its connections)."""
    from ..serve import process

    bind: Any = process._bind
    sock: socket.socket = bind("127.0.0.1", port)
    return sock


async def _serve(http_port: int, grpc_port: int, headers: bool = False) -> None:
    sock = _bind(http_port)
    server = _server(sock, headers)
    grpc_server: Any = None
    if grpc_port:
        import grpc  # type: ignore[import-untyped, unused-ignore]
        from envoy.service.ratelimit.v3 import rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

        grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(floor_servicer(), grpc_server)
        grpc_server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await grpc_server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    try:
        await server.serve(sockets=[sock])
    finally:
        if grpc_server is not None:
            await grpc_server.stop(0.5)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden.bench.gateway_floor")
    parser.add_argument("--http", type=int, required=True, help="HTTP port")
    parser.add_argument("--grpc", type=int, default=0, help="gRPC port (none when 0)")
    parser.add_argument("--headers", action="store_true", help="answer with an allowed check's rate-limit headers")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.http, args.grpc, args.headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
