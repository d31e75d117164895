"""Store factories, the multi-process client and a store that goes down (``FlakyStore``), used by
the store tests and the failure-policy tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ratewarden.algorithms import ALGORITHMS
from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import Store, StoreError
from ratewarden.stores.memory import MemoryStore

ALGORITHM_NAMES = list(ALGORITHMS)
KINDS = ["redis", "valkey", "cluster", "sentinel", "memcached", "shm"]


def make_store(kind: str, url: str, clock: Callable[[], float] | None = None, **options: Any) -> Store:
    if kind == "shm":  # one host, several processes: no server, nothing to cache
        from ratewarden.stores.shared_memory import SharedMemoryStore

        # As the servers' 5 s: these tests are about decisions, and on a loaded machine a region's
        # holder can wait past the default 0.5 s for a core.
        options.setdefault("lock_timeout", 10.0)
        return SharedMemoryStore.from_url(url, clock=clock, **options) if clock else SharedMemoryStore.from_url(url, **options)
    if kind == "memcached":
        from ratewarden.stores.memcached import MemcachedStore

        options.setdefault("timeout", 5.0)
        return MemcachedStore(url, clock=clock, **options) if clock else MemcachedStore(url, **options)
    from ratewarden.stores.redis import RedisStore

    options.setdefault("timeout", 5.0)
    return RedisStore(url, clock=clock, **options)


def limit_of(algorithm: str, amount: int = 100, period: float = 86400.0) -> Limit:
    return Limit(Rate(amount, period), algorithm)


def client_process(kind: str, url: str, prefix: str, index: int, barrier: Any, out: Any) -> None:
    """One client process: its own store connection, 120 requests per algorithm, spread over 10
    client keys so that every key is contended by every process."""

    async def main() -> dict[str, int]:
        # 840 checks start at once in each of 10 processes. On Memcached they once waited for their
        # key's lock, then for CAS rounds against 9 other processes (over 5 s on 2 loaded cores, and a
        # 30 s deadline here); checks of one key are now coalesced (one contender per process and
        # key), and the timeout counts memcached's silence only, so the usual 5 s is plenty.
        store = make_store(kind, url)
        limits = {name: limit_of(name) for name in ALGORITHM_NAMES}
        barrier.wait()

        async def one(name: str, j: int) -> bool:
            key = f"{prefix}:{{client{(index + j) % 10}}}:{limits[name].suffix}"
            decision = await store.hit([key], [limits[name]], [1.0])
            return decision.allowed

        results = await asyncio.gather(*(one(name, j) for name in ALGORITHM_NAMES for j in range(120)))
        await store.close()
        counts = dict.fromkeys(ALGORITHM_NAMES, 0)
        for (name, _), allowed in zip(((n, j) for n in ALGORITHM_NAMES for j in range(120)), results, strict=True):
            counts[name] += allowed
        return counts

    try:
        out.put((index, asyncio.run(main())))
    except BaseException as exc:  # report instead of leaving the parent waiting on the queue
        out.put((index, f"{type(exc).__name__}: {exc}"))
        raise


class FlakyStore:
    """A remote-style store (answers with a coroutine) over a ``MemoryStore`` that goes down
    after ``up_for`` checks."""

    def __init__(self, up_for: int) -> None:
        self.memory = MemoryStore()
        self.up_for = up_for
        self.hits = 0

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.hits += 1
        if self.hits > self.up_for:
            raise StoreError("store went down")
        return await self.memory.hit(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self.memory.peek(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        await self.memory.reset(keys)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        if self.hits >= self.up_for:
            raise StoreError("store is down")
        return await self.memory.adjust(keys, limits, amounts)


def admitted_by_threads(url: str, algorithm: str, rate: str, threads: int, checks: int) -> int:
    """How many of ``checks`` blocking checks (``hit_blocking``) of one fresh key, from ``threads``
    threads at once, a Redis store at ``url`` admits."""
    import asyncio
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from ratewarden.limits import make_limits
    from ratewarden.stores.redis import RedisStore

    store = RedisStore(url, timeout=5)
    (limit,) = make_limits(rate, algorithm)
    key = f"rw:{{thr|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        with ThreadPoolExecutor(threads) as pool:
            return sum(d.allowed for d in pool.map(lambda _: store.hit_blocking([key], [limit], [1.0]), range(checks)))
    finally:
        asyncio.run(store.close())
