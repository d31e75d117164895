"""Envoy's ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` over gRPC (grpc.aio), and
its JSON form (``POST /json``, as envoyproxy/ratelimit serves it).

Needs the ``serve`` extra (grpcio and xds-protos, the generated Envoy API); imported only by
``ratewarden serve``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.config.core.v3 import base_pb2  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from ..errors import LimitUnavailable
from ..stores.caller_deadline import CALLER_DEADLINE
from .bounds import GRPC_HANDSHAKE_TIMEOUT, GRPC_MAX_MESSAGE_SIZE, GRPC_TIMEOUT
from .rls import UINT32_MAX, RateLimitService, RequestDescriptor, RlsAnswer, RlsRequestError

__all__ = [
    "MAX_CONCURRENT_RPCS", "RlsServicer", "answer_to_proto", "request_from_proto",
    "rls_json", "start_grpc",
]

log = logging.getLogger("ratewarden.serve")

#: Calls one worker's Python door holds at once, over all its connections (grpc.aio's
#: ``maximum_concurrent_rpcs``), each from its headers' arrival to its answer; more are answered
#: RESOURCE_EXHAUSTED at once. A call still receiving its message holds up to ``--grpc-max-message-size``
#: in grpc core (which opens a stream's flow-control window to the size its message announces), so
#: unfinished messages hold at most this many times that (256 MiB by default), each for at most
#: ``start_grpc``'s ``timeout``. Envoy's rate limit filter waits 20 ms by default: 256 calls in flight
#: are far more than a worker answers in that time. (No per-connection stream limit
#: (``grpc.max_concurrent_streams``): grpc core resets the streams a new connection opens past it before
#: the client has read the server's SETTINGS, with REFUSED_STREAM, which grpcio's client reports as
#: UNAVAILABLE instead of retrying.)
MAX_CONCURRENT_RPCS = 256
_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"

_UNIT_NAMES: dict[int, str] = {
    number: name.lower()
    for name, number in rls_pb2.RateLimitResponse.RateLimit.Unit.items()
    if name != "UNKNOWN"
}
_UNIT_NUMBERS: dict[str, int] = {name: number for number, name in _UNIT_NAMES.items()}
_OK: int = rls_pb2.RateLimitResponse.OK
_OVER_LIMIT: int = rls_pb2.RateLimitResponse.OVER_LIMIT
_Status = rls_pb2.RateLimitResponse.DescriptorStatus
_RateLimit = rls_pb2.RateLimitResponse.RateLimit
_HeaderValue = base_pb2.HeaderValue


def request_from_proto(request: Any, service: RateLimitService | None = None) -> tuple[str, list[RequestDescriptor], int]:
    """``(domain, descriptors, hits_addend)`` of a ``RateLimitRequest``; ``RlsRequestError`` when malformed,
    or at once when larger than ``service`` accepts (``RateLimitService.check_size``).

    Args:
        request: The ``rls_pb2.RateLimitRequest``.
        service: The service whose bounds apply; ``None`` for none.
    """
    if service is not None:
        service.check_size(len(request.descriptors), 0)  # counted first: the count is known without a loop
        service.check_size(0, sum(len(descriptor.entries) for descriptor in request.descriptors))
    descriptors: list[RequestDescriptor] = []
    for index, descriptor in enumerate(request.descriptors):
        entries = tuple((entry.key, entry.value) for entry in descriptor.entries)
        limit: tuple[int, str] | None = None
        if descriptor.HasField("limit"):
            unit = _UNIT_NAMES.get(int(descriptor.limit.unit))
            if unit is None:
                raise RlsRequestError(
                    f"descriptor {index}: limit override unit must be one of "
                    f"{', '.join(u.upper() for u in _UNIT_NUMBERS)}, got {descriptor.limit.unit}"
                )
            limit = (int(descriptor.limit.requests_per_unit), unit)
        hits = int(descriptor.hits_addend.value) if descriptor.HasField("hits_addend") else None
        descriptors.append(RequestDescriptor(entries, limit, hits))
    return str(request.domain), descriptors, int(request.hits_addend)


def answer_to_proto(answer: RlsAnswer) -> Any:
    """The ``rls_pb2.RateLimitResponse`` of an answer.

    Args:
        answer: What ``RateLimitService.should_rate_limit`` returned.
    """
    statuses = []
    for status in answer.statuses:
        code = _OK if status.code == "OK" else _OVER_LIMIT
        remaining = min(status.limit_remaining, UINT32_MAX)
        current = status.current_limit
        if current is None:
            statuses.append(_Status(code=code, limit_remaining=remaining))
            continue
        statuses.append(_Status(
            code=code,
            current_limit=_RateLimit(
                name=current.name, requests_per_unit=current.requests_per_unit, unit=_UNIT_NUMBERS[current.unit]
            ),
            limit_remaining=remaining,
            duration_until_reset={"seconds": max(0, math.ceil(status.duration_until_reset))},
        ))
    response = rls_pb2.RateLimitResponse(
        overall_code=_OK if answer.overall_ok else _OVER_LIMIT,
        statuses=statuses,
        response_headers_to_add=[_HeaderValue(key=name, value=value) for name, value in answer.headers],
    )
    return response


class RlsServicer:
    """The ``RateLimitService`` servicer (grpc.aio) over a ``RateLimitService``.

    Args:
        service: What decides.
    """

    def __init__(self, service: RateLimitService) -> None:
        self.service = service

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        """Decide one request: INVALID_ARGUMENT when malformed, UNAVAILABLE when the store failed
        fail-closed, INTERNAL (logged) for anything unexpected."""
        try:
            domain, descriptors, hits = request_from_proto(request, self.service)
            answer = await self.service.should_rate_limit(domain, descriptors, hits)
        except RlsRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except LimitUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:
            log.exception("ShouldRateLimit failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return answer_to_proto(answer)


def _timed_handler(servicer: RlsServicer, timeout: float) -> Any:
    """``ShouldRateLimit`` as grpc.aio runs it, its message received under a deadline: the handler is
    a request-streaming one, which grpc.aio starts at the call's headers (a unary one starts only
    once its message is whole, so nothing could end a message that never finishes). It reads the one
    message within ``timeout`` of its start, else answers DEADLINE_EXCEEDED, which ends the call in
    grpc core (RST_STREAM) and frees what it had received; then it decides as ``servicer`` does.
    Only the first message counts, as grpc.aio's unary handlers read only the first."""

    active = 0  # calls started and not ended: grpc.aio's own cap is not applied to them by every grpcio

    async def should_rate_limit(requests: Any, context: Any) -> Any:
        nonlocal active
        if active >= MAX_CONCURRENT_RPCS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {MAX_CONCURRENT_RPCS} calls at once in this worker",
            )
        active += 1
        try:
            return await decide(context)
        finally:
            active -= 1

    async def decide(context: Any) -> Any:
        read = asyncio.ensure_future(context.read())
        try:
            done, _ = await asyncio.wait((read,), timeout=timeout)
        finally:
            read.add_done_callback(_retrieved)  # it ends with the call, whatever ends the call
        if not done:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no whole request within {timeout:.3f} s")
        raw = read.result()
        if raw is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INTERNAL, "the call ended without its request message")
        try:
            request = rls_pb2.RateLimitRequest.FromString(raw)
        except DecodeError as exc:  # as the compiled door answers bytes that are no request
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"failed to decode Protobuf message: {exc}")
        remaining = context.time_remaining()
        if remaining is not None:  # this call's Task only: its store calls are never sent past it
            CALLER_DEADLINE.set(asyncio.get_running_loop().time() + remaining)
        return await servicer.ShouldRateLimit(request, context)

    return grpc.stream_unary_rpc_method_handler(
        should_rate_limit,
        request_deserializer=None,  # the bytes, decoded above: a DecodeError is the caller's
        response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
    )


def _retrieved(read: asyncio.Future[Any]) -> None:
    """Retrieve a read's outcome, so a read left behind by a deadline never logs "never retrieved"."""
    if not read.cancelled():
        read.exception()


async def start_grpc(
    service: RateLimitService, host: str = "127.0.0.1", port: int = 8081, *, reuse_port: bool = False,
    max_message_size: int = GRPC_MAX_MESSAGE_SIZE, handshake_timeout: float = GRPC_HANDSHAKE_TIMEOUT,
    timeout: float = GRPC_TIMEOUT,
) -> tuple[grpc.aio.Server, int]:
    """Start Envoy's rate limit service on ``host:port`` (port 0: any free port); returns the
    started server and its port. Stop it with ``await server.stop(grace)``.

    Args:
        service: What decides.
        host: The address to listen on.
        port: The port; 0 picks a free one.
        reuse_port: Let several processes listen on the port (``SO_REUSEPORT``, for workers); off,
            a port in use is an error.
        max_message_size: The largest request accepted, in bytes (larger: RESOURCE_EXHAUSTED, unread).
        handshake_timeout: Seconds for a new connection to send HTTP/2's preface and SETTINGS (then
            grpc core closes it; its own default is 120 s).
        timeout: Seconds from a call's headers to its message's last byte; then DEADLINE_EXCEEDED,
            the call ended and what it sent freed (a caller's shorter ``grpc-timeout`` ends it sooner,
            in grpc core). The decision itself is not timed here.
    """
    options = [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.server_handshake_timeout_ms", max(1, round(handshake_timeout * 1000))),
    ]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    handlers = {"ShouldRateLimit": _timed_handler(RlsServicer(service), timeout)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio 1.63+: the method's lookup skips the generic one
        server.add_registered_method_handlers(_SERVICE, handlers)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = int(server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (in use?)")
    await server.start()
    return server, bound


async def rls_json(service: RateLimitService, body: bytes) -> tuple[int, bytes]:
    """``ShouldRateLimit`` with a JSON ``RateLimitRequest`` (proto3 JSON mapping): 200 and the JSON
    ``RateLimitResponse`` when OK, 429 when over the limit, 400 for a bad request, 503 when the
    store failed fail-closed.

    Args:
        service: What decides.
        body: The request body.
    """
    request = rls_pb2.RateLimitRequest()
    try:
        json_format.Parse(body.decode("utf-8"), request)
        domain, descriptors, hits = request_from_proto(request, service)
        answer = await service.should_rate_limit(domain, descriptors, hits)
    except (json_format.ParseError, UnicodeDecodeError, RlsRequestError, RecursionError) as exc:
        return 400, _error(f"bad request: {exc}")
    except LimitUnavailable as exc:
        return 503, _error(str(exc))
    text = json_format.MessageToJson(answer_to_proto(answer), indent=None)
    return (200 if answer.overall_ok else 429), text.encode()


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
