"""Run the compiled gRPC front door prototype (rust/, ``ratewarden_front``) over ratewarden's one
decision core: ``python scripts/front_prototype.py --grpc 127.0.0.1:8091 --store memory:// envoy.yaml``.

Rust owns the connections, HTTP/2 and protobuf and queues decoded requests; this event loop watches
the front door's wake-up descriptor, takes every waiting request at once, decides each with
``RateLimitService.should_rate_limit`` (the same call ``serve.grpc`` makes) and hands all the answers
back in one call. A decision that completes without waiting (the memory store) is answered in the
same batch, with no task; one that waits (Redis) becomes a task, so concurrent ones still coalesce
into the store's pipelines, and its answer leaves with the next flush.

The build of ``ratewarden_front`` is in rust/README.md; ``--lib DIR`` adds the folder holding the
built ``ratewarden_front*.so`` to ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

from ratewarden.errors import LimitUnavailable
from ratewarden.limiter import Limiter
from ratewarden.serve import bounds
from ratewarden.serve.config import load_envoy, parse_address
from ratewarden.serve.rls import RateLimitService, RequestDescriptor, RlsAnswer, RlsRequestError
from ratewarden.stores import open_store

log = logging.getLogger("ratewarden.serve.front")

INVALID_ARGUMENT, INTERNAL, UNAVAILABLE = 3, 13, 14
GRACE = 10.0  #: seconds the calls in flight get when asked to stop (as ``serve.worker.GRACE``)
Item = tuple[int, "RlsAnswer | tuple[int, str]"]


class _Rest:
    """The rest of a decision coroutine that suspended on ``first`` (a store future), for a Task:
    the Task waits on ``first``, then the coroutine goes on where it stopped."""

    def __init__(self, coro: Coroutine[Any, Any, RlsAnswer], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, RlsAnswer]:
        coro, pending = self.coro, self.first
        while True:  # what ``yield from`` does, from a coroutine already started
            try:
                sent = yield pending
            except BaseException as exc:
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                continue
            try:
                pending = coro.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


def _error(exc: BaseException) -> tuple[int, str]:
    """The gRPC status of a failed decision, as ``serve.grpc.RlsServicer`` answers it."""
    if isinstance(exc, RlsRequestError):
        return INVALID_ARGUMENT, str(exc)
    if isinstance(exc, LimitUnavailable):
        return UNAVAILABLE, str(exc)
    log.error("ShouldRateLimit failed", exc_info=exc)
    return INTERNAL, f"{type(exc).__name__}: {exc}"


class FrontAdapter:
    """Feeds a ``ratewarden_front.Front``'s batches to a ``RateLimitService`` on this event loop.

    Args:
        front: The started front door.
        service: What decides.
        max_batch: The most requests taken in one crossing.
    """

    def __init__(self, front: Any, service: RateLimitService, max_batch: int = 1024) -> None:
        self.front = front
        self.service = service
        self.max_batch = max_batch
        self.loop = asyncio.get_running_loop()
        self._late: list[Item] = []
        self._flush_scheduled = False
        self.batches = 0
        self.requests = 0
        self.loop.add_reader(front.fileno(), self._on_wake)

    def close(self) -> None:
        """Stop watching the front door."""
        self.loop.remove_reader(self.front.fileno())

    def _on_wake(self) -> None:
        self.front.drain()
        decide = self.service.should_rate_limit
        while True:
            batch = self.front.take(self.max_batch)
            if not batch:
                return
            self.batches += 1
            self.requests += len(batch)
            done: list[Item] = []
            for rid, domain, descriptors, hits in batch:
                coro = decide(domain, descriptors, hits)
                try:
                    first = coro.send(None)
                except StopIteration as stop:
                    done.append((rid, stop.value))
                    continue
                except BaseException as exc:
                    done.append((rid, _error(exc)))
                    continue
                self.loop.create_task(self._finish(rid, _Rest(coro, first)))
            self.front.answer(done)

    async def _finish(self, rid: int, rest: _Rest) -> None:
        try:
            item: Item = (rid, await rest)
        except Exception as exc:
            item = (rid, _error(exc))
        self._late.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        late, self._late = self._late, []
        self.front.answer(late)


async def serve(args: argparse.Namespace) -> None:
    """Start the front door and decide until SIGTERM/SIGINT."""
    import ratewarden_front  # type: ignore[import-not-found]  # built from rust/ (rust/README.md)

    host, port = parse_address(args.grpc, "--grpc")
    limiter = Limiter(open_store(args.store), on_error=args.on_error)
    service = RateLimitService(load_envoy([Path(p) for p in args.files]), limiter)
    front = ratewarden_front.Front(
        RequestDescriptor, host, port, reuse_port=args.reuse_port,
        max_message_size=bounds.GRPC_MAX_MESSAGE_SIZE, max_descriptors=bounds.MAX_DESCRIPTORS,
        max_entries=bounds.MAX_ENTRIES, max_connections=args.max_connections, max_pending=args.max_pending,
        request_timeout=args.request_timeout, threads=args.threads,
    )
    adapter = FrontAdapter(front, service, args.max_batch)
    print(f"ratewarden_front {ratewarden_front.__version__} serving gRPC on {host}:{front.port} (pid {os.getpid()})", flush=True)
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopped.set)
    await stopped.wait()
    front.close()  # no new calls; the ones in flight are still decided, for up to GRACE seconds
    deadline = asyncio.get_running_loop().time() + GRACE
    while front.pending() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    adapter.close()
    front.stop(0.5)
    print(f"batches {adapter.batches} requests {adapter.requests} "
          f"({adapter.requests / max(1, adapter.batches):.1f} a batch)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("files", nargs="+", help="envoyproxy/ratelimit YAML files")
    parser.add_argument("--grpc", default="127.0.0.1:8091", help="HOST:PORT to listen on")
    parser.add_argument("--store", default="memory://", help="store URL (memory://, redis://...)")
    parser.add_argument("--on-error", choices=("open", "closed"), default="open")
    parser.add_argument("--threads", type=int, default=1, help="tokio worker threads")
    parser.add_argument("--max-batch", type=int, default=1024, help="requests taken per crossing")
    parser.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT (several processes)")
    parser.add_argument("--max-connections", type=int, default=1000, help="open connections (more: closed at once)")
    parser.add_argument("--max-pending", type=int, default=10000, help="requests waiting (more: RESOURCE_EXHAUSTED)")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds to an answer (then DEADLINE_EXCEEDED)")
    parser.add_argument("--lib", help="folder holding the built ratewarden_front*.so")
    args = parser.parse_args()
    if args.lib:
        sys.path.insert(0, args.lib)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
