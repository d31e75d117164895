"""What ``ratewarden serve`` runs: its options (``ServeConfig``), the files it is given sorted into
the ratewarden policy and Envoy ratelimit YAML (``envoy_files``, ``load_envoy``) and its listening
addresses (``parse_address``, ``bind_listener``, ``check_listen``, ``listen_error``: a listener that
cannot be opened is one ``ConfigurationError`` naming the option, the address, why and the fix)."""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..limiter import FailurePolicy
from . import bounds
from .http import DEFAULT_TRUSTED

if TYPE_CHECKING:
    from .envoy_runtime import RuntimeLayout
    from .reference_service import ReferenceOptions

__all__ = [
    "ServeConfig", "bind_listener", "check_listen", "envoy_files", "format_address", "listen_error", "load_envoy",
    "parse_address",
]

_YAML = (".yaml", ".yml")


@dataclass
class ServeConfig:
    """What ``ratewarden serve`` runs (its command-line options)."""

    policy: Path | None = None
    envoy: list[Path] = field(default_factory=list)
    http: tuple[str, int] = ("127.0.0.1", 8080)
    grpc: tuple[str, int] | None = None
    spoe: tuple[str, int] | None = None
    workers: int = 1
    front: str = "auto"  # auto | compiled | python: the gRPC front door (serve.front.FRONTS)
    http_front: str = "auto"  # auto | python | compiled: the HTTP server (serve.front.FRONTS)
    spoe_front: str = "auto"  # auto | python | compiled: the SPOE agent (serve.front.FRONTS)
    store: str | None = None
    trusted_proxies: Sequence[str] = DEFAULT_TRUSTED
    log_format: str = "json"
    log_level: str = "info"
    watch: float = 1.0
    on_error: FailurePolicy = "open"
    metrics: bool = True
    http_max_connections: int = bounds.HTTP_MAX_CONNECTIONS
    http_timeout: float = bounds.HTTP_TIMEOUT
    http_max_header_size: int = bounds.HTTP_MAX_HEADER_SIZE
    spoe_max_connections: int = bounds.SPOE_MAX_CONNECTIONS
    spoe_timeout_hello: float = bounds.SPOE_TIMEOUT_HELLO
    spoe_timeout_idle: float = bounds.SPOE_TIMEOUT_IDLE
    spoe_timeout_frame: float = bounds.SPOE_TIMEOUT_FRAME
    spoe_message: str = bounds.SPOE_MESSAGE
    grpc_max_message_size: int = bounds.GRPC_MAX_MESSAGE_SIZE
    grpc_max_connections: int = bounds.GRPC_MAX_CONNECTIONS
    grpc_timeout: float = bounds.GRPC_TIMEOUT
    grpc_handshake_timeout: float = bounds.GRPC_HANDSHAKE_TIMEOUT
    max_descriptors: int = bounds.MAX_DESCRIPTORS
    max_entries: int = bounds.MAX_ENTRIES
    envoy_headers: str = "ratewarden"  # ratewarden | reference | none (serve.rls.HEADER_STYLES)
    envoy_charge: str = "all"  # all | each (serve.rls.CHARGES)
    envoy_merge_domains: bool = False
    #: ``--envoy-env`` (``serve.envoy_env``): the Envoy configuration read from the reference's runtime
    #: directory (files listed again at each reload), its service-wide settings, ``CACHE_KEY_PREFIX``
    #: and the settings named at start-up as not supported.
    runtime: RuntimeLayout | None = None
    reference: ReferenceOptions | None = None
    key_prefix: str | None = None
    notes: Sequence[tuple[str, str]] = ()

    @property
    def serves_envoy(self) -> bool:
        """Whether Envoy's rate limit API is served: Envoy files given, or the reference's runtime directory."""
        return bool(self.envoy) or self.runtime is not None

    def envoy_paths(self) -> list[Path]:
        """The Envoy configuration files now: those given, or those in the runtime directory."""
        return self.runtime.files() if self.runtime is not None else list(self.envoy)


def envoy_files(paths: Sequence[Path]) -> tuple[Path | None, list[Path]]:
    """Sort ``paths`` into the ratewarden policy file (at most one) and Envoy ratelimit YAML files
    (a directory is read for ``*.yaml``/``*.yml``; a YAML file with a top-level ``domain`` is Envoy's).

    Args:
        paths: The command line's files and directories.
    """
    policy: Path | None = None
    envoy: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in _YAML and p.is_file())
            if not found:
                raise ConfigurationError(f"{path}: no .yaml or .yml file in this directory")
            envoy.extend(found)
            continue
        if not path.is_file():
            raise ConfigurationError(f"{path}: no such file")
        if path.suffix.lower() in _YAML and _is_envoy(path):
            envoy.append(path)
            continue
        if policy is not None:
            raise ConfigurationError(f"{path}: only one ratewarden policy file is served (already {policy})")
        policy = path
    return policy, envoy


def _is_envoy(path: Path) -> bool:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError, RecursionError):
        return False  # the policy loader reports it, naming the line
    return isinstance(data, dict) and "domain" in data


def load_envoy(paths: Sequence[Path], merge: bool = False) -> Any:
    """The Envoy domains of ``paths`` (``serve.envoy_config``); raises on a broken file.

    Args:
        paths: The Envoy YAML files.
        merge: Merge the files of one domain (``--envoy-merge-domains``) instead of refusing.
    """
    from .envoy_config import load_envoy_configs

    return load_envoy_configs(paths, merge)


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080``, ``:8080`` for all interfaces) into ``(host, port)``.

    Args:
        text: The address.
        what: The option's name, for the error.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(f"{what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def format_address(address: tuple[str, int]) -> str:
    """``(host, port)`` as ``HOST:PORT`` (``[::1]:8080`` for IPv6), as the options take it.

    Args:
        address: The host and port.
    """
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _errno(exc: BaseException) -> int | None:
    """The error number of a failed bind: ``exc.errno``, else one in its text (the compiled front
    door's ``... (os error 98)``)."""
    if isinstance(exc, socket.gaierror):
        return None
    number = getattr(exc, "errno", None)
    if isinstance(number, int):
        return number
    found = re.search(r"os error (\d+)|\[Errno (\d+)\]", str(exc))
    return int(found.group(1) or found.group(2)) if found else None


def listen_error(option: str, address: tuple[str, int], exc: BaseException, *, probe: bool = False) -> ConfigurationError:
    """The one-line error for a listener ``option`` (``--grpc``) that could not listen on ``address``:
    the option and the address, why (in use, permission denied, not an address of this host) and
    the fix.

    Args:
        option: The option that gave the address.
        address: The host and port.
        exc: What the bind raised.
        probe: When ``exc`` carries no error number (grpc core says only that it failed), bind
            ``address`` once to learn why.
    """
    host, port = address
    where = f"{option} {format_address(address)}: cannot listen there"
    number = _errno(exc)
    if number is None and probe and not isinstance(exc, socket.gaierror):
        try:
            check_listen(option, address)
        except ConfigurationError as probed:
            return probed
    if isinstance(exc, socket.gaierror):
        why, fix = f"{host!r} does not resolve ({exc.strerror})", f"give an IP address with {option}"
    elif number == errno.EADDRINUSE:
        why, fix = "the address is in use", f"choose another port with {option}, or stop what listens there"
    elif number in (errno.EACCES, errno.EPERM):
        why = "permission denied" + (" (a port below 1024 needs root or CAP_NET_BIND_SERVICE)" if port < 1024 else "")
        fix = f"choose a port above 1023 with {option}" if port < 1024 else f"choose another port with {option}"
    elif number == errno.EADDRNOTAVAIL:
        why = f"cannot assign the address: {host} is not an address of this host"
        fix = f"give one of this host's addresses with {option} ({'[::]' if ':' in host else '0.0.0.0'} for every interface)"
    elif number == errno.EAFNOSUPPORT:
        why, fix = "this host has no IPv6" if ":" in host else "address family not supported", f"give an IPv4 address with {option}"
    else:
        said = re.sub(r"^cannot listen for gRPC on \S+?(: | )", "", str(exc))  # the front doors' own prefix
        why, fix = (_strerror(number) if number is not None else said), f"choose another address with {option}"
    return ConfigurationError(f"{where}: {why}; {fix}")


def _strerror(number: int) -> str:
    """The system's text for an error number, lower-cased as the rest of the line."""
    text = os.strerror(number)
    return text[:1].lower() + text[1:]


def bind_listener(option: str, address: tuple[str, int], *, reuse_port: bool = False) -> socket.socket:
    """A socket listening on ``address`` (``SO_REUSEADDR``, and ``SO_REUSEPORT`` with ``reuse_port``),
    inheritable by forked workers; a ``ConfigurationError`` from ``listen_error`` when it cannot.

    Args:
        option: The option that gave the address, for the error.
        address: The host and port.
        reuse_port: Set ``SO_REUSEPORT`` too (several processes on the port).
    """
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY for IPPROTO_TCP only
    except OSError as exc:
        raise listen_error(option, address, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise listen_error(option, address, exc) from None
    sock.set_inheritable(True)
    return sock


def check_listen(option: str, address: tuple[str, int]) -> None:
    """Raise ``listen_error``'s ``ConfigurationError`` unless a socket can listen on ``address`` now,
    for a listener the workers open themselves (gRPC): bound, listening and closed again. Without
    ``SO_REUSEPORT``, so a port another process shares (``SO_REUSEPORT``) counts as in use, as it is.

    Args:
        option: The option that gave the address, for the error.
        address: The host and port.
    """
    bind_listener(option, address).close()
