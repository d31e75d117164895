"""Where the keys live: the redis-py client for a standalone server, a Sentinel-watched primary
or a Cluster, and Cluster hash slots.

Keys of one (scope, client key) share a hash tag, so such a check is one script on one slot; a
check whose keys span slots is split by ``slot_groups`` (see ``RedisStore``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any

from ..deadline import EXTENSIONS
from ..urls import StoreURL
from ._redis import ClusterNode, NoBackoff, RedisCluster, RedisError, Retry, Sentinel, aioredis, key_slot
from .client import ResolvingConnection, ResolvingSSLConnection, sentinel_clients
from .protocol import key_bytes

__all__ = ["close_client", "make_client", "plain_handshake", "pool_limit", "slot_groups", "spans_slots"]


def plain_handshake(cfg: StoreURL) -> dict[str, Any]:
    """Connection arguments for a server behind twemproxy (``twemproxy=1``), which closes the
    connection on ``HELLO`` and ``CLIENT``: RESP2 and no ``CLIENT SETINFO`` (redis-py 8 sends
    both by default); nothing otherwise."""
    if not cfg.option("twemproxy", 0):
        return {}
    if "driver_info" in inspect.signature(aioredis.connection.AbstractConnection.__init__).parameters:  # newer redis-py
        return {"protocol": 2, "driver_info": None}
    return {"protocol": 2, "lib_name": None, "lib_version": None}


def pool_limit(kind: str, pool_size: int) -> int:
    """The connections ``make_client``'s pool opens at most (per node on a cluster)."""
    return max(pool_size, 4) * 4 if kind == "cluster" else pool_size * 4


def make_client(cfg: StoreURL, timeout: float, connect_timeout: float, pool_size: int) -> tuple[Any, list[Any]]:
    """The redis-py client for ``cfg`` (a parsed ``redis://``, ``rediss://``, ``unix://``,
    ``redis+sentinel://`` or ``redis+cluster://`` URL), with a pool of ``pool_limit`` connections. Also the clients
    it relies on that closing it leaves open (a Sentinel set-up's client of each Sentinel).

    Its read timeout is a backstop behind the store's own timers (``deadline``), which judge a
    call at ``timeout`` and wait on while the loop is behind: never shorter than the longest of
    those waits, so that a Cluster check (sent through this client) or a reset waits the
    ``timeout`` it was given, not redis-py's 1 s."""
    common: dict[str, Any] = {
        "username": cfg.username,
        "password": cfg.password,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": max(connect_timeout, 1.0, (EXTENSIONS + 1) * timeout),
        "decode_responses": False,
        "encoding_errors": "surrogatepass",  # keys as protocol.key_bytes encodes them
        "client_name": cfg.options.get("client_name"),
        **plain_handshake(cfg),
    }
    if cfg.tls:
        common["ssl"] = True
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
            if name in cfg.options:
                common[name] = cfg.options[name]
        if "ssl_check_hostname" in cfg.options:
            common["ssl_check_hostname"] = bool(cfg.options["ssl_check_hostname"])
    if cfg.kind == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cfg.hosts],
            max_connections=pool_limit(cfg.kind, pool_size),
            retry=Retry(NoBackoff(), 2),
            **common,
        )
        return cluster, []
    retry = Retry(NoBackoff(), 1)
    if cfg.kind == "sentinel":
        return _sentinel_primary(cfg, connect_timeout, pool_size, common, retry)
    kwargs: dict[str, Any] = {k: v for k, v in common.items() if k != "ssl"}
    if cfg.socket is not None:
        kwargs.update(path=cfg.socket, connection_class=aioredis.UnixDomainSocketConnection)
    else:
        kwargs.update(host=cfg.hosts[0][0], port=cfg.hosts[0][1])
        kwargs["connection_class"] = ResolvingSSLConnection if cfg.tls else ResolvingConnection
    pool = aioredis.BlockingConnectionPool(
        db=cfg.db, max_connections=pool_limit(cfg.kind, pool_size), timeout=connect_timeout, retry=retry, **kwargs,
    )
    return aioredis.Redis(connection_pool=pool), []


async def close_client(client: Any, others: list[Any]) -> None:
    """Close ``client`` and ``others`` (``make_client``'s pair) with every connection they opened,
    each even if another fails: a client given its pool, as ours are, leaves the pool open."""
    closers = [client.aclose()] if isinstance(client, RedisCluster) else [client.aclose(close_connection_pool=True)]
    closers += [other.aclose(close_connection_pool=True) for other in others]
    for closing in closers:
        with contextlib.suppress(RedisError, OSError):
            await closing


def _sentinel_primary(
    cfg: StoreURL, connect_timeout: float, pool_size: int, common: dict[str, Any], retry: Retry
) -> tuple[Any, list[Any]]:
    """A client of the primary the Sentinels name for ``cfg.service`` (asked again on reconnect),
    and the client of each Sentinel it asks."""
    sentinel_kwargs: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": max(connect_timeout, 1.0),
    }
    if "sentinel_password" in cfg.options:
        sentinel_kwargs["password"] = cfg.options["sentinel_password"]
        sentinel_kwargs["username"] = cfg.options.get("sentinel_username")
    if cfg.tls:
        sentinel_kwargs.update({k: v for k, v in common.items() if k.startswith("ssl")})
    sentinel = Sentinel(cfg.hosts, sentinel_kwargs=sentinel_kwargs, **common)  # type: ignore[no-untyped-call, unused-ignore]
    primary = sentinel.master_for(cfg.service, db=cfg.db, retry=retry, max_connections=pool_limit(cfg.kind, pool_size))
    return primary, sentinel_clients(sentinel)


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
