"""The step machine's two sides: what the decision core asks for (a ``Step``), and the two drivers
that answer it, as h11 is for HTTP/1.1.

The core is written once as a generator (``enforcement.core.check_steps``, ``Decider.decide_steps``,
``Bans.strike_steps``, ``Delay.steps``...): it never awaits and never blocks, it yields a ``Step`` whenever it needs the
outside world (a store call, an awaitable key, a ban read, a pause) and takes the answer back, or
the exception the step raised, thrown in at the same place. ``drive`` runs it for async code,
answering at once the steps that need no wait (a local store, a cached rejection) so that an
in-process check allocates no coroutine; ``drive_blocking`` runs it for synchronous code. Neither
knows what a check is.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Generator, Sequence
from typing import Any, TypeVar

from .charges import adjust
from .limits import Limit

Store = Any
"""A store of ``ratewarden.stores`` (this module sits below them and imports none of them)."""

__all__ = ["WAIT", "Adjust", "Await", "Hit", "Machine", "Pause", "Peek", "Reset", "Step", "drive", "drive_blocking", "driven"]

T = TypeVar("T")

WAIT: Any = object()
"""What ``Step.at_once`` answers when the step cannot be answered without waiting."""


class Step(ABC):
    """One thing the core needs from outside it: ``run`` answers it awaiting, ``run_blocking``
    blocking, ``at_once`` without either when it can (else ``WAIT``)."""

    __slots__ = ()

    def at_once(self) -> Any:
        return WAIT

    @abstractmethod
    async def run(self) -> Any: ...

    @abstractmethod
    def run_blocking(self) -> Any: ...


Machine = Generator[Step, Any, T]
"""A decision written as steps: it yields each ``Step`` and returns its result."""


class Hit(Step):
    """Charge ``keys`` all or nothing (``Store.hit``): answers the ``Decision``, or raises what the
    store raised (the core applies the failure policy).

    Args:
        store: The store to charge.
        keys: The storage keys.
        limits: The limit on each key.
        costs: What the request costs under each limit.
    """

    __slots__ = ("costs", "keys", "limits", "store")

    def __init__(self, store: Store, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> None:
        self.store = store
        self.keys = keys
        self.limits = limits
        self.costs = costs

    def at_once(self) -> Any:
        store = self.store
        if store.local:
            return store.hit_now(self.keys, self.limits, self.costs)
        cached = store.cached_rejection(self.keys, self.costs)
        return WAIT if cached is None else cached

    async def run(self) -> Any:
        return await self.store.hit(self.keys, self.limits, self.costs)

    def run_blocking(self) -> Any:
        return self.store.hit_blocking(self.keys, self.limits, self.costs)


class Peek(Step):
    """Read ``keys`` without charging them (``Store.peek``): answers a ``Decision`` a key.

    Args:
        store: The store to read.
        keys: The storage keys.
        limits: The limit on each key.
    """

    __slots__ = ("keys", "limits", "store")

    def __init__(self, store: Store, keys: Sequence[str], limits: Sequence[Limit]) -> None:
        self.store = store
        self.keys = keys
        self.limits = limits

    def at_once(self) -> Any:
        store = self.store
        return store.peek_now(self.keys, self.limits) if store.local else WAIT

    async def run(self) -> Any:
        return await self.store.peek(self.keys, self.limits)

    def run_blocking(self) -> Any:
        return self.store.peek_blocking(self.keys, self.limits)


class Reset(Step):
    """Forget ``keys`` on ``store`` (``Store.reset``).

    Args:
        store: The store to reset them on.
        keys: The storage keys.
    """

    __slots__ = ("keys", "store")

    def __init__(self, store: Store, keys: Sequence[str]) -> None:
        self.store = store
        self.keys = keys

    def at_once(self) -> Any:
        store = self.store
        return store.reset_now(self.keys) if store.local else WAIT

    async def run(self) -> Any:
        await self.store.reset(self.keys)

    def run_blocking(self) -> Any:
        self.store.reset_blocking(self.keys)


class Adjust(Step):
    """Apply ``amounts`` to ``keys`` without a limit check (a refund, a penalty: ``charges.adjust``).

    Args:
        store: The store to adjust.
        keys: The storage keys.
        limits: The limit on each key.
        amounts: What to add to each (negative: a refund).
    """

    __slots__ = ("amounts", "keys", "limits", "store")

    def __init__(self, store: Store, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> None:
        self.store = store
        self.keys = keys
        self.limits = limits
        self.amounts = amounts

    async def run(self) -> Any:
        return await adjust(self.store, self.keys, self.limits, self.amounts)

    def run_blocking(self) -> Any:
        return self.store.adjust_blocking(self.keys, self.limits, self.amounts)


class Await(Step):
    """Finish an awaitable: a key function's answer, mostly. Synchronous code cannot:
    ``run_blocking`` closes it and raises ``TypeError`` naming what returned it (``whose``, e.g.
    ``"rule 'api': the key function"``); the core's key fallback applies.

    Args:
        pending: The awaitable.
        whose: What returned it, for the error of synchronous code.
    """

    __slots__ = ("pending", "whose")

    def __init__(self, pending: Awaitable[object], whose: str) -> None:
        self.pending = pending
        self.whose = whose

    async def run(self) -> Any:
        return await self.pending

    def run_blocking(self) -> Any:
        close = getattr(self.pending, "close", None)
        if close is not None:
            close()  # a coroutine never awaited: closed, so Python does not warn about it
        raise TypeError(f"{self.whose} returned an awaitable; synchronous code cannot await it")


class Pause(Step):
    """Wait ``seconds`` (a delayed request's turn): the task sleeps, or the thread does.

    Args:
        seconds: How long.
    """

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def run(self) -> Any:
        await asyncio.sleep(self.seconds)

    def run_blocking(self) -> Any:
        time.sleep(self.seconds)


def drive(machine: Machine[T]) -> T | Awaitable[T]:
    """Run ``machine`` for async code: its result at once while every step answers ``at_once``,
    else an awaitable that awaits the rest. ``isinstance(result, Awaitable)`` tells them apart
    for results that are never awaitable themselves (decisions, outcomes).

    Args:
        machine: The step machine, not started.
    """
    try:
        step = next(machine)
        while True:
            try:
                answer = step.at_once()
            except Exception as exc:
                step = machine.throw(exc)
                continue
            if answer is WAIT:
                return _finish(machine, step)
            step = machine.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result


async def driven(machine: Machine[T]) -> T:
    """``drive``'s result, awaited when it had to wait (for results that are never awaitable).

    Args:
        machine: The step machine, not started.
    """
    result = drive(machine)
    if isinstance(result, Awaitable):
        awaited: T = await result
        return awaited
    return result


async def _finish(machine: Machine[T], step: Step) -> T:
    """``drive`` from ``step`` on, awaiting each step."""
    try:
        while True:
            try:
                answer = await step.run()
            except Exception as exc:
                step = machine.throw(exc)
            else:
                step = machine.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        machine.close()  # cancelled mid-step: the machine's own cleanup (a waiting place) runs now


def drive_blocking(machine: Machine[T]) -> T:
    """Run ``machine`` for synchronous code, blocking on each step.

    Args:
        machine: The step machine, not started.
    """
    try:
        step = next(machine)
        while True:
            step = _answered(machine, step)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        machine.close()


def _answered(machine: Machine[Any], step: Step) -> Step:
    """The machine's next step once ``step`` is answered blocking: its answer sent in, or what it
    raised thrown in."""
    try:
        answer = step.run_blocking()
    except Exception as exc:
        return machine.throw(exc)
    return machine.send(answer)
