"""Stores: where limit state lives. ``MemoryStore`` and ``SharedMemoryStore`` (one host, several
processes) need nothing; the others need an extra. ``open_store(url)`` builds the store a URL
names (``memory://``, ``shm://``, ``redis://``, ``memcached://``...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Store, StoreError
from .breaker import Breaker
from .memory import MemoryStore
from .urls import open_store

if TYPE_CHECKING:
    from .memcached import MemcachedStore
    from .redis import RedisStore
    from .shared_memory import SharedMemoryStore

__all__ = [
    "Breaker", "MemcachedStore", "MemoryStore", "RedisStore", "SharedMemoryStore", "Store", "StoreError", "open_store",
]


def __getattr__(name: str) -> Any:
    # Distributed stores import their client libraries, which are optional extras.
    if name == "RedisStore":
        from .redis import RedisStore

        return RedisStore
    if name == "MemcachedStore":
        from .memcached import MemcachedStore

        return MemcachedStore
    if name == "SharedMemoryStore":  # POSIX only (fcntl), so imported on first use
        from .shared_memory import SharedMemoryStore

        return SharedMemoryStore
    raise AttributeError(f"module 'ratewarden.stores' has no attribute {name!r}")
