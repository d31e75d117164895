"""The gateway configurations shipped with ratewarden, the one copy the docs, tests and bench use.

Each file uses the documented default addresses, all on ``127.0.0.1``:

- ``gateway`` 8000: where nginx, HAProxy or Traefik listens;
- ``service`` 8080: ``ratewarden serve``'s HTTP check API;
- ``grpc`` 8081: ``ratewarden serve``'s gRPC API (Envoy);
- ``spoe`` 8082: ``ratewarden serve``'s SPOE agent (HAProxy, ``haproxy-spoe.cfg``);
- ``backend`` 9000: the application behind the gateway.

``config_text("nginx.conf", gateway=18000, service=18080)`` gives a file with other ports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from ...errors import ArgumentError

__all__ = ["DEFAULT_PORTS", "config_text", "names", "write_configs"]

#: The port each role uses in the shipped files (always on 127.0.0.1).
DEFAULT_PORTS: Mapping[str, int] = {"gateway": 8000, "service": 8080, "grpc": 8081, "spoe": 8082, "backend": 9000}

_SUFFIXES = (".conf", ".cfg", ".lua", ".yaml", ".yml")


def names() -> list[str]:
    """The shipped configuration files' names, sorted."""
    package = resources.files(__name__)
    return sorted(p.name for p in package.iterdir() if p.name.endswith(_SUFFIXES))


def config_text(name: str, **ports: int) -> str:
    """The shipped file ``name`` with the given roles' ports in place of the defaults.

    Args:
        name: A shipped file's name (``names()``), e.g. ``"nginx.conf"``.
        ports: Port by role (``gateway``, ``service``, ``grpc``, ``spoe``, ``backend``); roles not given keep
            their default.

    Raises:
        ArgumentError: No such shipped file.
        TypeError: An unknown role.
    """
    unknown = sorted(set(ports) - set(DEFAULT_PORTS))
    if unknown:
        raise TypeError(f"unknown port role(s) {unknown}: expected some of {sorted(DEFAULT_PORTS)}")
    if name not in names():
        raise ArgumentError(f"no gateway configuration {name!r}: shipped are {names()}")
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    new = {str(DEFAULT_PORTS[role]): str(port) for role, port in ports.items()}
    if not new:
        return text
    # One pass, so a port replaced is never replaced again.
    alternatives = "|".join(map(re.escape, new))
    pattern = re.compile(rf"(?<=127\.0\.0\.1:)({alternatives})(?!\d)")
    return pattern.sub(lambda m: new[m.group(1)], text)


def write_configs(directory: str | Path, *files: str, **ports: int) -> dict[str, Path]:
    """Write shipped files into a directory, with other ports; their paths by name.

    Args:
        directory: Where to write them (created if missing).
        files: Shipped names, e.g. ``"haproxy.cfg", "ratewarden.lua"``.
        ports: As for ``config_text``.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in files:
        path = target / name
        path.write_text(config_text(name, **ports), encoding="utf-8")
        written[name] = path
    return written
