"""The one rule of ratewarden's per-process lookup caches: bounded in entries, and emptied whole
when full. A hit costs a plain ``dict`` read, with no bookkeeping; a miss stores its answer with
``remember``. Caches whose keys clients choose also skip oversized keys at the call site, so their
bytes stay bounded too. (Caches whose entries expire, such as the stores' rejection caches and the
ban cache, prune expired entries first instead: they live in their own modules.)"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["remember"]

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, limit: int) -> None:
    """Store ``value`` under ``key``, emptying ``cache`` first when it holds ``limit`` entries.

    Args:
        cache: The cache.
        key: What was looked up.
        value: Its answer.
        limit: The most entries the cache holds.
    """
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
