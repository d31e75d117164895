"""HAProxy's SPOE agent through the compiled front door (``--spoe-front compiled``): ``ratewarden._front``
holds the SPOP connections (the HELLO and DISCONNECT exchanges, frames, varints, typed data and the
agent's bounds, as ``serve.spop`` and ``serve.spoe`` read them) and queues each NOTIFY's message;
this module answers every waiting message in one batch with the Python agent's own translation
(``SpoeAgent.actions``: ``ServeApp.decide_steps``'s decision as SET-VAR actions), and Rust frames the ACK
(docs/serve.md#the-compiled-front-door).

A message decided without suspending (the memory store) is answered in the same batch, with no Task;
one that suspends (Redis) goes on in a Task from where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol

from . import bounds, spoe
from .front import open_front
from .front_batch import BatchAdapter, stall_problem
from .http import ServeApp
from .spop import Message, Value, set_var

__all__ = ["SPOE_FRONTS", "CompiledSpoe", "SpoeAdapter", "start_spoe_front"]

log = logging.getLogger("ratewarden.serve")

#: The SPOE agents a worker can run (``--spoe-front``, whose ``auto`` is ``compiled`` where it imports).
SPOE_FRONTS = ("python", "compiled")

#: One message taken: its id, arguments (``None``: the frame has no message of the agent's name), peer.
SpoeMessage = tuple[int, "dict[str, Value] | None", str, int]
#: One answer handed back: the message's id and its encoded SET-VAR actions.
SpoeItem = tuple[int, list[bytes]]


class SpoeFront(Protocol):
    """What this module uses of ``ratewarden._front.Front`` started with ``spoe`` settings."""

    def fileno(self) -> int: ...
    def drain(self) -> None: ...
    def take_spoe(self, limit: int) -> list[SpoeMessage]: ...
    def answer_spoe(self, items: list[SpoeItem]) -> None: ...
    def take_spoe_ended(self) -> tuple[list[int], list[tuple[str, str]]]: ...
    def stalled(self) -> tuple[float, float, float]: ...
    def close(self) -> None: ...
    def stop(self, grace: float) -> None: ...


def _failed(exc: BaseException) -> list[bytes]:
    """The Python agent's answer to a check that raised."""
    log.error("spoe check failed: %s: %s", type(exc).__name__, exc, exc_info=exc, extra={"event": "check_failed"})
    return [set_var("status", 500)]


class SpoeAdapter(BatchAdapter[SpoeMessage, SpoeItem]):
    """Answers a started front door's SPOE messages with ``agent`` on the running event loop.

    Args:
        front: The started front door (with ``spoe`` settings).
        agent: The Python agent whose ``actions`` answer (its app, trusted proxies and message name).
        max_batch: The most messages taken in one crossing.
    """

    def __init__(self, front: SpoeFront, agent: spoe.SpoeAgent, max_batch: int = 1024) -> None:
        self.agent = agent
        self._ended = front.take_spoe_ended
        super().__init__(front, front.take_spoe, front.answer_spoe, max_batch)

    def _on_wake(self) -> None:
        super()._on_wake()
        dropped, notes = self._ended()
        if dropped:  # their connection ended: nothing takes their answers now
            self.cancel(dropped)
        for kind, why in notes:  # as the Python agent logs its connections' ends
            if kind == "timeout":
                log.debug("spoe: %s; closing the connection", why, extra={"event": "spoe_timeout"})
            else:
                log.warning("spoe: %s; closing the connection", why, extra={"event": "spoe_error"})

    def _begin(self, batch: list[SpoeMessage], done: list[SpoeItem]) -> None:
        agent = self.agent
        trusted: dict[str, bool] = {}
        for rid, args, host, port in batch:
            believed = trusted.get(host)
            if believed is None:
                believed = trusted[host] = agent.app.is_trusted(host)
            found = None if args is None else Message(agent.message, args)
            self._start(rid, agent.actions(found, believed, (host, port)), done)

    def _item(self, rid: int, value: list[bytes]) -> SpoeItem:
        return rid, value

    def _failed(self, exc: BaseException) -> list[bytes]:
        return _failed(exc)


class CompiledSpoe:
    """The worker's SPOE agent on the compiled front door: ``close()`` stops accepting connections and
    closes the listening socket, as ``asyncio.Server.close`` does (the open connections go on);
    ``await end()`` ends them and the front door's threads."""

    def __init__(self, front: SpoeFront, adapter: SpoeAdapter, sock: socket.socket) -> None:
        self.front = front
        self.adapter = adapter
        self.sock = sock

    def stalled(self) -> str | None:
        """Why ``/healthz`` fails for this door (its queue waits past the processing timeout), or ``None``."""
        return stall_problem("SPOE", self.front.stalled()[2], bounds.SPOE_TIMEOUT_PROCESSING)

    def close(self) -> None:
        """No new connection; the open ones are served until ``end``."""
        self.front.close()
        self.sock.close()

    async def wait_closed(self) -> None:
        """Return at once (``asyncio.Server``'s counterpart: the open connections end in ``end``)."""

    async def end(self) -> None:
        """End the open connections (HAProxy reconnects, to another worker if there is one); checks
        still in flight are dropped, and HAProxy answers them as unanswered."""
        self.close()
        self.adapter.close()
        await asyncio.to_thread(self.front.stop, 0.5)


def start_spoe_front(app: ServeApp, sock: socket.socket, agent: spoe.SpoeAgent | None = None) -> CompiledSpoe:
    """Serve HAProxy's SPOE connections on the listening ``sock`` through the compiled front door, with
    ``agent``'s bounds and answers (``SpoeAgent(app)`` when not given); ``ImportError`` without
    ``ratewarden._front``.

    Args:
        app: The service's app.
        sock: The listening socket (closed by ``CompiledSpoe.close``, as ``asyncio.start_server`` does).
        agent: The Python agent whose bounds apply and whose ``actions`` answer.
    """
    agent = agent or spoe.SpoeAgent(app)
    front: SpoeFront = open_front(None, {"spoe": {
        "fd": sock.fileno(), "max_connections": agent.max_connections, "max_frame_size": agent.max_frame_size,
        "timeout_hello": agent.timeout_hello, "timeout_idle": agent.timeout_idle,
        "timeout_frame": agent.timeout_frame, "message": agent.message,
        "max_in_flight": spoe.MAX_IN_FLIGHT, "max_buffered": spoe.MAX_BUFFERED,
        "max_bytes_in_flight": bounds.SPOE_MAX_BYTES_IN_FLIGHT, "max_bytes": bounds.SPOE_MAX_BYTES,
        "timeout_processing": bounds.SPOE_TIMEOUT_PROCESSING,
    }})
    compiled = CompiledSpoe(front, SpoeAdapter(front, agent), sock)
    app.doors.append(compiled.stalled)
    return compiled
