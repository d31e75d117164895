"""What the compiled front door's three adapters share (``serve.front`` for gRPC, ``serve.front_http``,
``serve.front_spoe``): ``BatchAdapter`` takes the waiting requests of one protocol in one crossing
when Rust wakes the event loop, runs each decision inline and gives a Task only to one that suspends
(``Resume``), and hands the answers back in one crossing (those of suspended decisions together
once per loop pass: ``LateAnswers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["BatchAdapter", "LateAnswers", "Resume", "Watched", "stall_problem"]

_T = TypeVar("_T")
_R = TypeVar("_R")  # one request taken from the front door
_I = TypeVar("_I")  # one answer handed back to it


def stall_problem(door: str, waited: float, deadline: float) -> str | None:
    """Why ``/healthz`` fails for a front door whose queue has waited ``waited`` seconds for Python to
    take it (``Front.stalled``), or ``None`` while that is within the requests' ``deadline``: past it,
    every request queued there is answered as timed out, which a gateway failing open reads as no limit."""
    if waited <= deadline:
        return None
    return f"the {door} front door's queue has waited {waited:.1f} s for a decision, past its {deadline:g} s deadline"


class Resume(Generic[_T]):
    """The rest of a coroutine that suspended on ``first``, for a Task: the Task waits on ``first``,
    then the coroutine goes on where it stopped (an adapter first runs each decision inline, and only
    one that suspends needs a Task)."""

    def __init__(self, coro: Coroutine[Any, Any, _T], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, _T]:
        coro, pending = self.coro, self.first
        while True:  # what ``yield from`` does, from a coroutine already started
            try:
                sent = yield pending
            except BaseException as exc:
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    thrown: _T = stop.value
                    return thrown
                continue
            try:
                pending = coro.send(sent)
            except StopIteration as stop:
                done: _T = stop.value
                return done


class LateAnswers(Generic[_T]):
    """The answers of decisions that suspended (each finished in a Task), handed to the front door
    together once per loop pass rather than one crossing each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answer: Callable[[list[_T]], None]) -> None:
        self.loop = loop
        self.answer = answer
        self._items: list[_T] = []
        self._scheduled = False

    def add(self, item: _T) -> None:
        """Queue ``item``; the queue goes to the front door at the end of this loop pass."""
        self._items.append(item)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        items, self._items = self._items, []
        self.answer(items)


class Watched(Protocol):
    """What ``BatchAdapter`` uses of a started ``ratewarden._front.Front``, whichever protocol it serves."""

    def fileno(self) -> int: ...
    def drain(self) -> None: ...


class BatchAdapter(Generic[_R, _I]):
    """Feeds a started front door's waiting requests to Python in batches, on the running event loop:
    Rust wakes the loop through ``front``'s socket pair, ``take`` hands over every waiting request in
    one call, and ``answer`` takes a batch's answers back in one call. Each protocol's adapter says
    how a batch is decided (``_begin``); most start each request with ``_start``.

    Args:
        front: The started front door.
        take: Up to ``max_batch`` waiting requests of this adapter's protocol.
        answer: Hands answers back to Rust.
        max_batch: The most requests taken in one crossing.
    """

    #: Start every decision in a Task of its own instead of running it inline first (``front_http``).
    in_task = False

    def __init__(
        self, front: Watched, take: Callable[[int], list[_R]], answer: Callable[[list[_I]], None], max_batch: int,
    ) -> None:
        self.front = front
        self.take = take
        self.answer = answer
        self.max_batch = max_batch
        self.loop = asyncio.get_running_loop()
        self._late: LateAnswers[_I] = LateAnswers(self.loop, answer)
        self._tasks: set[asyncio.Task[None]] = set()
        #: The Task of each request whose decision suspended (``_start``), by request id.
        self._running: dict[int, asyncio.Task[None]] = {}
        self.batches = 0
        self.requests = 0
        self.taken_at = 0.0  # the loop's time just before the batch being begun was taken
        self.tasks = 0  # Tasks started for decisions that suspended
        self.loop.add_reader(front.fileno(), self._on_wake)

    def close(self) -> None:
        """Stop watching the front door; decisions still running are cancelled."""
        self.loop.remove_reader(self.front.fileno())
        for task in self._tasks:
            task.cancel()

    def _on_wake(self) -> None:
        self.front.drain()
        while True:
            self.taken_at = self.loop.time()
            batch = self.take(self.max_batch)
            if not batch:
                return
            self.batches += 1
            self.requests += len(batch)
            done: list[_I] = []
            self._begin(batch, done)
            if done:
                self.answer(done)

    def _begin(self, batch: list[_R], done: list[_I]) -> None:
        """Decide ``batch``: answers ready now go to ``done``, the rest are answered later."""
        raise NotImplementedError

    def _item(self, rid: int, value: Any) -> _I:
        """The answer handed back for request ``rid`` decided as ``value``."""
        raise NotImplementedError

    def _failed(self, exc: BaseException) -> Any:
        """The decided value of a request whose decision raised ``exc``."""
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        self.tasks += 1
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel(self, rids: list[int]) -> None:
        """Cancel the decisions of requests ``rids`` (nothing will take their answers): a store call
        not sent yet is then never sent, so nothing is charged for it."""
        for rid in rids:
            task = self._running.pop(rid, None)
            if task is not None:
                task.cancel()

    def _start(self, rid: int, coro: Coroutine[Any, Any, Any], done: list[_I]) -> None:
        """Run request ``rid``'s decision inline: its answer goes to ``done`` when it finishes without
        suspending; else it goes on in a Task from where it stopped, and is answered with the late ones."""
        if self.in_task:
            self._running[rid] = self._spawn(self._finish(rid, coro))
            return
        try:
            first = coro.send(None)
        except StopIteration as stop:
            done.append(self._item(rid, stop.value))
            return
        except Exception as exc:
            done.append(self._item(rid, self._failed(exc)))
            return
        self._running[rid] = self._spawn(self._finish(rid, Resume(coro, first)))

    async def _finish(self, rid: int, rest: Awaitable[Any]) -> None:
        try:
            value = await rest
        except Exception as exc:
            value = self._failed(exc)
        finally:
            self._running.pop(rid, None)
        self._late.add(self._item(rid, value))
