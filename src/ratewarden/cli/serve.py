"""``ratewarden serve``: the decision service for gateways (docs/serve.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]

_EPILOG = """\
endpoints: /check (nginx auth_request, Traefik ForwardAuth, HAProxy), POST /v1/check (JSON),
POST /json (Envoy RLS as JSON), /healthz, /metrics; gRPC: envoy.service.ratelimit.v3.
Signals: SIGHUP reloads every file, SIGTERM/SIGINT stop gracefully (exit status 0).
"""


def register(subparsers: Any) -> None:
    """Add the ``serve`` command."""
    from . import COMMANDS

    parser = subparsers.add_parser(
        "serve", help=COMMANDS["serve"][1], description=COMMANDS["serve"][1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "files", nargs="+", metavar="FILE", type=Path,
        help="a ratewarden policy file (.toml/.yaml, at most one: /check and /v1/check), or envoyproxy/ratelimit "
        "YAML files or directories of them (gRPC and /json)",
    )
    parser.add_argument("--http", default="127.0.0.1:8080", metavar="HOST:PORT", help="HTTP address (default %(default)s)")
    parser.add_argument(
        "--grpc", default="127.0.0.1:8081", metavar="HOST:PORT",
        help="gRPC address, served when Envoy configurations are given (default %(default)s)",
    )
    parser.add_argument(
        "--spoe", metavar="HOST:PORT",
        help="also answer HAProxy's SPOE (Stream Processing Offload) agent protocol here, with the policy "
        "(see docs/gateways/haproxy.md)",
    )
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes on one port (default 1)")
    parser.add_argument(
        "--store", metavar="URL",
        help="where counts live: redis://, redis+cluster://, memcached://, shm://NAME, memory:// "
        "(default: memory:// for one worker, a shared-memory table for several)",
    )
    parser.add_argument(
        "--trusted-proxy", action="append", metavar="CIDR", dest="trusted",
        help="callers whose X-Real-IP/X-Forwarded-For are believed (repeatable; default 127.0.0.1/32 and ::1)",
    )
    parser.add_argument("--on-error", choices=("open", "closed"), default="open",
                        help="when the store fails: open = limit per worker, closed = answer 503 (default open)")
    parser.add_argument("--no-metrics", action="store_true", help="keep no Prometheus metrics (/metrics answers 404)")
    parser.add_argument("--log-format", choices=("json", "text"), default="json", help="log lines (default json)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.add_argument(
        "--watch", type=float, default=1.0, metavar="SECONDS",
        help="check the files for changes this often, 0 to disable (default 1; SIGHUP always reloads)",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..errors import ConfigurationError
    from ..serve.http import DEFAULT_TRUSTED
    from ..serve.process import ServeConfig, envoy_files, parse_address, run

    try:
        policy, envoy = envoy_files(args.files)
        config = ServeConfig(
            policy=policy,
            envoy=envoy,
            http=parse_address(args.http, "--http"),
            grpc=parse_address(args.grpc, "--grpc"),
            spoe=parse_address(args.spoe, "--spoe") if args.spoe else None,
            workers=args.workers,
            store=args.store,
            trusted_proxies=tuple(args.trusted) if args.trusted else DEFAULT_TRUSTED,
            log_format=args.log_format,
            log_level=args.log_level,
            watch=args.watch,
            on_error=args.on_error,
            metrics=not args.no_metrics,
        )
        if args.watch < 0:
            raise ConfigurationError(f"--watch must be 0 or more seconds, got {args.watch}")
    except ConfigurationError as exc:
        print(f"ratewarden serve: {exc}", file=sys.stderr)
        return 2
    return run(config)
