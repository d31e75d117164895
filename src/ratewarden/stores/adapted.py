"""A store of your own, as the doors call it: ``as_store`` gives an object that implements
``protocols.AsyncStore`` the ``Store`` surface, and answers each capability from the protocols the
object implements, checked once, here (``can_block``, ``supports``). A door that needs a capability
refuses the store at start-up, so a method of one the store lacks is never called: called anyway,
it raises ``ConfigurationError`` naming the protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..charges import Adjusting
from ..decision import Decision
from ..errors import ConfigurationError
from ..limits import Limit
from .base import Capability, Store
from .protocols import (
    BLOCKING,
    AsyncStore,
    BlockingAdjust,
    BlockingHit,
    BlockingOperation,
    BlockingPeek,
    BlockingReset,
    Clearable,
    Closable,
    HealthReporting,
    LocalStore,
    RejectionCache,
)

__all__ = ["Adapted", "LocalAdapted", "as_store", "type_name"]

# One adapter class per class of store adapted, named after it: the doors' errors name your class.
_KINDS: dict[tuple[type, bool], type[Adapted]] = {}


def as_store(store: Store | AsyncStore, role: str = "store") -> Store:
    """``store`` as a ``Store``: itself when it is one, else adapted (``Adapted``, or
    ``LocalAdapted`` for a ``LocalStore``).

    Args:
        store: A ``Store``, or an object implementing ``protocols.AsyncStore``.
        role: What it is for, named in the error (``"store"``, ``"fallback"``).
    """
    if isinstance(store, Store):
        return store
    if isinstance(store, type) or not isinstance(store, AsyncStore):
        missing = [name for name in ("hit", "peek", "reset") if not callable(getattr(store, name, None))]
        lacks = f" (no {', '.join(missing)})" if missing and not isinstance(store, type) else ""
        raise TypeError(
            f"{role} must be a ratewarden Store or None (e.g. MemoryStore(), RedisStore(url)), or an instance with "
            f"async hit, peek and reset (stores.protocols.AsyncStore); got {type_name(store)}{lacks}: {store!r}"
        )
    local = isinstance(store, LocalStore)
    kind = _KINDS.get((type(store), local))
    if kind is None:
        base = LocalAdapted if local else Adapted
        kind = type(type(store).__name__, (base,), {"__module__": type(store).__module__, "__doc__": base.__doc__})
        _KINDS[(type(store), local)] = kind
    return kind(store)


def type_name(value: object) -> str:
    """``str``, ``abc.ABCMeta``: a type's name as the compiled build's argument checks print it.

    Args:
        value: What was given.
    """
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


class Adapted(Store):
    """An ``AsyncStore`` as a ``Store``: each operation is the wrapped store's; its capabilities are
    the protocols it implements.

    Args:
        inner: The store adapted.
    """

    def __init__(self, inner: AsyncStore) -> None:
        self.inner = inner
        self.blocking = frozenset(op for op, protocol in BLOCKING.items() if isinstance(inner, protocol))
        self.adjusting = isinstance(inner, Adjusting)
        self._cache = inner if isinstance(inner, RejectionCache) else None

    def __repr__(self) -> str:
        return repr(self.inner)

    def supports(self, capability: Capability) -> bool:
        return self.local if capability == "local" else self.adjusting

    def can_block(self, *operations: BlockingOperation) -> bool:
        return all(op in self.blocking for op in operations)

    def _lacks(self, what: str, protocol: type) -> ConfigurationError:
        return ConfigurationError(
            f"{self.inner!r} has no {what} (it does not implement stores.protocols.{protocol.__name__}); "
            "the option that calls it should have refused this store at start-up"
        )

    def _has(self, protocol: type, what: str) -> Any:
        if not isinstance(self.inner, protocol):
            raise self._lacks(what, protocol)
        return self.inner

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return await self.inner.hit(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self.inner.peek(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        await self.inner.reset(keys)

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        store: Adjusting = self._has(Adjusting, "adjust")
        return await store.adjust(keys, limits, amounts)

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        store: BlockingHit = self._has(BlockingHit, "hit_blocking")
        return store.hit_blocking(keys, limits, costs)

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        store: BlockingPeek = self._has(BlockingPeek, "peek_blocking")
        return store.peek_blocking(keys, limits)

    def reset_blocking(self, keys: Sequence[str]) -> None:
        store: BlockingReset = self._has(BlockingReset, "reset_blocking")
        store.reset_blocking(keys)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        store: BlockingAdjust = self._has(BlockingAdjust, "adjust_blocking")
        return store.adjust_blocking(keys, limits, amounts)

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        cache = self._cache
        return None if cache is None else cache.cached_rejection(keys, costs)

    @property
    def cached_rejections(self) -> int:
        """The wrapped store's count (``HealthReporting``), else 0."""
        inner = self.inner
        return inner.cached_rejections if isinstance(inner, HealthReporting) else 0

    async def clear(self) -> None:
        store: Clearable = self._has(Clearable, "clear")
        await store.clear()

    async def close(self) -> None:
        if isinstance(self.inner, Closable):
            await self.inner.close()


class LocalAdapted(Adapted):
    """A ``LocalStore`` as a ``Store``: its ``*_now`` methods, called without a coroutine; its
    blocking ones are them.

    Args:
        inner: The store adapted.
    """

    local = True

    def __init__(self, inner: AsyncStore) -> None:
        super().__init__(inner)
        self.now: LocalStore = self._has(LocalStore, "hit_now")
        self.blocking = frozenset(BLOCKING)

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.now.hit_now(keys, limits, costs)

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.now.peek_now(keys, limits)

    def reset_now(self, keys: Sequence[str]) -> None:
        self.now.reset_now(keys)

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.now.adjust_now(keys, limits, amounts)

    # Its blocking methods are its ``*_now``: no I/O, so nothing to block on.
    hit_blocking = hit_now
    peek_blocking = peek_now
    reset_blocking = reset_now
    adjust_blocking = adjust_now
