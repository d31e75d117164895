"""``ratewarden serve --envoy-env``: envoyproxy/ratelimit's settings, read from the environment with
its defaults (``serve.envoy_settings``), mapped onto ratewarden's options, so that a Deployment of the
reference can swap its image and keep its environment and ConfigMap (docs/gateways/envoy.md, "Moving
from envoyproxy/ratelimit").

An option the command line gives wins over the environment. A setting ratewarden cannot honour
either stops the start-up (``ConfigurationError``, exit status 2: serving on would change what is
enforced, or where), or is named once at start-up as not supported, with the reason (``notes``: it
changes what is observed or tuned, not what is decided).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

from ..errors import ConfigurationError
from .config import format_address, parse_address
from .envoy_runtime import RuntimeLayout
from .envoy_settings import read_settings
from .reference_service import ReferenceOptions

__all__ = ["EnvoyEnv", "apply_envoy_env", "store_url"]

_Values = dict[str, object]

#: logrus's levels, as ``--log-level`` names them.
_LEVELS = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning", "warning": "warning",
           "error": "error", "fatal": "error", "panic": "error"}

#: Settings that change only what is observed or tuned: named at start-up when set, with the reason.
_NOT_SUPPORTED = {
    "DEBUG_HOST": "no debug listener (Go's pprof, /rlconfig, /stats); ratewarden's logs and /metrics on PORT instead",
    "DEBUG_PORT": "no debug listener (Go's pprof, /rlconfig, /stats); ratewarden's logs and /metrics on PORT instead",
    "GRPC_MAX_CONNECTION_AGE": "gRPC connections are not aged out (Envoy's connections stay until it closes them)",
    "GRPC_MAX_CONNECTION_AGE_GRACE": "gRPC connections are not aged out (Envoy's connections stay until it closes them)",
    "EXTRA_TAGS": "no tags are added to the metrics",
    "STATS_FLUSH_INTERVAL": "the Prometheus counts are live, not flushed at an interval",
    "PROMETHEUS_MAPPER_YAML": "the series are those of the reference's default mapping; a mapping file is not read",
    "EXPIRATION_JITTER_MAX_SECONDS": "no jitter: each counter expires when its window ends",
    "REDIS_PIPELINE_WINDOW": "ratewarden pipelines the checks of one event-loop pass to Redis on its own (coalesce)",
    "REDIS_PIPELINE_LIMIT": "ratewarden pipelines the checks of one event-loop pass to Redis on its own (coalesce)",
    "MEMCACHE_MAX_IDLE_CONNS": "ratewarden's memcached store keeps its own pool (the URL's pool_size)",
    "RESPONSE_DYNAMIC_METADATA": "no dynamic metadata is sent in the answers",
    "TRACING_ENABLED": "no OpenTelemetry traces are sent",
    "FORCE_START_WITHOUT_INITIAL_CONFIG": "it applies to CONFIG_TYPE=GRPC_XDS_SOTW only",
}
#: Boolean settings named only when true (their false is the default and needs nothing).
_WHEN_TRUE = ("RESPONSE_DYNAMIC_METADATA", "TRACING_ENABLED", "FORCE_START_WITHOUT_INITIAL_CONFIG")


@dataclass
class EnvoyEnv:
    """What ``--envoy-env`` read beyond the options it set.

    Args:
        runtime: Where the Envoy configuration files are (``None``: the command line gave them).
        reference: The reference's service-wide settings.
        key_prefix: ``CACHE_KEY_PREFIX`` (``None``: ratewarden's).
        notes: ``(variable, message)`` for each setting named as not supported.
    """

    runtime: RuntimeLayout | None
    reference: ReferenceOptions
    key_prefix: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)


def _str(values: _Values, name: str) -> str:
    found = values[name]
    return found if isinstance(found, str) else ""


def _refuse(values: _Values) -> None:
    """Stop the start-up for a setting whose value ratewarden cannot honour and that would change
    what is enforced, or where."""
    config_type = _str(values, "CONFIG_TYPE")
    if config_type == "GRPC_XDS_SOTW":
        raise ConfigurationError(
            "--envoy-env: CONFIG_TYPE=GRPC_XDS_SOTW is not supported: ratewarden reads its rate limit configuration "
            "from files (RUNTIME_ROOT...) only, not from an xDS server; mount the configuration as files (a ConfigMap) "
            "and set CONFIG_TYPE=FILE"
        )
    if config_type != "FILE":
        raise ConfigurationError(f"--envoy-env: CONFIG_TYPE={config_type!r}: must be FILE (or GRPC_XDS_SOTW, not supported)")
    if _str(values, "GRPC_UDS"):
        raise ConfigurationError(
            f"--envoy-env: GRPC_UDS={_str(values, 'GRPC_UDS')} is not supported: ratewarden's gRPC listens on TCP "
            "(GRPC_HOST, GRPC_PORT); unset GRPC_UDS and point Envoy's cluster at GRPC_HOST:GRPC_PORT"
        )
    if values["GRPC_SERVER_USE_TLS"]:
        raise ConfigurationError(
            "--envoy-env: GRPC_SERVER_USE_TLS=true is not supported: ratewarden's gRPC is plaintext; terminate TLS in "
            "front of it (a sidecar, the mesh) or set GRPC_SERVER_USE_TLS=false"
        )
    if values["QUOTA_MODE"]:
        raise ConfigurationError(
            "--envoy-env: QUOTA_MODE=true is not supported: ratewarden applies quota_mode per descriptor, as the "
            "configuration says; set quota_mode on the descriptors, or QUOTA_MODE=false"
        )
    for name in ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR"):
        if _str(values, name).upper() != "WAIT":
            raise ConfigurationError(
                f"--envoy-env: {name}={_str(values, name)!r}: only WAIT is supported (as by the reference, "
                "which stops on CREATE and ERROR)"
            )


def _address(values: _Values, host: str, port: str) -> tuple[str, int]:
    number = values[port]
    assert isinstance(number, int)
    if not 0 <= number <= 65535:
        raise ConfigurationError(f"--envoy-env: {port}={number}: must be a port, 0 to 65535")
    text = _str(values, host) or "0.0.0.0"
    return parse_address(format_address((text.strip("[]"), number)), f"--envoy-env: {host}:{port}")


def _userinfo(auth: str) -> str:
    """``REDIS_AUTH`` (``password`` or ``user:password``) as a URL's user information."""
    if not auth:
        return ""
    user, sep, password = auth.partition(":")
    if not sep:
        user, password = "", auth
    return f"{quote(user, safe='')}:{quote(password, safe='')}@"


def _memcached_url(values: _Values) -> str:
    hosts = values["MEMCACHE_HOST_PORT"]
    assert isinstance(hosts, list)
    if _str(values, "MEMCACHE_SRV"):
        raise ConfigurationError(
            "--envoy-env: MEMCACHE_SRV is not supported: ratewarden's memcached store connects to one server; "
            "give it as MEMCACHE_HOST_PORT=host:port"
        )
    if values["MEMCACHE_TLS"]:
        raise ConfigurationError("--envoy-env: MEMCACHE_TLS=true is not supported: ratewarden connects to memcached in plaintext")
    if len(hosts) != 1:
        raise ConfigurationError(
            f"--envoy-env: BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT=host:port, one server (ratewarden's memcached "
            f"store does not shard over several), got {','.join(hosts) or 'none'}"
        )
    return f"memcached://{hosts[0]}"


def _unix_url(values: _Values) -> str:
    """``REDIS_SOCKET_TYPE=unix``: ``REDIS_URL`` is the path of a single Redis's socket."""
    path = _str(values, "REDIS_URL")
    kind = _str(values, "REDIS_TYPE")
    if kind.lower() != "single":
        raise ConfigurationError(
            f"--envoy-env: REDIS_SOCKET_TYPE=unix with REDIS_TYPE={kind}: a unix socket reaches one server; "
            "set REDIS_TYPE=SINGLE, or REDIS_SOCKET_TYPE=tcp with the servers' host:port"
        )
    if values["REDIS_TLS"]:
        raise ConfigurationError("--envoy-env: REDIS_TLS=true with REDIS_SOCKET_TYPE=unix is not supported: "
                                 "ratewarden speaks TLS to Redis over TCP only")
    if not path.startswith("/"):
        raise ConfigurationError(
            f"--envoy-env: REDIS_URL={path!r} with REDIS_SOCKET_TYPE=unix: must be the socket's absolute path "
            "(the reference's default is /var/run/nutcracker/ratelimit.sock); or set REDIS_SOCKET_TYPE=tcp and "
            "REDIS_URL=host:port"
        )
    return f"unix://{_userinfo(_str(values, 'REDIS_AUTH'))}{quote(path)}"


def store_url(values: _Values, given: Collection[str] = ()) -> str:
    """The store URL the reference's backend settings name (``BACKEND_TYPE``, ``REDIS_*``, ``MEMCACHE_*``).

    Args:
        values: The settings (``envoy_settings.read_settings``).
        given: The settings the environment sets (``REDIS_TIMEOUT`` is used only then).
    """
    backend = _str(values, "BACKEND_TYPE")
    if backend == "memcache":
        return _memcached_url(values)
    if backend not in ("redis", ""):
        raise ConfigurationError(f"--envoy-env: BACKEND_TYPE={backend!r}: must be redis or memcache")
    socket_type = _str(values, "REDIS_SOCKET_TYPE").lower()
    if socket_type == "unix":
        return _unix_url(values) + _redis_query(values, "single", given)
    if socket_type != "tcp":
        raise ConfigurationError(f"--envoy-env: REDIS_SOCKET_TYPE={socket_type!r}: must be tcp or unix")
    address = _str(values, "REDIS_URL")
    if "://" in address or "/" in address or not address:
        raise ConfigurationError(
            f"--envoy-env: REDIS_URL={address!r}: must be host:port (with REDIS_TYPE=SENTINEL: "
            "master,sentinel1:port,...; CLUSTER: host1:port,host2:port,...)"
        )
    scheme = "rediss" if values["REDIS_TLS"] else "redis"
    user = _userinfo(_str(values, "REDIS_AUTH"))
    kind = _str(values, "REDIS_TYPE").lower()
    if kind == "single":
        url = f"{scheme}://{user}{address}/0"
    elif kind == "cluster":
        url = f"{scheme}+cluster://{user}{address}"
    elif kind == "sentinel":
        master, _, sentinels = address.partition(",")
        if not sentinels:
            raise ConfigurationError(
                f"--envoy-env: REDIS_URL={address!r} with REDIS_TYPE=SENTINEL: expected master name and sentinels, "
                "as <master>,<sentinel1 host:port>,..."
            )
        url = f"{scheme}+sentinel://{user}{sentinels}/{quote(master, safe='')}"
    else:
        raise ConfigurationError(f"--envoy-env: REDIS_TYPE={_str(values, 'REDIS_TYPE')!r}: must be SINGLE, SENTINEL or CLUSTER")
    return url + _redis_query(values, kind, given)


def _redis_query(values: _Values, kind: str, given: Collection[str]) -> str:
    query: dict[str, object] = {}
    pool = values["REDIS_POOL_SIZE"]
    if isinstance(pool, int) and pool > 0:
        query["pool_size"] = pool
    if "REDIS_TIMEOUT" in given:
        timeout = values["REDIS_TIMEOUT"]
        if isinstance(timeout, float) and timeout > 0:
            query["timeout"] = query["connect_timeout"] = f"{timeout:g}"
    for name, option in (("REDIS_TLS_CACERT", "ssl_ca_certs"), ("REDIS_TLS_CLIENT_CERT", "ssl_certfile"),
                         ("REDIS_TLS_CLIENT_KEY", "ssl_keyfile")):
        if values["REDIS_TLS"] and _str(values, name):
            query[option] = _str(values, name)
    if values["REDIS_TLS"] and values["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"]:
        query["ssl_check_hostname"] = 0
    sentinel_auth = _str(values, "REDIS_SENTINEL_AUTH")
    if kind == "sentinel" and sentinel_auth:
        user, sep, password = sentinel_auth.partition(":")
        if sep and user:
            query["sentinel_username"] = user
        query["sentinel_password"] = password if sep else sentinel_auth
    local_cache = values["LOCAL_CACHE_SIZE_IN_BYTES"]  # the reference's 0: no local cache, every check asks Redis
    query["cache"] = 1 if isinstance(local_cache, int) and local_cache > 0 else 0
    address = _str(values, "REDIS_URL").lower()
    if kind == "single" and ("nutcracker" in address or "twemproxy" in address):  # as the reference's default
        query["twemproxy"] = 1
    return "?" + urlencode(query) if query else ""


def _notes(values: _Values, given: set[str]) -> list[tuple[str, str]]:
    """The settings named at start-up as not supported, with the reason."""
    notes = [(name, why) for name, why in _NOT_SUPPORTED.items()
             if name in given and (name not in _WHEN_TRUE or values[name])]
    stats_off = values["DISABLE_STATS"] or values["USE_PROMETHEUS"]
    if values["USE_STATSD"] and not stats_off:
        said = "" if "USE_STATSD" in given else " (its default)"
        notes.append(("USE_STATSD", f"true{said}: no statsd is sent; USE_PROMETHEUS=true serves the reference's "
                                    "Prometheus series (USE_STATSD=false says nothing)"))
    if values["USE_DOG_STATSD"]:
        notes.append(("USE_DOG_STATSD", "no DogStatsD is sent; USE_PROMETHEUS=true serves the reference's Prometheus series"))
    if values["REDIS_PERSECOND"]:
        notes.append(("REDIS_PERSECOND", "per-second limits are counted in the same store as the others (REDIS_URL's); "
                                         "the REDIS_PERSECOND_* settings are not read"))
    return notes


def _reference(values: _Values) -> ReferenceOptions:
    prometheus = None
    if values["USE_PROMETHEUS"] and not values["DISABLE_STATS"]:
        if importlib.util.find_spec("prometheus_client") is None:
            raise ConfigurationError("--envoy-env: USE_PROMETHEUS=true needs prometheus-client: pip install 'ratewarden[serve]'")
        prometheus = parse_address(_str(values, "PROMETHEUS_ADDR"), "--envoy-env: PROMETHEUS_ADDR")
        if not _str(values, "PROMETHEUS_PATH").startswith("/"):
            raise ConfigurationError(f"--envoy-env: PROMETHEUS_PATH={_str(values, 'PROMETHEUS_PATH')!r}: must start with /")
    ratio = values["NEAR_LIMIT_RATIO"]
    assert isinstance(ratio, float)
    return ReferenceOptions(
        shadow=bool(values["SHADOW_MODE"]),
        header_names=(_str(values, "LIMIT_LIMIT_HEADER"), _str(values, "LIMIT_REMAINING_HEADER"),
                      _str(values, "LIMIT_RESET_HEADER")),
        near_limit_ratio=ratio, prometheus=prometheus, prometheus_path=_str(values, "PROMETHEUS_PATH"),
        healthy_with_config=bool(values["HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"]),
        health_store=bool(values["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"]),
    )


def _runtime(values: _Values) -> RuntimeLayout:
    layout = RuntimeLayout(
        Path(_str(values, "RUNTIME_ROOT")), _str(values, "RUNTIME_SUBDIRECTORY"), _str(values, "RUNTIME_APPDIRECTORY"),
        bool(values["RUNTIME_IGNOREDOTFILES"]), bool(values["RUNTIME_WATCH_ROOT"]),
    )
    if layout.watch_root and not layout.root.parent.is_dir():
        raise ConfigurationError(
            f"--envoy-env: RUNTIME_ROOT={layout.root}: its directory {layout.root.parent} does not exist (the reference "
            "watches it for the swap of RUNTIME_ROOT); mount the configuration there, or give RUNTIME_ROOT"
        )
    walked = layout.walked
    if not layout.watch_root and walked is not None and not walked.is_dir():
        raise ConfigurationError(
            f"--envoy-env: {walked} (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, RUNTIME_WATCH_ROOT=false) "
            "is not a directory: mount the configuration there"
        )
    return layout


def _set(args: argparse.Namespace, dest: str, value: Callable[[], object]) -> None:
    """Set an option the command line did not give to ``value()`` (not read when it gave it)."""
    if dest not in getattr(args, "given", set()):
        setattr(args, dest, value())


def _log_level(values: _Values) -> str:
    level = _LEVELS.get(_str(values, "LOG_LEVEL").lower())
    if level is None:
        raise ConfigurationError(
            f"--envoy-env: LOG_LEVEL={_str(values, 'LOG_LEVEL')!r}: must be one of trace, debug, info, warn, error, fatal, panic")
    return level


def apply_envoy_env(args: argparse.Namespace, environ: Mapping[str, str], runtime: bool = True) -> EnvoyEnv:
    """Set ``args``'s options from the reference's settings in ``environ`` (the ones the command line
    did not give); what has no option is returned.

    Args:
        args: ``ratewarden serve``'s parsed command line (``args.given``: the options it gave).
        environ: The environment.
        runtime: Read the Envoy configuration from the runtime directory (``False``: the command line
            gave Envoy YAML files).
    """
    values, given = read_settings(environ)
    _refuse(values)
    _set(args, "http", lambda: format_address(_address(values, "HOST", "PORT")))
    _set(args, "grpc", lambda: format_address(_address(values, "GRPC_HOST", "GRPC_PORT")))
    _set(args, "log_level", lambda: _log_level(values))
    _set(args, "log_format", lambda: "json" if _str(values, "LOG_FORMAT").lower() == "json" else "text")
    _set(args, "store", lambda: store_url(values, given))
    _set(args, "envoy_headers", lambda: "reference" if values["LIMIT_RESPONSE_HEADERS_ENABLED"] else "none")
    _set(args, "envoy_charge", lambda: "all" if values["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] else "each")
    _set(args, "envoy_merge_domains", lambda: bool(values["MERGE_DOMAIN_CONFIG"]))
    prefix = _str(values, "CACHE_KEY_PREFIX")
    return EnvoyEnv(
        runtime=_runtime(values) if runtime else None, reference=_reference(values), key_prefix=prefix or None,
        notes=_notes(values, given),
    )
