"""gRPC through the compiled front door: ``ratewarden._front`` (built from rust/) owns the connections,
HTTP/2 and protobuf, and this module decides its requests in batches with the one decision core,
``RateLimitService.should_rate_limit`` (docs/serve.md#the-compiled-front-door).

Rust queues decoded requests and wakes this event loop through a socket pair; ``FrontAdapter`` takes
every waiting request in one call, decides each, and hands the answers back in one call. A decision
that finishes without suspending (the memory store) is answered in the same batch, with no Task; one
that suspends (Redis) goes on from where it stopped in one Task per batch, which wakes once when the
store's pipeline (the batch's decisions, coalesced) answers. Imports neither grpc nor protobuf.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
from collections.abc import Coroutine, Generator
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from ..errors import ConfigurationError, LimitUnavailable
from ..stores.caller_deadline import CALLER_DEADLINE
from . import bounds
from .front_batch import BatchAdapter, stall_problem
from .rls import RateLimitService, RequestDescriptor, RlsAnswer, RlsRequestError

__all__ = [
    "DOORS", "FRONTS", "CompiledFront", "FrontAdapter", "build_record", "choose_front", "compiled_module",
    "describe", "open_front", "queue_settings", "start_front",
]


log = logging.getLogger("ratewarden.serve")

#: ``--front``'s choices: ``auto`` is ``compiled`` when ``ratewarden._front`` imports, else ``python``.
FRONTS = ("auto", "compiled", "python")
#: The extension module of the compiled front door.
MODULE = "ratewarden._front"
#: Each front door by the option that picks it (``--front``, ``--http-front``, ``--spoe-front``): the
#: protocol, what serves it in Python, and the library in ``MODULE`` that serves it compiled.
DOORS = {
    "--front": ("gRPC", "grpc.aio", "tonic"),
    "--http-front": ("HTTP", "uvicorn", "hyper"),
    "--spoe-front": ("SPOE", "asyncio", "tokio"),
}

_INVALID_ARGUMENT, _INTERNAL, _UNAVAILABLE = 3, 13, 14
#: A suspended decision this close to its deadline when its batch's timer fires is expired then.
DUE_SLACK = 0.002
#: One answer handed back: the request's id and its ``RlsAnswer``, or a gRPC ``(code, message)``.
Item = tuple[int, "RlsAnswer | tuple[int, str]"]


class Front(Protocol):
    """What this module uses of ``ratewarden._front.Front``."""

    @property
    def port(self) -> int: ...
    def fileno(self) -> int: ...
    def drain(self) -> None: ...
    def take(self, limit: int) -> list[tuple[int, str, list[RequestDescriptor], int, float]]: ...
    def answer(self, items: list[Item]) -> None: ...
    def pending(self) -> int: ...
    def stalled(self) -> tuple[float, float, float]: ...
    def serving(self) -> bool: ...
    def close(self) -> None: ...
    def stop(self, grace: float) -> None: ...


#: What the build wrote beside the package about the front door: ``compiled``, or why not (setup.py).
BUILD_RECORD = Path(__file__).resolve().parent.parent / "_front_build.txt"


def build_record() -> str | None:
    """The build's word on ``ratewarden._front`` (``compiled``, or why it was not built); ``None`` when
    the build wrote none (a tree that was never built with the packaging's build step)."""
    try:
        return BUILD_RECORD.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def compiled_module() -> tuple[ModuleType | None, str]:
    """``ratewarden._front``, or ``None`` and why it does not import."""
    try:
        return importlib.import_module(MODULE), ""
    except ImportError as exc:
        record = build_record()
        built = f"the build said: {record}" if record else "it is built from rust/ when cargo is on PATH at install time"
        return None, f"{MODULE} does not import ({exc}); {built}"


def open_front(descriptor_class: type | None, settings: dict[str, Any]) -> Any:
    """A started ``ratewarden._front.Front`` with ``settings`` (rust/src/settings.rs), calling
    ``descriptor_class`` for each gRPC descriptor (``None`` without gRPC); ``ImportError`` naming why
    without the module."""
    module, why = compiled_module()
    if module is None:
        raise ImportError(why)
    return module.Front(descriptor_class, settings)


def queue_settings(max_pending: int, max_pending_bytes: int, timeout: float) -> dict[str, Any]:
    """The ``queue`` settings of a front door whose requests wait for Python (gRPC, HTTP)."""
    return {"max_pending": max_pending, "max_pending_bytes": max_pending_bytes, "request_timeout": timeout}


def choose_front(requested: str, option: str = "--front") -> tuple[str, str]:
    """The front door ``option requested`` runs (``--front``, ``--http-front``, ``--spoe-front``),
    ``"compiled"`` or ``"python"``, and why not the compiled one (empty when it runs);
    ``ConfigurationError`` when ``compiled`` is asked for and absent.

    Args:
        requested: One of ``FRONTS``.
        option: The option that asked, for the messages.
    """
    if requested not in FRONTS:
        raise ConfigurationError(f"{option} must be one of {', '.join(FRONTS)}, got {requested!r}")
    if requested == "python":
        return "python", f"{option} python"
    module, why = compiled_module()
    if module is not None:
        return "compiled", ""
    if requested == "compiled":
        raise ConfigurationError(f"{option} compiled: {why}")
    return "python", why


class _Wait:
    """Hands ``pending`` (what a decision coroutine yielded: a future, or ``None`` for one loop pass)
    to the running Task, which wakes when it is done."""

    __slots__ = ("pending",)

    def __init__(self, pending: Any) -> None:
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, None]:
        yield self.pending


#: A decision that suspended: the request's id, its coroutine, and what it waits for.
Waiting = tuple[int, Coroutine[Any, Any, RlsAnswer], Any]


def _error(exc: BaseException) -> tuple[int, str]:
    """The gRPC status of a failed decision, as ``serve.grpc.RlsServicer`` answers it."""
    if isinstance(exc, RlsRequestError):
        return _INVALID_ARGUMENT, str(exc)
    if isinstance(exc, LimitUnavailable):
        return _UNAVAILABLE, str(exc)
    log.error("ShouldRateLimit failed", exc_info=exc, extra={"event": "grpc_failed"})
    return _INTERNAL, f"{type(exc).__name__}: {exc}"


#: One request taken: its id, domain, descriptors, hits added, and seconds left to its deadline.
GrpcRequest = tuple[int, str, list[RequestDescriptor], int, float]


_ENDED = object()  # a decision that ended in its first step (its answer is in ``done``)


class FrontAdapter(BatchAdapter[GrpcRequest, Item]):
    """Feeds a started ``Front``'s gRPC batches to ``service`` on the running event loop.

    Args:
        front: The started front door.
        service: What decides; each decision reads its configuration then (reloads apply at once).
        max_batch: The most requests taken in one crossing.
    """

    def __init__(self, front: Front, service: RateLimitService, max_batch: int = 1024) -> None:
        self.service = service
        self.expired = 0  # decisions stopped at their request's deadline (Rust answered DEADLINE_EXCEEDED)
        #: What each suspended decision waits for now, and its deadline (the loop's clock).
        self._waits: dict[int, Any] = {}
        self._due: dict[int, float] = {}
        self._past: set[int] = set()
        super().__init__(front, front.take, front.answer, max_batch)

    def _begin(self, batch: list[GrpcRequest], done: list[Item]) -> None:
        """Decide each request inline; those that suspend (one store pipeline) go on in one Task."""
        waiting: list[Waiting] = []
        now = self.taken_at  # before Rust measured ``left``: our deadlines are never later than its
        soonest = math.inf
        for rid, domain, descriptors, hits, left in batch:
            coro = self.service.should_rate_limit(domain, descriptors, hits)
            token = CALLER_DEADLINE.set(now + left)
            first: Any = _ENDED
            try:
                first = coro.send(None)
            except StopIteration as stop:
                done.append((rid, stop.value))
            except Exception as exc:
                done.append((rid, _error(exc)))
            finally:
                CALLER_DEADLINE.reset(token)
            if first is _ENDED:
                continue
            waiting.append((rid, coro, first))
            self._waits[rid] = first
            self._due[rid] = now + left
            soonest = min(soonest, left)
        if waiting:
            timer: list[asyncio.TimerHandle] = []
            timer.append(self.loop.call_at(now + soonest, self._expire_due, [w[0] for w in waiting], timer))
            self._spawn(self._resume(waiting, timer))

    def _expire_due(self, rids: list[int], timer: list[asyncio.TimerHandle]) -> None:
        """A batch's one deadline timer: expire its decisions still waiting whose deadline has come
        (within ``DUE_SLACK``), and wait again for the soonest of the others."""
        now = self.loop.time()
        later: list[int] = []
        soonest = math.inf
        for rid in rids:
            due = self._due.get(rid)
            if due is None:
                continue  # settled
            if due - now <= DUE_SLACK:
                self._expire(rid)
            else:
                later.append(rid)
                soonest = min(soonest, due)
        if later:
            timer[0] = self.loop.call_at(soonest, self._expire_due, later, timer)

    def _expire(self, rid: int) -> None:
        """At a suspended decision's deadline: Rust has answered it DEADLINE_EXCEEDED, so cancel what
        it waits for (a store call not sent yet is then never sent: nothing is charged for it)."""
        self._due.pop(rid, None)
        self._past.add(rid)
        pending = self._waits.get(rid)
        if pending is not None and not pending.done():
            pending.cancel()

    def _settled(self, rid: int) -> bool:
        """Forget a decision that ended; true when it ended past its deadline (answered already)."""
        self._waits.pop(rid, None)
        self._due.pop(rid, None)
        if rid in self._past:
            self._past.discard(rid)
            self.expired += 1
            return True
        return False

    async def _resume(self, waiting: list[Waiting], timer: list[asyncio.TimerHandle]) -> None:
        """Resume a batch's suspended decisions in one Task, each from where it stopped. They were
        queued into the same store pipeline in one loop pass, so the Task wakes once for all of
        them; the answers go back in one call, and before each wait for what is not done yet.
        ``timer`` holds the batch's deadline timer, cancelled once every decision has ended."""
        try:
            await self._resume_all(waiting)
        finally:
            timer[0].cancel()

    async def _resume_all(self, waiting: list[Waiting]) -> None:
        done: list[Item] = []
        while waiting:
            later: list[Waiting] = []
            for rid, coro, pending in waiting:
                if pending is None or not pending.done():
                    if done:
                        self.answer(done)
                        done = []
                    try:
                        await _Wait(pending)
                    except BaseException:
                        if pending is None or not pending.done():
                            raise  # this Task is cancelled
                        # else the future failed: the decision reads that itself, below
                due = self._due.get(rid, math.inf)
                if rid in self._past or due <= self.loop.time():  # past its deadline: go no further
                    self._expire(rid)
                    coro.close()  # its finally blocks run
                    self._settled(rid)
                    continue
                token = CALLER_DEADLINE.set(due)
                try:
                    pending = coro.send(None)  # a done future's ``await`` returns its result
                except StopIteration as stop:
                    if not self._settled(rid):
                        done.append((rid, stop.value))
                except (Exception, asyncio.CancelledError) as exc:
                    if not self._settled(rid):
                        done.append((rid, _error(exc)))
                else:
                    self._waits[rid] = pending
                    later.append((rid, coro, pending))
                finally:
                    CALLER_DEADLINE.reset(token)
            waiting = later
        if done:
            self.answer(done)


class CompiledFront:
    """A started compiled front door and its adapter; ``await stop(grace)`` ends it gracefully."""

    def __init__(self, front: Front, adapter: FrontAdapter, timeout: float = bounds.GRPC_TIMEOUT) -> None:
        self.front = front
        self.adapter = adapter
        self.timeout = timeout

    def stalled(self) -> str | None:
        """Why ``/healthz`` fails for this door (its queue waits past the request timeout), or ``None``."""
        return stall_problem("gRPC", self.front.stalled()[0], self.timeout)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.front.port

    async def stop(self, grace: float | None) -> None:
        """No new connection or call (HTTP/2 GOAWAY); calls in flight are still decided and answered
        for up to ``grace`` seconds, then the front door's threads stop.

        Args:
            grace: Seconds for the calls in flight (``None``: none).
        """
        loop = asyncio.get_running_loop()
        self.front.close()
        deadline = loop.time() + (grace or 0.0)
        while self.front.serving() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.adapter.close()
        await asyncio.to_thread(self.front.stop, 0.5)


def start_front(
    service: RateLimitService, host: str = "127.0.0.1", port: int = 8081, *, reuse_port: bool = False,
    max_message_size: int = bounds.GRPC_MAX_MESSAGE_SIZE, max_descriptors: int = bounds.MAX_DESCRIPTORS,
    max_entries: int = bounds.MAX_ENTRIES, max_connections: int = bounds.GRPC_MAX_CONNECTIONS,
    timeout: float = bounds.GRPC_TIMEOUT, max_pending: int = bounds.GRPC_MAX_PENDING,
    handshake_timeout: float = bounds.GRPC_HANDSHAKE_TIMEOUT,
    max_pending_bytes: int = bounds.GRPC_MAX_PENDING_BYTES, max_receiving: int = bounds.GRPC_MAX_RECEIVING,
    max_receiving_per_connection: int = bounds.GRPC_MAX_RECEIVING_PER_CONNECTION,
) -> CompiledFront:
    """Start Envoy's rate limit service through the compiled front door on ``host:port`` (port 0: any
    free one), deciding on the running event loop; ``ImportError`` without ``ratewarden._front``.

    Args:
        service: What decides.
        host: The address to listen on.
        port: The port; 0 picks a free one.
        reuse_port: Let several processes listen on the port (``SO_REUSEPORT``, for workers).
        max_message_size: The largest request, in bytes (larger: RESOURCE_EXHAUSTED, unread).
        max_descriptors: Descriptors per request (more: INVALID_ARGUMENT, never decided).
        max_entries: Entries per request, over its descriptors (more: INVALID_ARGUMENT).
        max_connections: Open connections (one more is closed at once).
        timeout: Seconds from a request's arrival (its headers) to its answer, its message's bytes
            included (then DEADLINE_EXCEEDED, the stream reset and what it sent freed); a caller's
            shorter ``grpc-timeout`` applies instead, and a decision still waiting then is cancelled.
        max_pending: Requests waiting for a decision (more: RESOURCE_EXHAUSTED).
        handshake_timeout: Seconds for a new connection to send HTTP/2's preface and SETTINGS (then
            it is closed, freeing its place under ``max_connections``).
        max_pending_bytes: Bytes of the requests waiting for a decision (more: RESOURCE_EXHAUSTED).
        max_receiving: Bytes of the calls still being received, over every connection (8 KiB a call
            plus what it sent; more: RESOURCE_EXHAUSTED).
        max_receiving_per_connection: The same on one connection.
    """
    # OSError "cannot listen for gRPC on ...": the address is taken
    front: Front = open_front(RequestDescriptor, {
        "queue": queue_settings(max_pending, max_pending_bytes, timeout),
        "grpc": {
            "host": host, "port": port, "reuse_port": reuse_port, "max_message_size": max_message_size,
            "max_descriptors": max_descriptors, "max_entries": max_entries,
            "max_connections": max_connections,
            "handshake_timeout": handshake_timeout, "max_receiving": max_receiving,
            "max_receiving_per_connection": max_receiving_per_connection,
        },
    })
    return CompiledFront(front, FrontAdapter(front, service), timeout)


def describe(requested: str = "auto", option: str = "--front") -> str:
    """One line naming the front door ``option requested`` runs (``ratewarden serve --version``): the
    compiled one and the library in it that serves the protocol, else the Python one and why not the
    compiled one.

    Args:
        requested: One of ``FRONTS``.
        option: The door's option, one of ``DOORS``.
    """
    kind, python, engine = DOORS[option]
    try:
        front, why = choose_front(requested, option)
    except ConfigurationError as exc:
        return f"{kind} front door: none ({exc})"
    if front == "python":
        return f"{kind} front door: python ({python}); not compiled: {why}"
    module, _ = compiled_module()
    return f"{kind} front door: compiled ({engine} in {MODULE} {getattr(module, '__version__', '?')})"
