"""``ratewarden serve``: the decision service for gateways (docs/serve.md)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

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
    for name, action in ((None, _Given), ("store", _Given), ("store_true", _GivenFlag)):
        parser.register("action", name, action)  # every option given is noted in ``args.given``
    parser.add_argument(
        "files", nargs="*", metavar="FILE", type=Path,
        help="a ratewarden policy file (.toml/.yaml, at most one: /check and /v1/check), or envoyproxy/ratelimit "
        "YAML files or directories of them (gRPC and /json); with --envoy-env, the Envoy files come from "
        "the reference's RUNTIME_ROOT unless some are given",
    )
    parser.add_argument("--http", default="127.0.0.1:8080", metavar="HOST:PORT", help="HTTP address (default %(default)s)")
    parser.add_argument(
        "--grpc", metavar="HOST:PORT",
        help=f"gRPC address, served when Envoy configurations are given (default {_GRPC_DEFAULT}; without "
        "one, an error)",
    )
    parser.add_argument(
        "--spoe", metavar="HOST:PORT",
        help="also answer HAProxy's SPOE (Stream Processing Offload) agent protocol here, with the policy "
        "(see docs/gateways/haproxy.md)",
    )
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes on one port (default 1)")
    parser.add_argument(
        "--front", choices=("auto", "compiled", "python"), default="auto",
        help="the gRPC front door: compiled = ratewarden._front (built from rust/), python = grpc.aio, auto = "
        "compiled when it is installed (default %(default)s; docs/serve.md#the-compiled-front-door)",
    )
    parser.add_argument(
        "--http-front", choices=("auto", "python", "compiled"), default="auto",
        help="the HTTP server: compiled = hyper in ratewarden._front, answering with the same app; python = "
        "uvicorn; auto = compiled when ratewarden._front imports (default %(default)s; "
        "docs/serve.md#the-compiled-front-door)",
    )
    parser.add_argument(
        "--spoe-front", choices=("auto", "python", "compiled"), default="auto",
        help="the SPOE agent (--spoe): compiled = tokio in ratewarden._front, answering with the same "
        "decisions; python = asyncio; auto = compiled when ratewarden._front imports (default %(default)s; "
        "docs/serve.md#the-compiled-front-door)",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0,
        help="print the version and which gRPC front door --front would run (and why not the compiled one)",
    )
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
    _add_envoy(parser)
    _add_bounds(parser)
    parser.set_defaults(func=_run)


_GRPC_DEFAULT = "127.0.0.1:8081"


class _Given(argparse.Action):
    """argparse's ``store``, noting the option's destination in ``args.given``: an option that cannot
    take effect is refused only when the command line gave it (``_check_combinations``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


class _GivenFlag(_Given):
    """argparse's ``store_true``, noted as ``_Given`` is."""

    def __init__(self, option_strings: list[str], dest: str, default: bool = False, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, **kwargs)


class _Version(argparse.Action):
    """``ratewarden serve --version``: the version, then the front door each of ``--front``,
    ``--http-front`` and ``--spoe-front`` (as given so far on the command line, else ``auto``) would run."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        from ..serve.front import DOORS, describe
        from . import version_text

        print(version_text())
        for door in DOORS:  # each as given so far on the command line, else auto
            print(describe(getattr(namespace, door[2:].replace("-", "_"), None) or "auto", door))
        parser.exit()


def _add_envoy(parser: argparse.ArgumentParser) -> None:
    """How the gRPC service answers where envoyproxy/ratelimit answers otherwise (docs/gateways/envoy.md)."""
    group = parser.add_argument_group("Envoy rate limit service (docs/gateways/envoy.md#compatibility)")
    group.add_argument(
        "--envoy-headers", choices=("ratewarden", "reference", "none"), default="ratewarden",
        help="response headers: ratewarden = RateLimit, RateLimit-Policy, X-RateLimit-* and Retry-After; "
        "reference = envoyproxy/ratelimit's RateLimit-Limit/-Remaining/-Reset; none (default %(default)s)",
    )
    group.add_argument(
        "--envoy-charge", choices=("all", "each"), default="all",
        help="all = a request's descriptors are charged all or nothing; each = each on its own, a refused "
        "request too, as envoyproxy/ratelimit (default %(default)s)",
    )
    group.add_argument(
        "--envoy-merge-domains", action="store_true",
        help="merge files of the same domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG) instead of refusing them",
    )
    group.add_argument(
        "--envoy-env", action="store_true",
        help="read envoyproxy/ratelimit's settings from the environment, with its defaults (RUNTIME_ROOT..., "
        "REDIS_*, PORT, GRPC_PORT, USE_PROMETHEUS...); options given here win (docs/gateways/envoy.md#moving-from-"
        "envoyproxyratelimit)",
    )


#: The bounds options (docs/serve.md#bounds): each ``--<name>`` defaults to ``bounds.<NAME>``.
_BOUNDS: tuple[tuple[str, Callable[[str], object], str, str], ...] = (
    ("http_max_connections", int, "N",
     "open HTTP connections; one more is answered 503 and closed (default %(default)s)"),
    ("http_timeout", float, "SECONDS",
     "to send a whole request once it begins, else 408 and closed (default %(default)s)"),
    ("http_max_header_size", int, "BYTES",
     "of a request's line and headers, else 431 and closed (default %(default)s)"),
    ("spoe_max_connections", int, "N",
     "open SPOE connections; one more is disconnected (default %(default)s)"),
    ("spoe_timeout_hello", float, "SECONDS",
     "for a new SPOE connection to send its HELLO (default %(default)s)"),
    ("spoe_timeout_idle", float, "SECONDS",
     "an SPOE connection may wait between frames; keep it above spoe.conf's timeout idle (default %(default)s)"),
    ("spoe_timeout_frame", float, "SECONDS",
     "to finish an SPOE frame once begun (default %(default)s)"),
    ("spoe_message", str, "NAME",
     "the spoe-message decided, one per NOTIFY frame (default %(default)s, as spoe.conf)"),
    ("grpc_max_message_size", int, "BYTES",
     "of a gRPC request, else RESOURCE_EXHAUSTED (default %(default)s)"),
    ("grpc_max_connections", int, "N",
     "open gRPC connections, compiled front door; one more is closed (default %(default)s)"),
    ("grpc_timeout", float, "SECONDS",
     "from a gRPC request's arrival to its answer (the Python door: to its message's last byte), else "
     "DEADLINE_EXCEEDED; a caller's shorter grpc-timeout applies instead (default %(default)s)"),
    ("grpc_handshake_timeout", float, "SECONDS",
     "for a new gRPC connection to send HTTP/2's preface and SETTINGS, else it is closed (default %(default)s)"),
    ("max_descriptors", int, "N",
     "in one Envoy rate limit request, else INVALID_ARGUMENT (default %(default)s)"),
    ("max_entries", int, "N",
     "in one Envoy rate limit request, over its descriptors (default %(default)s)"),
)
#: The bounds that must be more than 0 (every one but the spoe-message's name).
_POSITIVE = tuple(name for name, kind, _, _ in _BOUNDS if kind is not str)


def _add_bounds(parser: argparse.ArgumentParser) -> None:
    """The bounds on what one caller can make a worker hold (docs/serve.md#bounds)."""
    from ..serve import bounds

    group = parser.add_argument_group("bounds (per worker; docs/serve.md#bounds)")
    for name, kind, metavar, text in _BOUNDS:
        group.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(bounds, name.upper()),
                           metavar=metavar, help=text)


#: Options of Envoy's rate limit API (gRPC and ``POST /json``), and of the SPOE agent: each without
#: what it applies to cannot take effect, and is refused (``_check_combinations``).
_ENVOY_ONLY = ("grpc", "front", "envoy_headers", "envoy_charge", "envoy_merge_domains", "grpc_max_message_size",
               "grpc_max_connections", "grpc_timeout", "grpc_handshake_timeout", "max_descriptors", "max_entries")
_SPOE_ONLY = ("spoe_front", "spoe_max_connections", "spoe_timeout_hello", "spoe_timeout_idle", "spoe_timeout_frame",
              "spoe_message")
_ENVOY_FILES = ("an Envoy ratelimit configuration: give its YAML file (one with a top-level `domain:`) or a "
                "directory of them among the FILEs")


def _check_combinations(args: argparse.Namespace, envoy: bool) -> None:
    """Refuse an option the command line gave that cannot take effect, naming what it needs: gRPC's
    and Envoy's options without an Envoy configuration, the SPOE agent's without ``--spoe``, the
    compiled gRPC front door's connection cap with ``--front python``."""
    given: set[str] = getattr(args, "given", set())
    for dest in _ENVOY_ONLY:
        option = f"--{dest.replace('_', '-')}"
        if dest not in given or envoy:
            continue
        if dest == "grpc":
            raise ConfigurationError(
                f"--grpc {args.grpc}: gRPC serves Envoy's rate limit API, which needs {_ENVOY_FILES}; or leave out "
                "--grpc (a ratewarden policy is served over --http and --spoe)"
            )
        what = ("chooses the gRPC front door (--http-front and --spoe-front choose the others), which runs only"
                if dest == "front" else "applies to Envoy's rate limit API (gRPC and POST /json), which runs only")
        raise ConfigurationError(f"{option} {what} with {_ENVOY_FILES}; or leave out {option}")
    for dest in _SPOE_ONLY:
        if dest in given and args.spoe is None:
            option = f"--{dest.replace('_', '-')}"
            raise ConfigurationError(
                f"{option} applies to the SPOE agent, which runs only with --spoe HOST:PORT: give --spoe, or leave out {option}"
            )
    if {"grpc_max_connections", "front"} <= given and args.front == "python":
        raise ConfigurationError(
            "--grpc-max-connections caps the compiled gRPC front door's connections, and --front python has no "
            "such cap: use --front compiled (or auto), or leave out --grpc-max-connections"
        )


#: What the service imports, by the package that brings it (all in the ``serve`` extra).
_HTTP_NEEDS = (("uvicorn", "uvicorn"),)
_YAML_NEEDS = (("yaml", "PyYAML"),)
_GRPC_NEEDS = (("grpc", "grpcio"), ("envoy.service.ratelimit.v3", "xds-protos"), ("google.protobuf", "protobuf"))


def _missing(needs: tuple[tuple[str, str], ...]) -> list[str]:
    """The packages of ``needs`` whose module cannot be imported."""
    missing = []
    for module, package in needs:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a submodule whose parent package is missing
            found = False
        if not found:
            missing.append(package)
    return missing


def _check_installed(needs: tuple[tuple[str, str], ...], what: str) -> None:
    """Refuse to start without the ``serve`` extra, before anything is bound or forked."""
    missing = _missing(needs)
    if missing:
        raise ConfigurationError(
            f"{what} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            "pip install 'ratewarden[serve]'"
        )


def _envoy_env(args: argparse.Namespace, envoy: list[Path]) -> dict[str, Any]:
    """``--envoy-env``: the reference's settings read into ``args`` (where the command line gave no
    option) and what ``ServeConfig`` takes beyond them."""
    if not args.envoy_env:
        if not args.files:
            raise ConfigurationError("the following arguments are required: FILE (or --envoy-env)")
        return {}
    from ..serve.envoy_env import apply_envoy_env

    _check_installed(_YAML_NEEDS, "--envoy-env (envoyproxy/ratelimit's YAML)")
    found = apply_envoy_env(args, os.environ, runtime=not envoy)
    return {"runtime": found.runtime, "reference": found.reference, "key_prefix": found.key_prefix,
            "notes": tuple(found.notes)}


def _run(args: argparse.Namespace) -> int:
    from ..serve.config import ServeConfig, envoy_files, parse_address
    from ..serve.http import DEFAULT_TRUSTED
    from ..serve.process import run

    try:
        _check_installed(_HTTP_NEEDS, "the HTTP server")
        if any(path.is_dir() or path.suffix.lower() in (".yaml", ".yml") for path in args.files):
            _check_installed(_YAML_NEEDS, "a YAML file")
        policy, envoy = envoy_files(args.files)
        extra = _envoy_env(args, envoy)
        if envoy or extra:
            _check_installed(_GRPC_NEEDS, "an Envoy configuration (served over gRPC)")
        config = ServeConfig(
            policy=policy,
            envoy=envoy,
            http=parse_address(args.http, "--http"),
            grpc=parse_address(args.grpc or _GRPC_DEFAULT, "--grpc"),
            spoe=parse_address(args.spoe, "--spoe") if args.spoe else None,
            workers=args.workers,
            front=args.front,
            http_front=args.http_front,
            spoe_front=args.spoe_front,
            store=args.store,
            trusted_proxies=tuple(args.trusted) if args.trusted else DEFAULT_TRUSTED,
            log_format=args.log_format,
            log_level=args.log_level,
            watch=args.watch,
            on_error=args.on_error,
            metrics=not args.no_metrics,
            envoy_headers=args.envoy_headers,
            envoy_charge=args.envoy_charge,
            envoy_merge_domains=args.envoy_merge_domains,
            **{name: getattr(args, name) for name in (*_POSITIVE, "spoe_message")},
            **extra,
        )
        if args.watch < 0:
            raise ConfigurationError(f"--watch must be 0 or more seconds, got {args.watch}")
        for name in _POSITIVE:
            if not getattr(args, name) > 0:
                raise ConfigurationError(f"--{name.replace('_', '-')} must be more than 0, got {getattr(args, name)}")
        if not args.spoe_message:
            raise ConfigurationError("--spoe-message must name the spoe-message, e.g. check")
        _check_combinations(args, config.serves_envoy)
        from ..serve.front import choose_front

        for option, requested in (("--front", args.front), ("--http-front", args.http_front),
                                  ("--spoe-front", args.spoe_front)):
            choose_front(requested, option)  # compiled asked for and missing: exit 2, saying why
    except ConfigurationError as exc:
        print(f"ratewarden serve: {exc}", file=sys.stderr)
        return 2
    return run(config)
