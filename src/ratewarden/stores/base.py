"""The base class of ratewarden's own stores (the contract they fulfil is ``stores.protocols``),
and the one place a store's client failures become ``StoreError`` (``client_error``, ``no_reply``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

from .._mypyc import mypyc_attr
from ..decision import Decision
from ..errors import ConfigurationError, StoreError
from ..limits import Limit
from .protocols import BlockingOperation

__all__ = [
    "BlockingOperation", "Capability", "LocalStoreBase", "Store", "StoreError", "client_error", "combine",
    "failure_reason", "no_reply",
]

#: What ``Store.supports`` and ``Store.require`` are asked about: ``LocalStore``, ``Adjusting``.
Capability = Literal["local", "adjust"]
_ABILITIES = {"local": "answer without I/O (LocalStore)", "adjust": "refund and penalise (Adjusting: adjust)"}
_WHO_CAN = {
    "local": "MemoryStore, SharedMemoryStore",
    "adjust": "MemoryStore, SharedMemoryStore, RedisStore, MemcachedStore, Breaker over one of them",
}


@mypyc_attr(allow_interpreted_subclasses=True)
class Store(ABC):
    """The base of ratewarden's own stores, and what the doors call (``Limiter.store``).

    The contract is ``stores.protocols``: a store of your own implements those protocols and needs
    no base class (``Limiter`` adapts it: ``stores.adapted.as_store``). A ``Store`` subclass
    implements ``AsyncStore``, ``Adjusting`` and ``BlockingStore`` whole (abstract here), so it has
    every capability but ``LocalStore``, which ``LocalStoreBase`` adds. Wrappers (``Breaker``, the
    adapter, ``Metrics.instrument``) answer ``supports`` and ``can_block`` for what they wrap.
    """

    #: The store implements ``LocalStore`` (its ``*_now`` methods do no I/O): read on every request
    #: by the async doors, so a plain attribute, set by the class (``LocalStoreBase``) or the adapter.
    local: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A subclass overriding ``hit_now`` but not ``hit_one`` gets the default ``hit_one``, so its
        ``hit_now`` answers every check (a ``MemoryStore`` subclass would otherwise keep the parent's)."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "hit_now" in own and "hit_one" not in own:
            setattr(cls, "hit_one", Store.hit_one)  # noqa: B010 - a method, not an attribute mypy checks

    def store_error(self, operation: str, exc: BaseException) -> StoreError:
        """``exc``, what the store's client raised, as a ``StoreError`` naming this store and
        ``operation``, with ``exc`` as its ``__cause__`` (``client_error``).

        Args:
            operation: What failed (``"hit"``, ``"peek"``, ``"adjust"``, ``"reset"``, ``"clear"``).
            exc: The client's exception.
        """
        return client_error(repr(self), operation, exc)

    # -- capabilities, checked when an option that needs one is configured ----------------------

    def supports(self, capability: Capability) -> bool:
        """Whether this store implements ``LocalStore`` (``"local"``) or ``Adjusting`` (``"adjust"``).

        Args:
            capability: ``"local"`` or ``"adjust"``.
        """
        return self.local if capability == "local" else True

    def can_block(self, *operations: BlockingOperation) -> bool:
        """Whether each of ``operations`` (``"hit"``, ``"peek"``, ``"reset"``, ``"adjust"``) works
        without an event loop (``BlockingStore``, operation by operation): always, for a ``Store``.

        Args:
            operations: ``"hit"``, ``"peek"``, ``"reset"``, ``"adjust"``.
        """
        return True

    def require(self, capability: Capability, needed_by: str) -> None:
        """Raise ``ConfigurationError`` at start-up when ``needed_by`` needs a missing capability.

        Args:
            capability: What is needed: ``"local"`` or ``"adjust"``.
            needed_by: The option needing it, named in the error (e.g. ``"charge="``).
        """
        if not self.supports(capability):
            raise ConfigurationError(
                f"{needed_by} needs a store that can {_ABILITIES[capability]}; "
                f"{type(self).__name__} cannot (stores that can: {_WHO_CAN[capability]})"
            )

    def require_blocking(self, needed_by: str, *operations: BlockingOperation) -> None:
        """Raise ``ConfigurationError`` at start-up unless ``can_block(*operations)``.

        Args:
            needed_by: Who asks, named in the error (e.g. ``"WSGI RateLimitMiddleware"``).
            operations: ``"hit"``, ``"peek"``, ``"reset"``, ``"adjust"``.
        """
        missing = [f"{op}_blocking" for op in operations if not self.can_block(op)]
        if missing:
            raise ConfigurationError(
                f"{needed_by} calls the store synchronously ({', '.join(missing)}); {type(self).__name__} has no "
                "synchronous client (stores.protocols.BlockingStore). Use a local store (MemoryStore, "
                "SharedMemoryStore), RedisStore or MemcachedStore, or serve the app over ASGI."
            )

    # -- AsyncStore, Adjusting ------------------------------------------------------------------

    @abstractmethod
    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """Charge all or nothing; return the deciding decision.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        raise _incomplete(self, "hit")

    @abstractmethod
    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """Each limit's current decision for a zero-cost request, charging nothing.

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """
        raise _incomplete(self, "peek")

    @abstractmethod
    async def reset(self, keys: Sequence[str]) -> None:
        """Forget the state of these storage keys.

        Args:
            keys: The storage keys to forget.
        """
        raise _incomplete(self, "reset")

    @abstractmethod
    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Apply ``amounts[i]`` to ``keys[i]`` without a limit check.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units to charge to each key; negative gives them back (a refund).
        """
        raise _incomplete(self, "adjust")

    # -- BlockingStore ----------------------------------------------------------------------------

    @abstractmethod
    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit`` for synchronous code (WSGI apps, threads): the store's own synchronous client,
        never an event loop, safe from many threads at once.

        Args:
            keys: As for ``hit``.
            limits: As for ``hit``.
            costs: As for ``hit``.
        """
        raise _incomplete(self, "hit_blocking")

    @abstractmethod
    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` for synchronous code.

        Args:
            keys: As for ``peek``.
            limits: As for ``peek``.
        """
        raise _incomplete(self, "peek_blocking")

    @abstractmethod
    def reset_blocking(self, keys: Sequence[str]) -> None:
        """``reset`` for synchronous code.

        Args:
            keys: As for ``reset``.
        """
        raise _incomplete(self, "reset_blocking")

    @abstractmethod
    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` for synchronous code.

        Args:
            keys: As for ``adjust``.
            limits: As for ``adjust``.
            amounts: As for ``adjust``.
        """
        raise _incomplete(self, "adjust_blocking")

    # -- synchronous answers: without I/O exactly when ``local`` (``LocalStoreBase``) --------------

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit``, answered synchronously: ``hit_blocking`` here; a ``LocalStore`` answers without I/O.

        Args:
            keys: As for ``hit``.
            limits: As for ``hit``.
            costs: As for ``hit``.
        """
        return self.hit_blocking(keys, limits, costs)

    def hit_one(self, key: str, limit: Limit, cost: float) -> Decision:
        """``hit_now`` of one key: the check of a rule with one limit (``enforcement.check.check``
        calls it on every local store). It calls ``hit_now``; so does a subclass's that overrides
        ``hit_now`` alone (``__init_subclass__``).

        Args:
            key: The storage key.
            limit: The limit checked on it.
            cost: What the request costs.
        """
        return self.hit_now((key,), (limit,), (cost,))

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek``, answered synchronously (``peek_blocking`` here).

        Args:
            keys: As for ``peek``.
            limits: As for ``peek``.
        """
        return self.peek_blocking(keys, limits)

    def reset_now(self, keys: Sequence[str]) -> None:
        """``reset``, answered synchronously (``reset_blocking`` here).

        Args:
            keys: As for ``reset``.
        """
        self.reset_blocking(keys)

    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust``, answered synchronously (``adjust_blocking`` here).

        Args:
            keys: As for ``adjust``.
            limits: As for ``adjust``.
            amounts: As for ``adjust``.
        """
        return self.adjust_blocking(keys, limits, amounts)

    # -- RejectionCache, Clearable, Closable --------------------------------------------------------

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        """A rejection this process already knows to hold, answered without I/O (or ``None``: a
        store without a cache of rejections).

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        return None

    @abstractmethod
    async def clear(self) -> None:
        """Forget every key this store holds for ratewarden."""
        raise _incomplete(self, "clear")

    async def close(self) -> None:
        """Release connections; here there is nothing to release."""


@mypyc_attr(allow_interpreted_subclasses=True)
class LocalStoreBase(Store):
    """A store in this process (``LocalStore``): it writes the ``*_now`` methods, which do no I/O;
    the blocking ones are them, and the async doors call them without a coroutine."""

    local = True

    @abstractmethod
    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """``hit`` without I/O."""
        raise _incomplete(self, "hit_now")

    @abstractmethod
    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """``peek`` without I/O."""
        raise _incomplete(self, "peek_now")

    @abstractmethod
    def reset_now(self, keys: Sequence[str]) -> None:
        """``reset`` without I/O."""
        raise _incomplete(self, "reset_now")

    @abstractmethod
    def adjust_now(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """``adjust`` without I/O."""
        raise _incomplete(self, "adjust_now")

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.hit_now(keys, limits, costs)

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.peek_now(keys, limits)

    def reset_blocking(self, keys: Sequence[str]) -> None:
        self.reset_now(keys)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.adjust_now(keys, limits, amounts)


def _incomplete(store: Store, method: str) -> ConfigurationError:
    """What an abstract method raises when reached: only the compiled build lets a ``Store`` subclass
    that lacks it be made (mypyc does not enforce ``abstractmethod``)."""
    return ConfigurationError(
        f"{type(store).__name__} subclasses Store without {method}: a Store subclass implements every abstract "
        "method; a store with fewer implements stores.protocols.AsyncStore without subclassing Store"
    )


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
