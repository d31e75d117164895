"""Store URLs: ``redis://``, ``rediss://``, ``unix://`` (Redis on a unix socket), ``redis+sentinel://``,
``redis+cluster://``, ``memcached://``, and the local ``shm://<name>`` and ``memory://`` (``open_store`` builds the store any of them names).

One parser for every remote store, so pool size, timeouts, TLS and auth are spelled the same
everywhere and a typo is reported by name instead of being silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .base import Store

__all__ = ["StoreURL", "check_store_url", "open_store", "parse_local_url", "parse_store_url", "redact"]

_KINDS = {
    "redis": ("standalone", False),
    "valkey": ("standalone", False),
    "rediss": ("standalone", True),
    "valkeys": ("standalone", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "unix": ("standalone", False),  # redis-py's spelling of a unix socket: unix:///path/redis.sock?db=0
    "memcached": ("memcached", False),
}
_DEFAULT_PORTS = {"standalone": 6379, "sentinel": 26379, "cluster": 6379, "memcached": 11211}

#: How a message names an option's type ("must be a whole number", not "must be a int").
_TYPE_WORDS: dict[type, str] = {int: "a whole number", float: "a number", str: "text"}

#: Every scheme ``open_store`` takes, as a message lists them.
ALL_SCHEMES = (
    "memory://", "shm://<name>", "redis://", "rediss://", "valkey://", "valkeys://", "redis+sentinel://",
    "rediss+sentinel://", "redis+cluster://", "rediss+cluster://", "unix:///<socket path>", "memcached://",
)


def _unsupported(text: str, scheme: str, schemes: list[str], listed: str) -> ConfigurationError:
    """The error for a URL whose scheme no store here takes: the likely one, then the list."""
    close = difflib.get_close_matches(scheme, schemes, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]}://? " if close else ""
    return ConfigurationError(f"unsupported store URL {text!r}: {guess}the scheme must be one of {listed}")


def _option(text: str, name: str, value: str, kind_of: type) -> object:
    """``value`` of option ``name`` converted to ``kind_of``, or an error naming what it must be."""
    try:
        return kind_of(value)
    except ValueError:
        raise ConfigurationError(
            f"store URL {text!r}: option {name}={value!r} must be {_TYPE_WORDS.get(kind_of, kind_of.__name__)}"
        ) from None


#: Query options every URL accepts, with their types.
OPTIONS: dict[str, type] = {
    "pool_size": int,  # connections per server
    "timeout": float,  # seconds a check may take before StoreError (the breaker counts these)
    "connect_timeout": float,  # seconds to establish a connection
    "coalesce": int,  # 1 = pipeline concurrent checks of one event-loop tick, 0 = one call each
    "cache": int,  # 1 = remember rejections locally until their retry time, 0 = always ask
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,  # none | optional | required
    "ssl_check_hostname": int,
    "sentinel_username": str,
    "sentinel_password": str,
    "client_name": str,
    "twemproxy": int,  # 1 = through twemproxy (nutcracker), which refuses TIME and SCRIPT LOAD
}
_REDIS_ONLY = ("ssl_", "sentinel_", "client_", "twemproxy")  # options a memcached:// URL refuses


@dataclass
class StoreURL:
    """A parsed store URL.

    Args:
        kind: ``"standalone"``, ``"sentinel"``, ``"cluster"`` or ``"memcached"``.
        hosts: Every ``host:port`` given (comma-separated in the URL); none for a unix socket.
        tls: Whether to connect with TLS (``rediss://``).
        db: The Redis database number.
        service: The Sentinel master's name.
        username: The user, if the URL names one.
        password: The password, if the URL has one.
        options: The query options, converted to their types.
        text: The URL with its password hidden, for messages.
        socket: The unix socket's path (``unix://``), else ``None``.
    """

    kind: str  # standalone | sentinel | cluster | memcached
    hosts: list[tuple[str, int]]
    tls: bool = False
    db: int = 0
    service: str = ""  # Sentinel master name
    username: str | None = None
    password: str | None = None
    options: dict[str, object] = field(default_factory=dict)
    text: str = ""  # the URL with its password hidden, for messages
    socket: str | None = None

    def option(self, name: str, default: object) -> object:
        """The query option ``name``, or ``default``.

        Args:
            name: The option's name.
            default: What to return when the URL does not set it.
        """
        return self.options.get(name, default)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``.

    Args:
        url: Any URL.
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return url.replace(parts.netloc, f"{user}:***@{netloc[-1]}", 1)


def parse_store_url(url: str, allowed: tuple[str, ...]) -> StoreURL:
    """Parse ``url``; ``allowed`` lists the kinds the calling store supports.

    A little over 60 lines: one check after another, each raising its own message naming the URL.

    Args:
        url: The store's URL.
        allowed: The kinds the calling store supports.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"store URL must be a string, got {type(url).__name__}")
    text = redact(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    kind_tls = _KINDS.get(scheme)
    if kind_tls is None or kind_tls[0] not in allowed:
        names = [s for s, (k, _) in _KINDS.items() if k in allowed]
        raise _unsupported(text, scheme, names, ", ".join(f"{s}://" for s in names))
    kind, tls = kind_tls
    hostpart = parts.netloc.rsplit("@", 1)[-1]
    if scheme == "unix":
        result = _unix_socket(text, hostpart, unquote(parts.path))
    else:
        result = StoreURL(kind=kind, hosts=_hosts(text, scheme, kind, hostpart), tls=tls, text=text)
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        user, sep, password = userinfo.partition(":")
        result.username = unquote(user) or None
        result.password = unquote(password) if sep else None
    path = [p for p in parts.path.split("/") if p]
    if kind == "sentinel":
        if not path:
            raise ConfigurationError(
                f"store URL {text!r} names no Sentinel service: use "
                f"redis+sentinel://host:26379/<service name>[/<db>]"
            )
        result.service = unquote(path[0])
        result.db = _database(text, path[1:])
    elif kind == "standalone" and result.socket is None:
        result.db = _database(text, path)
    elif path and kind == "cluster" and path != ["0"]:
        raise ConfigurationError(f"store URL {text!r}: Redis Cluster has only database 0, got {parts.path!r}")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "db" and result.socket is not None:  # the path is the socket's: the database is an option
            if not (value.isascii() and value.isdigit()):
                raise ConfigurationError(f"store URL {text!r}: option db={value!r} must be a database number (e.g. ?db=0)")
            result.db = int(value)
            continue
        kind_of = OPTIONS.get(name)
        if kind_of is None or (kind == "memcached" and name.startswith(_REDIS_ONLY)):
            known = ", ".join(n for n in OPTIONS if kind != "memcached" or not n.startswith(_REDIS_ONLY))
            raise ConfigurationError(f"store URL {text!r}: unknown option {name!r}; known options: {known}")
        converted = _option(text, name, value, kind_of)
        if isinstance(converted, (int, float)) and converted < 0:
            raise ConfigurationError(f"store URL {text!r}: option {name}={value!r} must not be negative")
        if name == "twemproxy" and converted not in (0, 1):
            raise ConfigurationError(f"store URL {text!r}: option twemproxy={value!r} must be 0 or 1")
        result.options[name] = converted
    return result


def _hosts(text: str, scheme: str, kind: str, hostpart: str) -> list[tuple[str, int]]:
    """The ``host:port`` pairs of a URL's comma-separated host part (a port left out is the kind's default)."""
    if not hostpart:
        raise ConfigurationError(f"store URL {text!r} names no host (e.g. {scheme}://127.0.0.1:{_DEFAULT_PORTS[kind]})")
    hosts = []
    for item in hostpart.split(","):
        if item.startswith("["):  # [ipv6]:port
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        number = int(port) if port.isascii() and port.isdigit() else -1 if port else _DEFAULT_PORTS[kind]
        if not 1 <= number <= 65535:
            raise ConfigurationError(f"store URL {text!r}: bad port {port!r} in {item!r} (a port is 1 to 65535)")
        hosts.append((host, number))
    return hosts


def _unix_socket(text: str, hostpart: str, path: str) -> StoreURL:
    """A ``unix:///path/redis.sock`` URL: a standalone Redis on the socket at the URL's path."""
    if hostpart:
        raise ConfigurationError(
            f"store URL {text!r}: a unix socket URL names no host: use unix:///path/to/redis.sock[?db=0] (three slashes)"
        )
    if not path.startswith("/") or path.endswith("/"):
        raise ConfigurationError(f"store URL {text!r}: the socket path must be absolute, e.g. unix:///run/redis/redis.sock")
    return StoreURL(kind="standalone", hosts=[], text=text, socket=path)


def _database(text: str, path: list[str]) -> int:
    """The database number a URL's path names (``0`` when it names none).

    Args:
        text: The URL with its password hidden, for the message.
        path: The path's segments after any Sentinel service name.
    """
    if not path:
        return 0
    if len(path) > 1 or not (path[0].isascii() and path[0].isdigit()):
        raise ConfigurationError(
            f"store URL {text!r}: the database must be a number, got {'/'.join(path)!r} (e.g. /0)"
        )
    return int(path[0])


#: What opens each scheme's store, as ``"module:attribute"`` under ``ratewarden.stores`` (the
#: remaining schemes are Redis's). Names, not imports: the stores import this module for its
#: parsers, and each is loaded on use (``redis``, ``memcached`` need an extra, ``shm`` is POSIX only).
OPENERS: dict[str, str] = {
    "memory": "memory:MemoryStore",
    "shm": "shared_memory:SharedMemoryStore.from_url",
    "memcached": "memcached:MemcachedStore",
    "redis": "redis:RedisStore",
}


def load(name: str) -> object:
    """The object ``name`` (``"module:attribute.attribute"``, the module under ``ratewarden.stores``)
    names, importing its module.

    Args:
        name: As in ``OPENERS``.
    """
    module, _, path = name.partition(":")
    found: object = import_module(f"{__package__}.{module}")
    for attribute in path.split("."):
        found = getattr(found, attribute)
    return found


#: Options of ``shm://<name>`` and ``memory://`` URLs, with their types.
LOCAL_OPTIONS: dict[str, dict[str, type]] = {
    "shm": {"max_keys": int, "log_size": int, "directory": str, "lock_timeout": float},
    "memory": {"max_keys": int},
}
_LOCAL_LEAST = {"max_keys": 1, "log_size": 0}  # the smallest value each numeric option accepts


def parse_local_url(url: str) -> tuple[str, str, dict[str, object]]:
    """Parse ``shm://<name>?max_keys=..&log_size=..&directory=..&lock_timeout=..`` or ``memory://?max_keys=..``
    into ``(kind, name, options)``, naming any mistake.

    Args:
        url: A ``shm://`` or ``memory://`` URL.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"store URL must be a string, got {type(url).__name__}")
    parts = urlsplit(url)
    kind = parts.scheme.lower()
    known = LOCAL_OPTIONS.get(kind)
    if known is None:
        raise _unsupported(url, kind, list(LOCAL_OPTIONS), "shm://<name> or memory://")
    name = unquote(parts.netloc + parts.path).strip("/")
    if kind == "shm" and not name:
        raise ConfigurationError(f"store URL {url!r} names no table: use shm://<name>[?max_keys=65536]")
    if kind == "memory" and name:
        raise ConfigurationError(f"store URL {url!r}: memory:// takes no name (use memory://?max_keys=N)")
    options: dict[str, object] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        kind_of = known.get(key)
        if kind_of is None:
            raise ConfigurationError(f"store URL {url!r}: unknown option {key!r}; known options: {', '.join(known)}")
        options[key] = converted = _option(url, key, value, kind_of)
        least = _LOCAL_LEAST.get(key)
        if least is not None and isinstance(converted, int) and converted < least:
            raise ConfigurationError(f"store URL {url!r}: option {key}={value!r} must be at least {least}")
    return kind, name, options


def check_store_url(url: str) -> None:
    """Raise ``ConfigurationError`` (a ``ValueError``) if ``url`` is not a store URL ratewarden understands (nothing is opened).

    Args:
        url: The URL to check.
    """
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme in LOCAL_OPTIONS:
        kind, name, _ = parse_local_url(url)
        if kind == "shm":
            segment_path = cast("Callable[[str], object]", load("shared_memory:segment_path"))
            segment_path(name)  # checks the name
        return
    if scheme not in _KINDS and isinstance(url, str):
        raise _unsupported(redact(url), scheme, [*LOCAL_OPTIONS, *_KINDS], ", ".join(ALL_SCHEMES))
    parse_store_url(url, ("standalone", "sentinel", "cluster", "memcached"))


def open_store(url: str) -> Store:
    """The store a URL names: ``memory://``, ``shm://<name>``, ``redis://``/``valkey://`` (and
    their TLS, Sentinel and Cluster forms), ``unix://`` (Redis on a socket) or ``memcached://``.

    Args:
        url: The store's URL.
    """
    check_store_url(url)
    scheme = urlsplit(url).scheme.lower()
    opener = cast("Callable[..., Store]", load(OPENERS.get(scheme, OPENERS["redis"])))
    if scheme == "memory":
        return opener(**parse_local_url(url)[2])
    return opener(url)
