"""Everything the Redis store takes from redis-py, imported in one place: without redis-py
installed, importing any part of ``ratewarden.stores.redis`` that needs it raises the one
``ImportError`` below, which names the extra to install. The other modules import these names
from here, never from ``redis`` itself.
"""

from __future__ import annotations

#: Raised (with the original ``ImportError`` as ``__cause__``) when redis-py is not installed.
MISSING = "RedisStore needs the redis client: pip install 'ratewarden[redis]'"

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.crc import key_slot
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError, ReadOnlyError, RedisError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(MISSING) from exc

__all__ = [
    "MISSING", "ClusterNode", "NoBackoff", "NoScriptError", "ReadOnlyError", "RedisCluster", "RedisConnectionError",
    "RedisError", "ResponseError", "Retry", "Sentinel", "aioredis", "key_slot",
]
