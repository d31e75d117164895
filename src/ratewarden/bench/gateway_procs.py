"""The gateway bench's processes and their configuration files: a fast backend (nginx ``return 200``),
HAProxy six ways and nginx three, ``ratewarden serve`` and the fixed-answer floor service.

Every process runs in the foreground on free loopback ports with its files in a private directory
(nginx ``-p DIR -e stderr -g 'daemon off;'``, HAProxy ``-db``), its output kept in a log file there
for the error message, and is stopped by its own pid (SIGTERM, then SIGKILL) at the end.

Limits (per API key, per minute, the same for every limiter): ``GROUP_LIMITS``. HAProxy's native
variant is the reference set-up's mechanism: a map file of API key -> group, a map of group -> limit, one
stick-table entry per key holding ``http_req_rate(1m)``. nginx's ``limit_req`` is a leaky bucket:
``rate=Lr/m burst=L-1 nodelay`` admits L at once and one more every 60/L s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .services import BenchError

__all__ = [
    "BULK_GROUP", "BULK_KEY", "GROUP_LIMITS", "HOST", "Proc", "backend_conf", "envoy_yaml", "floor_command", "free_port",
    "haproxy_native_conf", "haproxy_plain_conf", "haproxy_ratewarden_files", "haproxy_spoe_files", "nginx_limit_req_conf",
    "nginx_plain_conf", "nginx_ratewarden_conf", "policy_toml", "require_binaries", "serve_command",
    "wait_port",
]

HOST = "127.0.0.1"
#: Requests per minute per API key, by group (the reference set-up's tiers: basic is the one that gets limited).
GROUP_LIMITS: Mapping[str, int] = {"premium": 100, "standard": 40, "basic": 20}
#: The key and group the capacity runs check with: a limit never reached (every decision "allowed").
BULK_KEY, BULK_GROUP = "capacity-key", "bulk"
_BULK_LIMIT = 1_000_000_000

HAPROXY = "/usr/sbin/haproxy"
NGINX = "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def require_binaries() -> dict[str, str]:
    """The paths of haproxy, nginx and wrk; ``BenchError`` naming what is missing."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for name, default in (("haproxy", HAPROXY), ("nginx", NGINX), ("wrk", "")):
        path = shutil.which(name) or (default if default and os.access(default, os.X_OK) else None)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        raise BenchError(f"the gateway bench needs {', '.join(missing)}: run scripts/install-system-deps.sh "
                         f"(apt-get install haproxy nginx-light wrk)")
    return found


def wait_port(port: int, timeout: float, proc: Proc | None = None) -> None:
    """Until something accepts on ``port``; ``BenchError`` (with the process's log) on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise BenchError(f"{proc.name} exited ({proc.popen.returncode}) before listening on {port}: "
                             f"{proc.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise BenchError(f"{proc.name if proc else 'a server'} did not listen on {port} within {timeout:g} s"
                     + (f": {proc.log_tail()}" if proc else ""))


class Proc:
    """One foreground server process; ``stop`` ends it (and only it, by pid)."""

    def __init__(self, name: str, argv: Sequence[str], directory: Path, port: int,
                 cores: set[int] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.name, self.port, self.directory = name, port, directory
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as log:
            self.popen = subprocess.Popen(
                list(argv), cwd=directory, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=None if env is None else {**os.environ, **env},
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)

    def wait(self, timeout: float = 15.0) -> Proc:
        wait_port(self.port, timeout, self)
        return self

    def log_tail(self, size: int = 600) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return text[-size:] or "(empty log)"

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


# ---------------------------------------------------------------------------------------------- files

def policy_toml(keys: Mapping[str, str], limits: Mapping[str, int] = GROUP_LIMITS) -> str:
    """The ratewarden policy: the keys' groups, ``limits`` per minute (sliding window, the
    default), and the capacity key's group with a limit never reached; one tiered rule on every path."""
    lines = ["# ratewarden bench --gateway: the reference set-up's tiers", "version = 1", "", "[settings]",
             'algorithm = "sliding_window"', "", "[identity]", 'sources = ["header:X-API-Key"]',
             'unknown_group = "basic"', 'anonymous_group = "basic"', "", "[identity.keys]",
             f'"{BULK_KEY}" = "{BULK_GROUP}"']
    lines += [f'"{key}" = "{group}"' for key, group in keys.items()]
    for group, limit in limits.items():
        lines += ["", f"[groups.{group}]", f'limits = "{limit}/min"']
    lines += ["", f"[groups.{BULK_GROUP}]", f'limits = "{_BULK_LIMIT}/min"', "", "[[rules]]", 'name = "api"',
              'path = "/**"', "tiered = true", ""]
    return "\n".join(lines)


def envoy_yaml() -> str:
    """An envoyproxy/ratelimit configuration for the gRPC capacity runs: ``api_key`` descriptors,
    the capacity key with a limit never reached."""
    return (
        "domain: bench\n"
        "descriptors:\n"
        "  - key: api_key\n"
        f"    value: {BULK_KEY}\n"
        "    rate_limit:\n"
        "      unit: minute\n"
        f"      requests_per_unit: {_BULK_LIMIT}\n"
        "  - key: api_key\n"
        "    rate_limit:\n"
        "      unit: minute\n"
        "      requests_per_unit: 20\n"
    )


def _nginx_preamble(workers: str, pid: str) -> str:
    """The top of every nginx configuration here: processes, logs, and temporary files under the prefix."""
    return f"""worker_processes {workers};
pid {pid};
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path client_body;
    proxy_temp_path proxy;
    fastcgi_temp_path fastcgi;
    uwsgi_temp_path uwsgi;
    scgi_temp_path scgi;
"""


def backend_conf(port: int) -> str:
    """The backend: nginx answering ``200 ok`` to every method and path (PUT bodies discarded)."""
    return _nginx_preamble("1", "backend.pid") + f"""    keepalive_requests 100000;
    server {{
        listen {HOST}:{port} reuseport;
        client_max_body_size 1m;
        location / {{
            default_type text/plain;
            return 200 "ok\\n";
        }}
    }}
}}
"""


_HAPROXY_HEAD = """global
    default-path config
{extra}
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
"""


def haproxy_plain_conf(gateway: int, backend: int) -> str:
    """HAProxy with no limiting (the shipped configuration's global/defaults, minus the check)."""
    return _HAPROXY_HEAD.format(extra="") + f"""
frontend api
    bind {HOST}:{gateway}
    default_backend app

backend app
    server app1 {HOST}:{backend}
"""


def haproxy_native_conf(gateway: int, backend: int) -> str:
    """HAProxy's own limiting, the reference set-up's mechanism: ``keys.map`` (API key -> group), ``limits.map``
    (group -> requests per minute), a stick table tracking ``http_req_rate(1m)`` per key."""
    return _HAPROXY_HEAD.format(extra="") + f"""
frontend api
    bind {HOST}:{gateway}
    http-request set-var(txn.api_key) req.hdr(X-API-Key)
    http-request set-var(txn.group) var(txn.api_key),map(keys.map,basic)
    http-request set-var(txn.limit) var(txn.group),map_str_int(limits.map,0)
    http-request track-sc0 var(txn.api_key) table per_key if {{ var(txn.api_key) -m found }}
    http-request deny deny_status 429 content-type application/json string '{{"error":"rate limited"}}' if {{ sc_http_req_rate(0),sub(txn.limit) gt 0 }}
    default_backend app

backend per_key
    stick-table type string len 64 size 100k expire 2m store http_req_rate(1m)

backend app
    server app1 {HOST}:{backend}
"""


def haproxy_maps(keys: Mapping[str, str], limits: Mapping[str, int] = GROUP_LIMITS) -> dict[str, str]:
    """``keys.map`` and ``limits.map`` for ``haproxy_native_conf``."""
    return {"keys.map": "".join(f"{k} {g}\n" for k, g in keys.items()),
            "limits.map": "".join(f"{g} {limit}\n" for g, limit in limits.items())}


def haproxy_ratewarden_files(gateway: int, service: int, backend: int) -> dict[str, str]:
    """The shipped ``haproxy.cfg`` and ``ratewarden.lua`` (``ratewarden.serve.gateways``), ports substituted."""
    from ..serve.gateways import config_text

    return {"haproxy.cfg": config_text("haproxy.cfg", gateway=gateway, service=service, backend=backend),
            "ratewarden.lua": config_text("ratewarden.lua", gateway=gateway, service=service, backend=backend)}


def haproxy_spoe_files(gateway: int, spoe: int, backend: int) -> dict[str, str]:
    """The shipped ``haproxy-spoe.cfg`` (written as ``haproxy.cfg``) and ``spoe.conf``
    (``ratewarden.serve.gateways``), ports substituted: HAProxy asking an SPOE agent on ``spoe``."""
    from ..serve.gateways import config_text

    return {"haproxy.cfg": config_text("haproxy-spoe.cfg", gateway=gateway, spoe=spoe, backend=backend),
            "spoe.conf": config_text("spoe.conf", gateway=gateway, spoe=spoe, backend=backend)}


_NGINX_HEAD = """{extra}
    upstream app {{
        server {host}:{backend};
        keepalive 32;
    }}
    server {{
        listen {host}:{gateway};
        location / {{
{limits}            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Real-IP $remote_addr;
        }}
    }}
}}
"""


def nginx_plain_conf(gateway: int, backend: int) -> str:
    """nginx with no limiting (the shipped configuration's proxying, minus the check)."""
    return _nginx_preamble("auto", "nginx.pid") + _NGINX_HEAD.format(
        extra="", limits="", host=HOST, backend=backend, gateway=gateway)


def nginx_limit_req_conf(gateway: int, backend: int, limits: Mapping[str, int] = GROUP_LIMITS) -> str:
    """nginx's own ``limit_req``: ``keys.nginx.map`` (API key -> group), one zone per group keyed by the
    API key (empty, so not counted, outside the group), ``rate=Lr/m burst=L-1 nodelay``."""
    extra = ["    map $http_x_api_key $rw_group {", "        default basic;", "        include keys.nginx.map;", "    }"]
    rules = []
    for group, limit in limits.items():
        extra += [f"    map $rw_group ${group}_key {{", f"        {group} $http_x_api_key;", '        default "";',
                  "    }", f"    limit_req_zone ${group}_key zone={group}:1m rate={limit}r/m;"]
        rules.append(f"            limit_req zone={group} burst={limit - 1} nodelay;\n")
    extra += ["    limit_req_status 429;"]
    return _nginx_preamble("auto", "nginx.pid") + _NGINX_HEAD.format(
        extra="\n".join(extra), limits="".join(rules), host=HOST, backend=backend, gateway=gateway)


def nginx_maps(keys: Mapping[str, str]) -> dict[str, str]:
    return {"keys.nginx.map": "".join(f"{k} {g};\n" for k, g in keys.items())}


def nginx_ratewarden_conf(gateway: int, service: int, backend: int) -> str:
    """The shipped ``nginx.conf`` (``ratewarden.serve.gateways``), ports substituted."""
    from ..serve.gateways import config_text

    return config_text("nginx.conf", gateway=gateway, service=service, backend=backend)


# ---------------------------------------------------------------------------------------------- commands

def serve_command(files: Sequence[Path], http: int, grpc: int = 0, spoe: int = 0, spoe_front: str = "python",
                  http_front: str | None = None, grpc_front: str | None = None) -> list[str]:
    """``ratewarden serve FILES --http 127.0.0.1:HTTP [--http-front HTTP_FRONT] [--grpc 127.0.0.1:GRPC
    [--front GRPC_FRONT]] [--spoe 127.0.0.1:SPOE --spoe-front SPOE_FRONT] --workers 1`` (memory store;
    no ``--http-front`` or ``--front``: the default)."""
    if importlib.util.find_spec("ratewarden.cli.serve") is None:
        raise BenchError("`ratewarden serve` is not available in this ratewarden (no ratewarden.cli.serve)")
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", *map(str, files), "--http", f"{HOST}:{http}",
            "--workers", "1", "--log-format", "text", "--log-level", "warning"]
    argv += ["--grpc", f"{HOST}:{grpc}"] if grpc else []
    argv += ["--front", grpc_front] if grpc and grpc_front else []
    argv += ["--http-front", http_front] if http_front else []
    argv += ["--spoe", f"{HOST}:{spoe}"] if spoe else []
    return argv + (["--spoe-front", spoe_front] if spoe else [])


def floor_command(http: int, grpc: int = 0, headers: bool = False, spoe: int = 0) -> list[str]:
    """The fixed-answer floor on ``ratewarden serve``'s stack (``gateway_floor``): HTTP (none when
    ``http`` is 0), optionally gRPC and an SPOE agent; ``headers``: its 200 carries an allowed check's
    rate-limit headers."""
    argv = [sys.executable, "-m", "ratewarden.bench.gateway_floor"] + (["--http", str(http)] if http else [])
    return argv + (["--grpc", str(grpc)] if grpc else []) + (["--spoe", str(spoe)] if spoe else []) \
        + (["--headers"] if headers else [])


def haproxy_command(directory: Path, binary: str = HAPROXY) -> list[str]:
    return [binary, "-db", "-f", str(directory / "haproxy.cfg")]


def nginx_command(directory: Path, binary: str = NGINX) -> list[str]:
    return [binary, "-p", str(directory), "-e", "stderr", "-c", str(directory / "nginx.conf"), "-g", "daemon off;"]
