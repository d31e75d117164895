"""``RedisStore``'s options: each keyword argument, else the store URL's query option of the same
name, else its default; checked when the store is built (a ``ConfigurationError`` naming it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import ConfigurationError
from ..urls import StoreURL
from .errors import store_name

__all__ = ["RedisOptions"]


@dataclass(frozen=True)
class RedisOptions:
    """The options of one ``RedisStore`` (see its Args)."""

    timeout: float
    connect_timeout: float
    pool_size: int
    coalesce: bool
    cache: bool
    twemproxy: bool

    @classmethod
    def of(cls, cfg: StoreURL, timeout: float | None, connect_timeout: float | None, pool_size: int | None,
           coalesce: bool | None, cache: bool | None) -> RedisOptions:
        """The options given as keywords, else in ``cfg`` (the parsed store URL), else the defaults."""
        options = cls(
            float(timeout if timeout is not None else cfg.option("timeout", 0.1)),  # type: ignore[arg-type]
            float(connect_timeout if connect_timeout is not None else cfg.option("connect_timeout", 1.0)),  # type: ignore[arg-type]
            int(pool_size if pool_size is not None else cfg.option("pool_size", 8)),  # type: ignore[call-overload]
            bool(coalesce if coalesce is not None else cfg.option("coalesce", 1)),
            bool(cache if cache is not None else cfg.option("cache", 1)),
            bool(cfg.option("twemproxy", 0)),
        )
        if not options.timeout > 0:
            raise ConfigurationError(f"{store_name(cfg.text)}: timeout must be positive, got {options.timeout!r} seconds")
        if options.pool_size < 1:
            raise ConfigurationError(f"{store_name(cfg.text)}: pool_size must be at least 1, got {options.pool_size}")
        if options.twemproxy:
            _through_twemproxy(cfg)
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            path = cfg.options.get(name)
            if path is not None and not os.path.isfile(str(path)):
                raise ConfigurationError(f"store URL {cfg.text!r}: {name} file {path!r} does not exist")
        return options


def _through_twemproxy(cfg: StoreURL) -> None:
    """Refuse with ``twemproxy=1`` what twemproxy cannot carry: another topology, ``client_name``
    (``CLIENT SETNAME``, on which it closes the connection) and a database (its pool's ``redis_db``
    chooses it)."""
    if cfg.kind != "standalone":
        raise ConfigurationError(f"store URL {cfg.text!r}: twemproxy=1 is for one proxy address (redis:// or unix://), "
                                 f"not {cfg.kind}")
    if "client_name" in cfg.options:
        raise ConfigurationError(f"store URL {cfg.text!r}: client_name cannot go with twemproxy=1: twemproxy closes the "
                                 "connection on CLIENT SETNAME")
    if cfg.db:
        raise ConfigurationError(f"store URL {cfg.text!r}: database {cfg.db} cannot go with twemproxy=1: the proxy's "
                                 "pool chooses the database (redis_db in its configuration); use 0")
