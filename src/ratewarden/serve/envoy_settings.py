"""envoyproxy/ratelimit's settings, as its ``src/settings/settings.go`` reads them from the
environment: every variable's name, default and type (``SETTINGS``), and how a value is read as
the reference's ``envconfig`` reads it (``parse_value``: Go's booleans, integers, floats and
durations). What ``ratewarden serve --envoy-env`` does with each is ``serve.envoy_env``'s; the
table in docs/gateways/envoy.md has one row per name here (tests/serve/test_envoy_env.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["SETTINGS", "Setting", "go_duration", "parse_value", "read_settings"]


@dataclass(frozen=True)
class Setting:
    """One environment variable of the reference.

    Args:
        name: The variable.
        default: Its default, as the reference's ``default:`` tag writes it.
        kind: ``str``, ``int``, ``bool``, ``float``, ``duration``, ``list`` (comma-separated) or ``map``.
    """

    name: str
    default: str
    kind: str = "str"


def _table(*rows: tuple[str, str, str]) -> dict[str, Setting]:
    return {name: Setting(name, default, kind) for name, default, kind in rows}


#: Every setting of envoyproxy/ratelimit (its ``settings.go`` at the commit the Go module proxy serves
#: as ``@latest``, January 2026), in its order.
SETTINGS: dict[str, Setting] = _table(
    ("HOST", "0.0.0.0", "str"), ("PORT", "8080", "int"),
    ("DEBUG_HOST", "0.0.0.0", "str"), ("DEBUG_PORT", "6070", "int"),
    ("GRPC_UDS", "", "str"), ("GRPC_HOST", "0.0.0.0", "str"), ("GRPC_PORT", "8081", "int"),
    ("GRPC_MAX_CONNECTION_AGE", "24h", "duration"), ("GRPC_MAX_CONNECTION_AGE_GRACE", "1h", "duration"),
    ("GRPC_SERVER_USE_TLS", "false", "bool"), ("GRPC_SERVER_TLS_CERT", "", "str"), ("GRPC_SERVER_TLS_KEY", "", "str"),
    ("GRPC_CLIENT_TLS_CACERT", "", "str"), ("GRPC_CLIENT_TLS_SAN", "", "str"),
    ("LOG_LEVEL", "WARN", "str"), ("LOG_FORMAT", "text", "str"),
    ("CONFIG_TYPE", "FILE", "str"), ("FORCE_START_WITHOUT_INITIAL_CONFIG", "false", "bool"),
    ("CONFIG_GRPC_XDS_NODE_ID", "default", "str"), ("CONFIG_GRPC_XDS_NODE_METADATA", "", "str"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", "str"),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", "duration"),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", "map"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", "bool"), ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", "str"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", "str"), ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", "str"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", "str"),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", "duration"), ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", "duration"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", "float"), ("XDS_CLIENT_BACKOFF_JITTER", "true", "bool"),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", "int"),
    ("USE_DOG_STATSD", "false", "bool"), ("USE_DOG_STATSD_MOGRIFIERS", "", "list"),
    ("USE_STATSD", "true", "bool"), ("STATSD_HOST", "localhost", "str"), ("STATSD_PORT", "8125", "int"),
    ("EXTRA_TAGS", "", "map"), ("STATS_FLUSH_INTERVAL", "10s", "duration"), ("DISABLE_STATS", "false", "bool"),
    ("USE_PROMETHEUS", "false", "bool"), ("PROMETHEUS_ADDR", ":9090", "str"), ("PROMETHEUS_PATH", "/metrics", "str"),
    ("PROMETHEUS_MAPPER_YAML", "", "str"),
    ("RUNTIME_ROOT", "/srv/runtime_data/current", "str"), ("RUNTIME_SUBDIRECTORY", "", "str"),
    ("RUNTIME_APPDIRECTORY", "config", "str"), ("RUNTIME_IGNOREDOTFILES", "false", "bool"),
    ("RUNTIME_WATCH_ROOT", "true", "bool"),
    ("EXPIRATION_JITTER_MAX_SECONDS", "300", "int"), ("LOCAL_CACHE_SIZE_IN_BYTES", "0", "int"),
    ("NEAR_LIMIT_RATIO", "0.8", "float"), ("CACHE_KEY_PREFIX", "", "str"), ("BACKEND_TYPE", "redis", "str"),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", "bool"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", "false", "bool"), ("LIMIT_LIMIT_HEADER", "RateLimit-Limit", "str"),
    ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining", "str"), ("LIMIT_RESET_HEADER", "RateLimit-Reset", "str"),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", "bool"),
    ("REDIS_SOCKET_TYPE", "unix", "str"), ("REDIS_TYPE", "SINGLE", "str"),
    ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock", "str"), ("REDIS_POOL_SIZE", "10", "int"),
    ("REDIS_AUTH", "", "str"), ("REDIS_TLS", "false", "bool"), ("REDIS_TLS_CLIENT_CERT", "", "str"),
    ("REDIS_TLS_CLIENT_KEY", "", "str"), ("REDIS_TLS_CACERT", "", "str"),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", "bool"),
    ("REDIS_PIPELINE_WINDOW", "0", "duration"), ("REDIS_PIPELINE_LIMIT", "0", "int"),
    ("REDIS_PERSECOND", "false", "bool"), ("REDIS_PERSECOND_SOCKET_TYPE", "unix", "str"),
    ("REDIS_PERSECOND_TYPE", "SINGLE", "str"), ("REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", "str"),
    ("REDIS_PERSECOND_POOL_SIZE", "10", "int"), ("REDIS_PERSECOND_AUTH", "", "str"), ("REDIS_PERSECOND_TLS", "false", "bool"),
    ("REDIS_SENTINEL_AUTH", "", "str"), ("REDIS_PERSECOND_SENTINEL_AUTH", "", "str"),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", "0", "duration"), ("REDIS_PERSECOND_PIPELINE_LIMIT", "0", "int"),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", "bool"),
    ("REDIS_TIMEOUT", "10s", "duration"), ("REDIS_PERSECOND_TIMEOUT", "10s", "duration"),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", "str"), ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", "str"),
    ("MEMCACHE_HOST_PORT", "", "list"), ("MEMCACHE_MAX_IDLE_CONNS", "2", "int"), ("MEMCACHE_SRV", "", "str"),
    ("MEMCACHE_SRV_REFRESH", "0", "duration"), ("MEMCACHE_TLS", "false", "bool"),
    ("MEMCACHE_TLS_CLIENT_CERT", "", "str"), ("MEMCACHE_TLS_CLIENT_KEY", "", "str"), ("MEMCACHE_TLS_CACERT", "", "str"),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", "bool"),
    ("SHADOW_MODE", "false", "bool"), ("QUOTA_MODE", "false", "bool"), ("RESPONSE_DYNAMIC_METADATA", "false", "bool"),
    ("MERGE_DOMAIN_CONFIG", "false", "bool"),
    ("TRACING_ENABLED", "false", "bool"), ("TRACING_SERVICE_NAME", "RateLimit", "str"),
    ("TRACING_SERVICE_NAMESPACE", "", "str"), ("TRACING_SERVICE_INSTANCE_ID", "", "str"),
    ("TRACING_EXPORTER_PROTOCOL", "http", "str"), ("TRACING_SAMPLING_RATE", "1", "float"),
)

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``10s``, ``150us``, ``1m30s``, ``0``), as ``time.ParseDuration`` reads it;
    ``None`` when it is not one.

    Args:
        text: The duration.
    """
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    total, at = 0.0, 0
    while at < len(body):
        found = _DURATION.match(body, at)
        if found is None or found.group(1) in ("", "."):
            return None
        total += float(found.group(1)) * _UNITS[found.group(2)]
        at = found.end()
    if not body:
        return None
    return -total if text.startswith("-") else total


def _number(kind: str, text: str) -> object:
    """``text`` as a ``bool``, ``int``, ``float`` or ``duration`` setting reads it; ``None`` when it is not one."""
    if kind == "bool":
        return text in _TRUE if text in _TRUE or text in _FALSE else None
    if kind == "int":
        return int(text) if _INTEGER.fullmatch(text) else None
    if kind == "duration":
        return go_duration(text)
    try:
        return float(text)
    except ValueError:
        return None


_WHAT = {
    "bool": "true or false (1, t, TRUE, 0, f, FALSE...)", "int": "a whole number", "float": "a number",
    "duration": "a Go duration such as 10s, 150ms or 1m30s",
}


def parse_value(setting: Setting, text: str) -> object:
    """``text`` read as the reference reads ``setting``'s type; a ``ConfigurationError`` naming the
    variable, its value and what it must be otherwise.

    Args:
        setting: The variable.
        text: Its value.
    """
    kind = setting.kind
    if kind in _WHAT:
        value = _number(kind, text)
        if value is None:
            raise ConfigurationError(
                f"--envoy-env: {setting.name}={text!r}: must be {_WHAT[kind]} (envoyproxy/ratelimit's setting; "
                f"its default is {setting.default or 'empty'})"
            )
        return value
    if kind == "list":
        return [part for part in text.split(",") if part] if text else []
    return text


def read_settings(environ: Mapping[str, str]) -> tuple[dict[str, object], set[str]]:
    """Every setting's value, from ``environ`` else its default, and the names ``environ`` sets.

    Args:
        environ: The environment.
    """
    values: dict[str, object] = {}
    given: set[str] = set()
    for name, setting in SETTINGS.items():
        text = environ.get(name)
        if text is None:
            text = setting.default
            if text == "" and setting.kind in ("int", "float", "bool", "duration"):
                values[name] = None
                continue
        else:
            given.add(name)
        values[name] = parse_value(setting, text)
    return values, given
