"""Where the keys live: the redis-py client for a standalone server, a Sentinel-watched primary
or a Cluster, and Cluster hash slots.

Keys of one (scope, client key) share a hash tag, so such a check is one script on one slot; a
check whose keys span slots is split by ``slot_groups`` (see ``RedisStore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..urls import StoreURL
from .client import ResolvingConnection, ResolvingSSLConnection
from .protocol import key_bytes

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.crc import key_slot
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("RedisStore needs the redis client: pip install 'ratewarden[redis]'") from exc

__all__ = ["make_client", "slot_groups", "spans_slots"]


def make_client(cfg: StoreURL, connect_timeout: float, pool_size: int) -> Any:
    """The redis-py client for ``cfg`` (a parsed ``redis://``, ``rediss://``, ``redis+sentinel://``
    or ``redis+cluster://`` URL): at most ``pool_size`` pipelines are in flight."""
    common: dict[str, Any] = {
        "username": cfg.username,
        "password": cfg.password,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": max(connect_timeout, 1.0),
        "decode_responses": False,
        "encoding_errors": "surrogatepass",  # keys as protocol.key_bytes encodes them
        "client_name": cfg.options.get("client_name"),
    }
    if cfg.tls:
        common["ssl"] = True
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
            if name in cfg.options:
                common[name] = cfg.options[name]
        if "ssl_check_hostname" in cfg.options:
            common["ssl_check_hostname"] = bool(cfg.options["ssl_check_hostname"])
    if cfg.kind == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cfg.hosts],
            max_connections=max(pool_size, 4) * 4,
            retry=Retry(NoBackoff(), 2),
            **common,
        )
    retry = Retry(NoBackoff(), 1)
    if cfg.kind == "sentinel":
        return _sentinel_primary(cfg, connect_timeout, pool_size, common, retry)
    host, port = cfg.hosts[0]
    kwargs: dict[str, Any] = {k: v for k, v in common.items() if k != "ssl"}
    kwargs["connection_class"] = ResolvingSSLConnection if cfg.tls else ResolvingConnection
    pool = aioredis.BlockingConnectionPool(
        host=host, port=port, db=cfg.db, max_connections=pool_size * 4, timeout=connect_timeout, retry=retry,
        **kwargs,
    )
    return aioredis.Redis(connection_pool=pool)


def _sentinel_primary(
    cfg: StoreURL, connect_timeout: float, pool_size: int, common: dict[str, Any], retry: Retry
) -> Any:
    """A client of the primary the Sentinels name for ``cfg.service`` (asked again on reconnect)."""
    sentinel_kwargs: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": max(connect_timeout, 1.0),
    }
    if "sentinel_password" in cfg.options:
        sentinel_kwargs["password"] = cfg.options["sentinel_password"]
        sentinel_kwargs["username"] = cfg.options.get("sentinel_username")
    if cfg.tls:
        sentinel_kwargs.update({k: v for k, v in common.items() if k.startswith("ssl")})
    sentinel = Sentinel(cfg.hosts, sentinel_kwargs=sentinel_kwargs, **common)  # type: ignore[no-untyped-call]
    return sentinel.master_for(cfg.service, db=cfg.db, retry=retry, max_connections=pool_size * 4)


def slot_groups(keys: Sequence[str], cluster: bool) -> list[list[int]]:
    """Indexes of ``keys`` grouped by hash slot (one group when not on a cluster)."""
    if not cluster:
        return [list(range(len(keys)))]
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(key_bytes(key)), []).append(i)
    return list(groups.values())


def spans_slots(keys: Sequence[str]) -> bool:
    """Whether ``keys`` live in more than one hash slot."""
    first = key_slot(key_bytes(keys[0]))
    return any(key_slot(key_bytes(k)) != first for k in keys[1:])
