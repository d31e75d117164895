"""The contract every store fulfils: atomic all-or-nothing checks of several limits, and the one
place a store's client failures become ``StoreError`` (``client_error``, ``no_reply``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..errors import ConfigurationError, StoreError
from ..limits import Limit

__all__ = [
    "BlockingOperation", "Capability", "Store", "StoreError", "client_error", "combine", "failure_reason", "no_reply",
]

Capability = Literal["local", "adjust", "server_clock"]
#: What ``Store.can_block`` is asked about: ``hit_blocking``, ``peek_blocking``, ``reset_blocking``,
#: ``adjust_blocking``.
BlockingOperation = Literal["hit", "peek", "reset", "adjust"]
_NOW = {"hit": "hit_now", "peek": "peek_now", "reset": "reset_now", "adjust": "adjust_now"}
_ABILITIES = {
    "local": "answer without I/O",
    "adjust": "refund and penalise (adjust)",
    "server_clock": "keep time on its server",
}
_WHO_CAN = {
    "local": "MemoryStore, SharedMemoryStore",
    "adjust": "MemoryStore, SharedMemoryStore, RedisStore, MemcachedStore, Breaker over one of them",
    "server_clock": "RedisStore",
}


@mypyc_attr(allow_interpreted_subclasses=True)
class Store(ABC):
    """Stores evaluate the algorithms themselves, so each check is one atomic step.

    ``hit`` checks ``limits[i]`` against ``keys[i]`` with ``costs[i]``: if every limit allows,
    all are charged; if any denies, none is. It returns the most restrictive decision.
    """

    # What a store can do, declared once per class (wrappers answer for what they wrap, through
    # ``supports``); options that need a capability check it when they are configured.
    #: ``hit_now``/``peek_now`` answer without I/O (the middleware then skips the coroutine).
    local: ClassVar[bool] = False
    #: ``adjust`` works: refunds and penalties, so after-response charging (``charge=``).
    can_adjust: ClassVar[bool] = False
    #: Time comes from the store's server, one clock for every process that uses it.
    server_clock: ClassVar[bool] = False
    #: What the store's client raises when the store cannot answer; each store catches these where
    #: it calls its client (no wrapper around the check) and raises ``self.store_error(...)``.
    client_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: Checks this store answered from its local cache of rejections, without asking its server
    #: (``RedisStore``, ``MemcachedStore``); 0 for stores without such a cache.
    #: ``Limiter.without_store`` reports it as ``over_limit_cache``.
    cached_rejections: int = 0

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A subclass overriding ``hit_now`` but not ``hit_one`` gets the default ``hit_one``, so its
        ``hit_now`` answers every check (a ``MemoryStore`` subclass would otherwise keep the parent's)."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "hit_now" in own and "hit_one" not in own:
            setattr(cls, "hit_one", Store.hit_one)  # noqa: B010 - a method, not an attribute mypy checks

    def store_error(self, operation: str, exc: BaseException) -> StoreError:
        """``exc`` (one of ``client_errors``) as a ``StoreError`` naming this store and ``operation``,
        with ``exc`` as its ``__cause__``; a ``StoreError`` is returned as is.

        Args:
            operation: What failed (``"hit"``, ``"peek"``, ``"adjust"``, ``"reset"``, ``"clear"``).
            exc: The client's exception.
        """
        return client_error(repr(self), operation, exc)

    def supports(self, capability: Capability) -> bool:
        """Whether this store has ``capability`` (``"local"``, ``"adjust"``, ``"server_clock"``).

        Args:
            capability: ``"local"``, ``"adjust"`` or ``"server_clock"``.
        """
        if capability == "local":
            return self.local
        if capability == "adjust":
            return self.can_adjust
        return self.server_clock

    def require(self, capability: Capability, needed_by: str) -> None:
        """Raise ``ConfigurationError`` at start-up when ``needed_by`` needs a missing capability.

        Args:
            capability: What is needed: ``"local"``, ``"adjust"`` or ``"server_clock"``.
            needed_by: The option needing it, named in the error (e.g. ``"charge="``).
        """
        if not self.supports(capability):
            raise ConfigurationError(
                f"{needed_by} needs a store that can {_ABILITIES[capability]}; "
                f"{type(self).__name__} cannot (stores that can: {_WHO_CAN[capability]})"
            )

    @abstractmethod
    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Charge all or nothing; return the deciding decision.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """

    @abstractmethod
    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Each limit's current decision for a zero-cost request, charging nothing.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """

    @abstractmethod
    async def reset(self, keys: Sequence[str]) -> None:
        """Forget the state of these storage keys.

        Args:
            keys: The storage keys to forget.
        """

    async def clear(self) -> None:
        """Forget every key this store holds for ratewarden."""
        raise NotImplementedError(f"{type(self).__name__} cannot clear")

    async def close(self) -> None:
        """Release connections; the default has nothing to release."""

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Synchronous ``hit`` for local stores.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous hit")

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        """``hit_now`` of one key: the check of a rule with one limit (``enforcement.check.check``
        calls it on every local store). The default calls ``hit_now``; so does a subclass's that overrides
        ``hit_now`` alone (``__init_subclass__``).

        Args:
            key: The storage key.
            limit: The limit checked on it.
            cost: What the request costs.
        """
        return self.hit_now((key,), (limit,), (cost,))

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit`` for synchronous code (WSGI apps, threads): blocks the calling thread on the
        store's own synchronous client, never on an event loop, and is safe from many threads at
        once. A local store answers with ``hit_now``; a remote store overrides it.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        if self.local:
            return self.hit_now(keys, limits, costs)
        raise NotImplementedError(f"{type(self).__name__} has no synchronous client")

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` for synchronous code (WSGI apps, threads), as ``hit_blocking`` checks: a local
        store answers with ``peek_now``; a remote store overrides it with its synchronous client.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """
        if self.local:
            return self.peek_now(keys, limits)
        raise NotImplementedError(f"{type(self).__name__} has no synchronous peek")

    def reset_blocking(self, keys: Sequence[str]) -> None:
        """``reset`` for synchronous code (WSGI apps, threads), as ``hit_blocking`` checks: a local
        store answers with ``reset_now``; a remote store overrides it with its synchronous client.

        Args:
            keys: The storage keys to forget.
        """
        if not self.local:
            raise NotImplementedError(f"{type(self).__name__} has no synchronous reset")
        self.reset_now(keys)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` for synchronous code (WSGI apps, threads), as ``hit_blocking`` checks: a local
        store answers with ``adjust_now``; a remote store that can adjust overrides it.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units to charge to each key; negative gives them back (a refund).
        """
        if self.local:
            return self.adjust_now(keys, limits, amounts)
        raise NotImplementedError(f"{type(self).__name__} has no synchronous adjust")

    def can_block(self, *operations: BlockingOperation) -> bool:
        """Whether each of ``operations`` works without an event loop (``<operation>_blocking``):
        a local store's own ``*_now`` method answers it, or the store overrides the ``*_blocking``
        method with a synchronous client of its own; ``"adjust"`` also needs ``supports("adjust")``.
        A wrapper answers for what it wraps (``Breaker``: its store and its fallback). Options that
        need it refuse a store that cannot at start-up.

        Args:
            operations: ``"hit"``, ``"peek"``, ``"reset"``, ``"adjust"``.
        """
        for operation in operations:
            if operation == "adjust" and not self.supports("adjust"):
                return False
            if not _overrides(self, f"{operation}_blocking") and not (self.local and _overrides(self, _NOW[operation])):
                return False
        return True

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Synchronous ``peek`` for local stores.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous peek")

    def reset_now(self, keys: Sequence[str]) -> None:
        """Synchronous ``reset`` for local stores.

        Args:
            keys: The storage keys to forget.
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous reset")

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Synchronous ``adjust`` for local stores that can adjust.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units to charge to each key; negative gives them back (a refund).
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous adjust")

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Apply ``amounts[i]`` to ``keys[i]`` without a limit check; stores with ``can_adjust``.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units to charge to each key; negative gives them back (a refund).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot refund or penalise (no adjust())")

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """A rejection this process already knows to hold, answered without I/O (or ``None``).

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        return None


def _overrides(store: Store, method: str) -> bool:
    """Whether ``store``'s class implements ``method`` itself (not ``Store``'s refusing default)."""
    found = getattr(type(store), method, None)
    return callable(found) and found is not getattr(Store, method, None)


def client_error(store: str, operation: str, exc: BaseException) -> StoreError:
    """``exc``, a store client's failure, as a ``StoreError``: ``<store>: <operation>: <type>: <text>``,
    plus the root cause when the client left it out of its message (older redis-py omits e.g. the SSL
    verification error). ``exc`` is the ``__cause__`` (set here too: some errors reach their callers
    through a future, not a ``raise ... from``). A ``StoreError`` is returned as is.

    Args:
        store: The store, as its ``repr`` shows it (password hidden).
        operation: What failed (``"hit"``, ``"peek"``, ...).
        exc: The client's exception.
    """
    if isinstance(exc, StoreError):
        return exc
    message = f"{type(exc).__name__}: {exc}"
    root: BaseException = exc
    seen = {id(exc)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        root = inner
    if root is not exc and str(root) not in message:
        message += f" ({type(root).__name__}: {root})"
    reason = failure_reason(exc)
    if reason == "error" and root is not exc:
        reason = failure_reason(root)
    error = StoreError(f"{store}: {operation}: {message}", reason=reason)
    error.__cause__ = exc
    return error


def no_reply(store: str, operation: str, timeout: float) -> StoreError:
    """The ``StoreError`` for a store that did not answer within ``timeout`` seconds.

    Args:
        store: The store, as its ``repr`` shows it.
        operation: What timed out.
        timeout: The time allowed, in seconds.
    """
    return StoreError(f"{store}: {operation}: no reply within {timeout * 1000:g} ms", reason="timeout")


def failure_reason(exc: BaseException) -> str:
    """``StoreError.reason`` for a store client's exception: ``"timeout"`` for a timeout (the
    builtin, asyncio's or a client's own ``TimeoutError``), ``"unreachable"`` for a connection
    that could not be made or was lost (``OSError``, a client's ``ConnectionError``), ``"error"``
    for anything else (an error reply, a broken reply). A ``StoreError`` keeps its own.

    Args:
        exc: The client's exception.
    """
    if isinstance(exc, StoreError):
        return exc.reason
    names = {kind.__name__ for kind in type(exc).__mro__}
    if "TimeoutError" in names or "timeout" in names:
        return "timeout"
    if isinstance(exc, OSError) or "ConnectionError" in names:
        return "unreachable"
    return "error"


def combine(decisions: Sequence[Decision]) -> Decision:
    """The decision to report for several limits: the longest wait among denials, else the
    allowance with the fewest remaining.

    Args:
        decisions: One per limit, in any order.
    """
    chosen = decisions[0]
    if len(decisions) == 1:
        return chosen
    denied = [d for d in decisions if not d.allowed]
    if denied:
        return max(denied, key=lambda d: d.retry_after)
    return min(decisions, key=lambda d: (d.remaining, -d.reset_after))
