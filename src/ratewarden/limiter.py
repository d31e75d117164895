"""``Limiter``: the entry point that turns (key, rates) into decisions on a store."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Literal

from ._mypyc import mypyc_attr
from .algorithms import AlgorithmName
from .decision import Decision
from .limits import DEFAULT_ALGORITHM, Limit, make_limits
from .loop_thread import LoopThread
from .rates import Rate, freeze_rates
from .stores.base import Store
from .stores.memory import MemoryStore

__all__ = ["FailurePolicy", "Limiter", "safe_key", "storage_key"]

log = logging.getLogger("ratewarden")

FailurePolicy = Literal["open", "closed"]
MAX_KEY_LENGTH = 200


def safe_key(key: str) -> str:
    """``key`` itself, or its hash when it is over-long or holds braces (which would break the
    Redis Cluster hash tag), so whatever a client sends stays bounded.

    Args:
        key: The key a client sent.
    """
    if len(key) > MAX_KEY_LENGTH or "}" in key or "{" in key:
        return "h." + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return key


def storage_key(prefix: str, scope: str, key: str, suffix: str = "") -> str:
    """``prefix:{scope|key}:suffix``, the one place storage keys are built (the limiter, compiled
    rules and bans all call it, so ``Limiter.reset`` reaches what a rule charged). The braces are
    a Redis Cluster hash tag, so every limit of one (scope, key) shares a slot; braces in
    ``scope`` (route templates such as ``/items/{item_id}``) become parentheses so they cannot cut
    the tag short.

    Args:
        prefix: The limiter's prefix.
        scope: What the key is counted within (a route template, a rule name), or ``""``.
        key: Who is limited (passed through ``safe_key``).
        suffix: Which limit: ``Limit.suffix``; ``""`` for none (bans).
    """
    if "{" in scope or "}" in scope:
        scope = scope.replace("{", "(").replace("}", ")")
    base = f"{prefix}:{{{scope}|{safe_key(key)}}}"
    return f"{base}:{suffix}" if suffix else base


@mypyc_attr(allow_interpreted_subclasses=True)
class Limiter:
    """Checks keys against rates on a store.

    Args:
        store: Where the counts live; the default ``None`` is a new ``MemoryStore()``.
        prefix: Prepended to every storage key, so several limiters can share a store.
        on_error: What happens when the store (or a key function) fails: ``"open"`` (the default) lets the
            request through and logs; ``"closed"`` answers 503.
        enabled: ``False`` turns every integration into a pass-through (e.g. in tests).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        prefix: str = "rw",
        on_error: FailurePolicy = "open",
        enabled: bool = True,
    ) -> None:
        if on_error not in ("open", "closed"):
            raise ValueError(f"on_error must be 'open' or 'closed', got {on_error!r}")
        if store is not None and not isinstance(store, Store):
            # The compiled build's own argument check raises first ("...Store or None object
            # expected; got str"): both reject it here, at construction, naming its type.
            raise TypeError(
                f"store must be a ratewarden Store or None (e.g. MemoryStore(), RedisStore(url)), "
                f"got {_type_name(store)}: {store!r}"
            )
        self.store: Store = store if store is not None else MemoryStore()
        self.prefix = prefix
        self.on_error: FailurePolicy = on_error
        self.enabled = enabled
        self._limits_cache: dict[tuple[object, str], tuple[Limit, ...]] = {}
        self._sync_loop = LoopThread()

    def limits(self, rates: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM) -> tuple[Limit, ...]:
        """Parse and cache ``rates`` for ``algorithm`` (strings are cached, so the hot path does not re-parse).

        Args:
            rates: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of
                them; every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
        """
        spec = freeze_rates(rates)  # a generator is read once, for the cache key and the limits alike
        cache_key = (spec, algorithm)
        found = self._limits_cache.get(cache_key)
        if found is None:
            found = make_limits(spec, algorithm)
            if len(self._limits_cache) < 1024:
                self._limits_cache[cache_key] = found
        return found

    def keys_for(self, key: str, limits: Sequence[Limit], scope: str = "") -> list[str]:
        """The storage key of ``key`` under each of ``limits``.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            limits: What ``Limiter.limits`` returned.
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be a string (e.g. the client IP), got {type(key).__name__} {key!r}")
        prefix = self.prefix
        return [storage_key(prefix, scope, key, limit.suffix) for limit in limits]

    async def check(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        """All-or-nothing check of prepared storage keys (used by the integrations).

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        store = self.store
        if store.local:
            return store.hit_now(keys, limits, costs)
        return await store.hit(keys, limits, costs)

    async def hit(
        self,
        key: str,
        rate: str | Rate | Iterable[str | Rate],
        cost: float = 1,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        scope: str = "",
    ) -> Decision:
        """Charge ``cost`` to ``key`` under every rate in ``rate``, all or nothing.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            cost: Units this request uses (default 1; 0 only reads).
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        _check_cost(cost)
        limits = self.limits(rate, algorithm)
        return await self.check(self.keys_for(key, limits, scope), limits, [cost] * len(limits))

    async def peek(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, scope: str = ""
    ) -> Decision:
        """What a request would see now, without charging anything.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        limits = self.limits(rate, algorithm)
        decisions = await self.store.peek(self.keys_for(key, limits, scope), limits)
        return min(decisions, key=lambda d: d.remaining)

    async def reset(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, scope: str = ""
    ) -> None:
        """Forget ``key``'s state under these rates.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        limits = self.limits(rate, algorithm)
        await self.store.reset(self.keys_for(key, limits, scope))

    async def clear(self) -> None:
        """Forget every key (e.g. between tests)."""
        await self.store.clear()

    async def close(self) -> None:
        """Close the store (on the sync facade's loop if it used the store) and stop that loop."""
        if self._sync_loop.started:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.store.close(), self._sync_loop.start()))
            await asyncio.get_running_loop().run_in_executor(None, self._sync_loop.stop)
            return
        await self.store.close()

    # Sync facade, for threads and plain code. Every call runs the async one on one private
    # loop thread (remote stores keep their connections on that loop from call to call); a
    # local store's check needs no loop at all, as in ``check``.
    def hit_sync(
        self,
        key: str,
        rate: str | Rate | Iterable[str | Rate],
        cost: float = 1,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        scope: str = "",
    ) -> Decision:
        """``hit`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            cost: Units this request uses (default 1).
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        if self.store.local:
            _check_cost(cost)
            limits = self.limits(rate, algorithm)
            return self.store.hit_now(self.keys_for(key, limits, scope), limits, [cost] * len(limits))
        return self._sync_loop.run(self.hit(key, rate, cost, algorithm, scope))

    def peek_sync(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, scope: str = ""
    ) -> Decision:
        """``peek`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        return self._sync_loop.run(self.peek(key, rate, algorithm, scope))

    def reset_sync(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, scope: str = ""
    ) -> None:
        """``reset`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            scope: What the key is counted within, e.g. a route; the default ``""`` shares one count for
                ``key`` across scopes.
        """
        self._sync_loop.run(self.reset(key, rate, algorithm, scope))

    def clear_sync(self) -> None:
        self._sync_loop.run(self.clear())

    def close_sync(self) -> None:
        """Close the store and stop the sync facade's loop thread."""
        self._sync_loop.run(self.store.close())
        self._sync_loop.stop()


def _type_name(value: object) -> str:
    """``str``, ``abc.ABCMeta``: a type's name as the compiled build's argument checks print it."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_cost(cost: float) -> None:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise TypeError(f"cost must be a number, got {type(cost).__name__} {cost!r}")
    if not 0 <= cost < math.inf:
        raise ValueError(f"cost must be zero or positive, got {cost!r}")
