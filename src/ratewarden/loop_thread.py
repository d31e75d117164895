"""A private event loop in a background thread: where the sync facade (``Limiter.hit_sync``...)
runs coroutines.

Remote stores keep connections bound to the loop that opened them, so sync calls must not each
run on a fresh loop (``asyncio.run``): they all run on this one long-lived loop, whatever thread
calls them, and whether or not that thread is itself running a loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .errors import UsageError

__all__ = ["LoopThread"]

_T = TypeVar("_T")


class LoopThread:
    """Runs coroutines on one event loop in a daemon thread, started on first use and stopped
    by ``stop`` (or when this object is garbage-collected).

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str = "ratewarden-sync") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the private loop and block until it is done (its exception is raised here).

        Args:
            coro: The coroutine to run.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError("a sync ratewarden call cannot be made on its own loop thread: await the async one")
        return asyncio.run_coroutine_threadsafe(coro, self.start()).result()

    def start(self) -> asyncio.AbstractEventLoop:
        """The running private loop (started now if need be)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def stop(self) -> None:
        """Stop the loop and wait for its thread (a later ``run`` starts a new one)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join()

    def __del__(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()
