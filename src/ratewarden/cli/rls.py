"""``ratewarden rls``: one ``ShouldRateLimit`` call to Envoy's rate limit service (``ratewarden serve``,
envoyproxy/ratelimit or any other), its answer printed; docs/gateways/envoy.md#try-it-without-envoy."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["register"]

_EPILOG = """\
exit status: 0 when the answer is OK, 1 when it is OVER_LIMIT, 2 on a usage error or when the
call fails (its gRPC status and message are printed, e.g. UNAVAILABLE when nothing listens).

example: ratewarden rls --domain rl --descriptor foo=foo,bar=bar
"""
_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")
_UINT32_MAX = 2**32 - 1  # hits_addend and requests_per_unit are uint32


class _Descriptor(argparse.Action):
    """``--descriptor KEY=VALUE[,KEY=VALUE...]``: one descriptor, its entries in order."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        entries = [pair.partition("=") for pair in str(value).split(",")]
        if any(not key or not eq for key, eq, _ in entries):
            raise argparse.ArgumentError(self, f"{value!r}: expected KEY=VALUE[,KEY=VALUE...], each KEY not empty")
        namespace.descriptors = [*(namespace.descriptors or []), ([(k, v) for k, _, v in entries], None)]


class _Limit(argparse.Action):
    """``--limit N/UNIT``: the rate of the ``--descriptor`` before it (the request's ``limit`` override)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        count, _, unit = str(value).partition("/")
        if not count.isdigit() or int(count) > _UINT32_MAX or unit.lower() not in _UNITS:
            raise argparse.ArgumentError(self, f"{value!r}: expected N/UNIT, UNIT one of {', '.join(_UNITS)}")
        if not namespace.descriptors or namespace.descriptors[-1][1] is not None:
            raise argparse.ArgumentError(self, "must follow the --descriptor it overrides (one --limit each)")
        entries, _ = namespace.descriptors[-1]
        namespace.descriptors[-1] = (entries, (int(count), unit.upper()))


def register(subparsers: Any) -> None:
    """Add the ``rls`` command."""
    from . import COMMANDS

    parser = subparsers.add_parser(
        "rls", help=COMMANDS["rls"][1], description=COMMANDS["rls"][1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--domain", required=True, help="the configuration's domain, e.g. rl")
    parser.add_argument(
        "--descriptor", action=_Descriptor, required=True, dest="descriptors", metavar="KEY=VALUE[,KEY=VALUE...]",
        help="one descriptor, its entries in order (repeatable: one per descriptor)",
    )
    parser.add_argument(
        "--limit", action=_Limit, metavar="N/UNIT",
        help="override the rate of the --descriptor before it, e.g. 10/minute (Envoy's descriptor limit)",
    )
    parser.add_argument("--hits", type=int, default=1, metavar="N", help="hits_addend, the cost (default 1)")
    parser.add_argument("--address", default="127.0.0.1:8081", metavar="HOST:PORT",
                        help="the service's gRPC address (default %(default)s, ratewarden serve's)")
    parser.add_argument("--timeout", type=float, default=1.0, metavar="SECONDS",
                        help="the call's deadline (default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the answer as JSON, as POST /json answers (proto3 JSON mapping)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        import grpc  # type: ignore[import-untyped]
        from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
        from google.protobuf import json_format  # type: ignore[import-untyped]
    except ImportError as exc:
        print(f"ratewarden rls needs grpcio and the generated Envoy API (xds-protos): "
              f"pip install 'ratewarden[serve]' ({exc})", file=sys.stderr)
        return 2
    if not 0 <= args.hits <= _UINT32_MAX or not args.timeout > 0:
        print(f"ratewarden rls: --hits must be 0 to {_UINT32_MAX}, --timeout more than 0", file=sys.stderr)
        return 2
    descriptors = []
    for entries, limit in args.descriptors:
        descriptor = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
        )
        if limit is not None:
            descriptor.limit.requests_per_unit = limit[0]
            descriptor.limit.unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Value(limit[1])
        descriptors.append(descriptor)
    request = rls_pb2.RateLimitRequest(domain=args.domain, descriptors=descriptors, hits_addend=args.hits)
    with grpc.insecure_channel(args.address) as channel:
        try:
            answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=args.timeout)
        except grpc.RpcError as exc:
            print(_failure(exc.code().name, exc.details() or "", args), file=sys.stderr)
            return 2
    text = json_format.MessageToJson(answer, indent=None) if args.json else _readable(answer, args.descriptors, rls_pb2)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # a reader that stopped early (| head): the exit status still tells
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if not any(status.HasField("current_limit") for status in answer.statuses):
        print(f"ratewarden rls: no limit applies to this call: a domain ({args.domain!r}) or descriptor the "
              "service's configuration does not have is answered OK, as an unlimited one is", file=sys.stderr)
    return 0 if answer.overall_code == rls_pb2.RateLimitResponse.OK else 1


def _failure(code: str, details: str, args: argparse.Namespace) -> str:
    """What a failed call prints: its gRPC status and message, and a hint where one helps."""
    hint = {
        "UNAVAILABLE": f"is `ratewarden serve` running, with an Envoy configuration, on --grpc {args.address}?",
        "DEADLINE_EXCEEDED": f"no answer within --timeout {args.timeout:g}s",
        "UNIMPLEMENTED": f"{args.address} does not serve envoy.service.ratelimit.v3.RateLimitService",
    }.get(code)
    return f"ratewarden rls: {args.address}: {code}: {json.dumps(details)}" + (f" ({hint})" if hint else "")


def _readable(answer: Any, sent: list[tuple[list[tuple[str, str]], Any]], rls_pb2: Any) -> str:
    """The answer as lines: the overall code, each descriptor's status, the headers to add."""
    code_name = rls_pb2.RateLimitResponse.Code.Name
    lines = [code_name(answer.overall_code)]
    for index, status in enumerate(answer.statuses):
        entries = ",".join(f"{k}={v}" for k, v in sent[index][0]) if index < len(sent) else f"#{index}"
        if status.HasField("current_limit"):
            limit = status.current_limit
            unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name(limit.unit).lower()
            name = f" ({limit.name})" if limit.name else ""
            what = (f"limit {limit.requests_per_unit}/{unit}{name}, {status.limit_remaining} remaining, "
                    f"reset in {status.duration_until_reset.seconds}s")
        else:
            what = "no limit"
        lines.append(f"  {entries}: {code_name(status.code)}, {what}")
    if answer.response_headers_to_add:
        lines += ["headers:", *(f"  {h.key}: {h.value}" for h in answer.response_headers_to_add)]
    return "\n".join(lines)
