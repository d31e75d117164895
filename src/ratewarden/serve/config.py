"""What ``ratewarden serve`` runs: its options (``ServeConfig``), the files it is given sorted into
the ratewarden policy and Envoy ratelimit YAML (``envoy_files``, ``load_envoy``) and its listening
addresses (``parse_address``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..limiter import FailurePolicy
from . import bounds
from .http import DEFAULT_TRUSTED

__all__ = ["ServeConfig", "envoy_files", "load_envoy", "parse_address"]

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
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
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
