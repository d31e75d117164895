"""Circuit breaker around any remote store: bounded waits, no waits at all while it is down.

``Breaker(RedisStore(url), fallback=MemoryStore())`` behaves like the wrapped store until
``failures`` checks in a row fail (``StoreError``: unreachable, timed out, broken reply). Then it
opens for ``cooldown`` seconds: checks do not touch the store at all, so a dead store costs no
timeout per request; they are answered by ``fallback`` (a local limiter, per process) when one is
given, else raise ``StoreError`` at once (the ``Limiter``'s ``on_error`` then fails open or closed).
After the cooldown one check probes the store; if it succeeds the breaker closes by itself,
otherwise it stays open for another cooldown.

``timeout`` bounds each call with ``asyncio.wait_for``; leave it ``None`` for stores that bound
their own calls (``RedisStore`` and ``MemcachedStore`` do, more cheaply, per pipeline).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..charges import adjust
from ..decision import Decision
from ..errors import ConfigurationError
from ..limits import Limit
from ..steps import Machine, Reset, drive_blocking, driven
from .adapted import as_store
from .base import BlockingOperation, Capability, Store, StoreError
from .deadline import wait_for_store
from .protocols import AsyncStore

__all__ = ["Breaker"]

log = logging.getLogger("ratewarden.stores.breaker")
_T = TypeVar("_T")


class Breaker(Store):
    """A ``Store`` that stops calling ``store`` while it keeps failing (see module docstring).

    A wrapper answers for what it wraps: it can do (``supports``, ``can_block``) what the store and
    its fallback both can, and it is never a local store itself.

    Args:
        store: The store to protect (a ``Store``, or a store of your own: ``protocols.AsyncStore``).
        failures: Failed checks in a row that open the breaker.
        cooldown: Seconds it stays open before one check probes the store again.
        timeout: Seconds each call may take (``asyncio.wait_for``); the default ``None`` leaves that to
            stores that bound their own calls.
        fallback: Answers checks while the breaker is open (a store, usually local, per process); with the default
            ``None`` they raise ``StoreError`` at once.
        clock: Monotonic seconds; replace it to test with a fake clock.
    """

    def __init__(
        self,
        store: Store | AsyncStore,
        *,
        failures: int = 3,
        cooldown: float = 1.0,
        timeout: float | None = None,
        fallback: Store | AsyncStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ConfigurationError(f"failures must be at least 1, got {failures}")
        if not cooldown > 0:
            raise ConfigurationError(f"cooldown must be positive, got {cooldown!r}")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"timeout must be positive or None, got {timeout!r}")
        self.store = as_store(store)
        self.failures = failures
        self.cooldown = cooldown
        self.timeout = timeout
        self.fallback = None if fallback is None else as_store(fallback, "fallback")
        self.clock = clock
        self._failed = 0  # consecutive failures
        self._open_until = 0.0  # 0 = closed
        self._probing = False
        self.opened = 0  # times the breaker opened
        self.short_circuited = 0  # checks answered without touching the store
        self._reason = "unreachable"  # the last failure's StoreError.reason: a short circuit's
        self._lock = threading.Lock()  # state changes: hit_blocking calls it from many threads

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open`` (cooldown over, next check probes)."""
        if not self._open_until:
            return "closed"
        return "open" if self.clock() < self._open_until or self._probing else "half-open"

    def __repr__(self) -> str:
        return f"Breaker({self.store!r}, state={self.state})"

    async def _guard(self, call: Callable[[Store], Awaitable[_T]]) -> _T:
        probe = self._enter()
        if probe is None:
            return await self._short_circuit(call)
        try:
            awaitable = call(self.store)
            result = await (awaitable if self.timeout is None else wait_for_store(awaitable, self.timeout))
        except (StoreError, asyncio.TimeoutError) as exc:
            error = exc if isinstance(exc, StoreError) else StoreError(
                f"{self.store!r}: no reply within {self.timeout}s", reason="timeout"
            )
            self._failure(probe, error)
            if self.fallback is not None:
                return await call(self.fallback)
            if error is exc:
                raise
            raise error from None
        self._succeeded()
        return result

    def _guard_blocking(self, call: Callable[[Store], _T]) -> _T:
        """``_guard`` for synchronous calls (``hit_blocking``), from any thread: the same states.
        ``timeout`` does not apply: the store's synchronous client bounds its own calls."""
        probe = self._enter()
        if probe is None:
            self.short_circuited += 1
            if self.fallback is not None:
                return call(self.fallback)
            raise self._open_error()
        try:
            result = call(self.store)
        except StoreError as exc:
            self._failure(probe, exc)
            if self.fallback is not None:
                return call(self.fallback)
            raise
        except BaseException:
            if probe:  # not the store's failure (e.g. no synchronous client): the next call probes
                self._probing = False
            raise
        self._succeeded()
        return result

    def _enter(self) -> bool | None:
        """Whether a call goes to the store: ``None`` while the breaker is open (or another call
        probes), else whether this call is the probe after the cooldown."""
        if not self._open_until:
            return False
        with self._lock:
            if self._probing or self.clock() < self._open_until:
                return None
            self._probing = True
            return True

    def _succeeded(self) -> None:
        if self._open_until:
            with self._lock:
                was_open = bool(self._open_until)
                self._open_until = 0.0
                self._probing = False
            if was_open:
                log.warning("store %r is back: circuit closed", self.store)
        self._failed = 0

    def _failure(self, probe: bool, error: StoreError) -> None:
        with self._lock:
            self._reason = error.reason
            if probe:
                self._probing = False
                self._open_until = self.clock() + self.cooldown
                return
            self._failed += 1
            opens = self._failed >= self.failures and not self._open_until
            if opens:
                self._open_until = self.clock() + self.cooldown
                self.opened += 1
        if opens:
            log.warning(
                "store failing (%s): circuit open for %gs%s",
                error, self.cooldown, ", using the fallback store" if self.fallback is not None else "",
            )

    async def _short_circuit(self, call: Callable[[Store], Awaitable[_T]]) -> _T:
        self.short_circuited += 1
        if self.fallback is not None:
            return await call(self.fallback)
        raise self._open_error()

    def _open_error(self) -> StoreError:
        return StoreError(f"{self.store!r} is failing: circuit open, not calling it", reason=self._reason)

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return await self._guard(lambda s: s.hit(keys, limits, costs))

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        """The wrapped store's ``hit_blocking`` through the breaker (its fallback's while open)."""
        return self._guard_blocking(lambda s: s.hit_blocking(keys, limits, costs))

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        """The wrapped store's ``peek_blocking`` through the breaker (its fallback's while open).

        Args:
            keys: Storage keys, one per limit.
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
        """
        return self._guard_blocking(lambda s: s.peek_blocking(keys, limits))

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """The wrapped store's ``adjust_blocking`` through the breaker (its fallback's while open),
        as ``adjust`` goes through it.

        Args:
            keys: Storage keys, one per limit.
            limits: The limit on each key, ``limits[i]`` on ``keys[i]``.
            amounts: Units per key: positive charges, negative refunds.
        """
        return self._guard_blocking(lambda s: s.adjust_blocking(keys, limits, amounts))

    def reset_blocking(self, keys: Sequence[str]) -> None:
        """Forget ``keys`` on the fallback and on the wrapped store (``reset_blocking``), as ``reset``.

        Args:
            keys: The storage keys to forget.
        """
        drive_blocking(self._reset_steps(keys))

    def can_block(self, *operations: BlockingOperation) -> bool:
        """Whether the store and its fallback can both do ``operations`` without an event loop.

        Args:
            operations: ``"hit"``, ``"peek"``, ``"reset"``, ``"adjust"``.
        """
        return self.store.can_block(*operations) and (self.fallback is None or self.fallback.can_block(*operations))

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return await self._guard(lambda s: s.peek(keys, limits))

    def supports(self, capability: Capability) -> bool:
        """What the store and its fallback can both do (a breaker itself is never local).

        Args:
            capability: ``"local"`` or ``"adjust"``.
        """
        if capability == "local":
            return False
        return self.store.supports(capability) and (self.fallback is None or self.fallback.supports(capability))

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Refunds and penalties (``ratewarden.charges.adjust``) through the breaker, so they use
        the fallback while the store is failing."""

        return await self._guard(lambda s: adjust(s, keys, limits, amounts))

    async def reset(self, keys: Sequence[str]) -> None:
        await driven(self._reset_steps(keys))

    def _reset_steps(self, keys: Sequence[str]) -> Machine[None]:
        """Forget ``keys`` on the fallback, then on the wrapped store (``ratewarden.steps``)."""
        if self.fallback is not None:
            yield Reset(self.fallback, keys)
        yield Reset(self.store, keys)

    async def clear(self) -> None:
        if self.fallback is not None:
            await self.fallback.clear()
        await self.store.clear()

    async def close(self) -> None:
        await self.store.close()
        if self.fallback is not None:
            await self.fallback.close()
