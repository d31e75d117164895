"""The one rule of ratewarden's per-process lookup caches: bounded in entries and in bytes, and
emptied whole when full. A hit costs a plain ``dict`` read, with no bookkeeping; a miss stores its
answer with ``remember``, which keeps an entry only when its size (``size_of`` its key and value)
is at most ``max_bytes / limit``: ``limit`` entries then hold at most ``max_bytes`` (``DEFAULT_BYTES``,
4 MiB, unless the cache says otherwise), whatever text clients put in their keys. An oversized entry
is simply not cached: its request takes the slow path, as an uncached one does. (Caches whose
entries expire, such as the stores' rejection caches and the ban cache, prune expired entries first
instead: they live in their own modules.)"""

from __future__ import annotations

import sys
from typing import Final, TypeVar

__all__ = ["DEFAULT_BYTES", "remember", "size_of"]

K = TypeVar("K")
V = TypeVar("V")

DEFAULT_BYTES: Final = 4 << 20
"""A cache's bytes of keys and values at most, unless it gives its own ``max_bytes``."""


def size_of(value: object) -> int:
    """The bytes an entry's key or value owns: strings and bytes, numbers, and tuples of them, as
    ``sys.getsizeof`` counts them; any other object is shared (a plan, a limit) and counts 0.

    Args:
        value: A cache entry's key or value.
    """
    if isinstance(value, (str, bytes, int, float)):
        return sys.getsizeof(value)
    if isinstance(value, tuple):
        total = sys.getsizeof(value)
        for item in value:
            total += size_of(item)
        return total
    return 0


def remember(cache: dict[K, V], key: K, value: V, limit: int, max_bytes: int = DEFAULT_BYTES) -> None:
    """Store ``value`` under ``key``, emptying ``cache`` first when it holds ``limit`` entries; an
    entry over ``max_bytes / limit`` bytes is not stored, so the cache never holds more than
    ``max_bytes`` of keys and values.

    Args:
        cache: The cache.
        key: What was looked up.
        value: Its answer.
        limit: The most entries the cache holds.
        max_bytes: The most bytes its keys and values take together.
    """
    if size_of(key) + size_of(value) > max_bytes // limit:
        return
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
