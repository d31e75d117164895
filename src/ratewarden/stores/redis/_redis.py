"""Everything the Redis store takes from redis-py, imported in one place: without redis-py
installed, importing any part of ``ratewarden.stores.redis`` that needs it raises the one
``ImportError`` below, which names the extra to install. The other modules import these names
from here, never from ``redis`` itself.
"""

from __future__ import annotations

#: Raised (with the original ``ImportError`` as ``__cause__``) when redis-py is not installed.
MISSING = "RedisStore needs the redis client: pip install 'ratewarden[redis]'"

try:
    # The synchronous client (``hit_blocking``: WSGI apps, threads).
    import redis as syncredis
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode as SyncClusterNode
    from redis.cluster import RedisCluster as SyncRedisCluster
    from redis.crc import key_slot
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import (
        NoScriptError,
        ReadOnlyError,
        RedisClusterException,
        RedisError,
        ResponseError,
    )
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry as SyncRetry
    from redis.sentinel import Sentinel as SyncSentinel
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(MISSING) from exc

__all__ = [
    "MISSING", "ClusterNode", "NoBackoff", "NoScriptError", "ReadOnlyError", "RedisCluster", "RedisClusterException",
    "RedisConnectionError", "RedisError", "RedisTimeoutError", "ResponseError", "Retry", "Sentinel", "SyncClusterNode",
    "SyncRedisCluster", "SyncRetry", "SyncSentinel", "aioredis", "key_slot", "syncredis",
]
