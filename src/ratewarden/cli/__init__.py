"""The ``ratewarden`` command line (stdlib argparse, so the core stays dependency-free).

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser and
sets ``func`` (``args -> exit status``). Modules are imported only when their command runs (or for
``ratewarden <command> --help``), so ``ratewarden --help`` stays fast. To add a command, add one
line to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["COMMANDS", "main", "register_demo", "version_text"]

# name -> ("module:register function", one-line help shown by ``ratewarden --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ratewarden.cli:register_demo", "serve a demo app, send it bursts of requests and print what was limited"),
    "bench": ("ratewarden.cli.bench:register", "benchmark ratewarden against traffik, slowapi and no limiter"),
    "check": ("ratewarden.cli.policy:register_check", "validate a policy file and print its effective rules"),
    "explain": ("ratewarden.cli.policy:register_explain", "show which rules and limits a request would get"),
    "serve": ("ratewarden.cli.serve:register", "run the decision service for gateways (Envoy gRPC, nginx, HAProxy, Traefik)"),
    "rls": ("ratewarden.cli.rls:register", "send one Envoy ShouldRateLimit call over gRPC and print the answer"),
}

Subparsers = Any  # argparse's _SubParsersAction is private


def register_demo(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("demo", help=COMMANDS["demo"][1], add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        from . import demo

        status: int = demo.main(args.rest)
        return status

    parser.set_defaults(func=run)


def version_text() -> str:
    """``ratewarden --version``: the version and whether the hot path is mypyc-compiled."""
    import platform

    import ratewarden

    return f"ratewarden {ratewarden.__version__} ({ratewarden.build_description()}), Python {platform.python_version()}"


def _parser() -> tuple[argparse.ArgumentParser, Subparsers]:
    parser = argparse.ArgumentParser(
        prog="ratewarden",
        description="Rate limiting for ASGI and WSGI apps (FastAPI, Starlette, Flask, Django) and, "
        "with `ratewarden serve`, for gateways (Envoy, nginx, HAProxy, Traefik).",
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, sub


def _load(name: str) -> Callable[[Subparsers], None]:
    target, _ = COMMANDS[name]
    module, _, attr = target.partition(":")
    register: Callable[[Subparsers], None] = getattr(importlib.import_module(module), attr)
    return register


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        # The demo parses its own arguments (including --help); hand them over untouched.
        from . import demo

        status: int = demo.main(argv[1:])
        return status
    parser, sub = _parser()
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in COMMANDS:
        try:
            _load(command)(sub)
        except ImportError as exc:
            print(f"ratewarden {command}: cannot load the command ({exc}); "
                  f"is the matching extra installed?", file=sys.stderr)
            return 2
    else:
        for name, (_, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no command: usage on stderr and status 2, as argparse does for a missing argument
        parser.print_help(sys.stderr)
        print("ratewarden: error: a command is required (ratewarden COMMAND --help for its options)", file=sys.stderr)
        return 2
    try:
        status = func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return status

