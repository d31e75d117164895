"""Everything the memcached store takes from aiomcache, imported in one place: without aiomcache
installed, importing any part of ``ratewarden.stores.memcached`` raises the one ``ImportError``
below, which names the extra to install.
"""

from __future__ import annotations

try:
    import aiomcache
    from aiomcache.exceptions import ClientException
    from aiomcache.pool import Connection, MemcachePool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MemcachedStore needs aiomcache: pip install 'ratewarden[memcached]'") from exc

__all__ = ["ClientException", "Connection", "MemcachePool", "aiomcache"]
