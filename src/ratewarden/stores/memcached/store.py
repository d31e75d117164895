"""``MemcachedStore``: its settings and the Store API (hit, peek, adjust, reset, clear, close).

A denied key is remembered (its state, limit and cost) until its retry time: it is answered from
that cache without a round trip, with the decision the algorithm gives for that state
(``cached_rejection``, ``cached_rejections``; ``cache=False`` turns it off).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, TypeVar

from ...decision import Decision
from ...errors import ArgumentError, ConfigurationError
from ...limits import Limit
from ..base import no_reply
from ..insurance import Ledger
from ..rejections import RejectionCache
from ..urls import parse_store_url
from ._aiomcache import ClientException
from .batches import Batches
from .connections import Client, Heard, Pool
from .encoding import memcached_key
from .protocol import deleted, ok, values_reader
from .sync_client import Blocking, peek_decisions

_T = TypeVar("_T")


class MemcachedStore(Batches, Blocking):
    """Limits kept in memcached, built from ``memcached://host:port``.

    Keyword arguments override the URL's query options of the same name.

    Args:
        url: ``memcached://host:port``, with options in its query.
        timeout: Seconds memcached may stay silent on a command (default 0.05).
        pool_size: Connections (default 8).
        retries: CAS attempts before ``StoreError``.
        cache: Answer rejections known to hold from a local cache, without a round trip (default on).
        clock: Seconds since the epoch; replace it in tests.
    """

    # RuntimeError: another loop; EOFError: a reply cut short (asyncio.IncompleteReadError)
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (OSError, ClientException, RuntimeError, EOFError)

    def __init__(
        self,
        url: str = "memcached://127.0.0.1:11211",
        *,
        timeout: float | None = None,
        pool_size: int | None = None,
        retries: int = 50,
        cache: bool | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cfg = parse_store_url(url, ("memcached",))
        if len(cfg.hosts) != 1:
            raise ConfigurationError(
                f"store URL {cfg.text!r}: MemcachedStore takes exactly one host:port, got {len(cfg.hosts)}"
            )
        self.url = cfg.text
        self.timeout = float(timeout if timeout is not None else cfg.option("timeout", 0.05))  # type: ignore[arg-type]
        size = int(pool_size if pool_size is not None else cfg.option("pool_size", 8))  # type: ignore[call-overload]
        self.cache_rejections = bool(cache if cache is not None else cfg.option("cache", 1))
        if not self.timeout > 0:
            raise ConfigurationError(f"{self!r}: timeout must be positive, got {self.timeout!r} seconds")
        if size < 1:
            raise ConfigurationError(f"{self!r}: pool_size must be at least 1, got {size}")
        if retries < 1:
            raise ConfigurationError(f"{self!r}: retries must be at least 1, got {retries}")
        self.retries = retries
        self.clock = clock
        host, port = cfg.hosts[0]
        self._client = Client(host, port, pool_size=size)
        self._pool = self._client._pool = Pool(host, port, minsize=size, maxsize=size)
        self._pool.connect_timeout = max(1.0, self.timeout)
        self._locks = {}  # key -> [asyncio.Lock, users]
        self._queues = {}  # key -> checks waiting for its next batch
        self._leaders = set()  # tasks running batches
        self._undoing = set()  # put-backs of interrupted checks
        self._rejections = RejectionCache()
        self._loop_hits = 0  # checks the event loop answered from the cache (threads: _rejections.thread_hits)
        self._heard = Heard()  # data arrivals on every connection
        self._silent_at = -1  # ``_heard.count`` when a command last timed out (-1: not silent)
        self._silence = None  # resolved when a command times out
        self.cas_conflicts = 0  # lost compare-and-swap races (retried)
        #: The last answer per key, and what a limiter's insurance limiter admitted during an outage
        #: (charged back by the first check that succeeds after it).
        self.ledger = Ledger()
        self._init_blocking(host, port, size)  # hit_blocking's own synchronous client (pymemcache)

    def __repr__(self) -> str:
        return f"MemcachedStore({self.url!r})"

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        if not len(self._rejections):
            return None
        cached = self._rejections.lookup(keys, costs, self.clock())
        if cached is not None:
            self._loop_hits += 1
        return cached

    @property
    def cached_rejections(self) -> int:
        """Checks answered from the rejection cache: by the event loop and by threads."""
        return self._loop_hits + self._rejections.thread_hits

    @cached_rejections.setter
    def cached_rejections(self, value: int) -> None:
        self._loop_hits = value - self._rejections.thread_hits

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        if len(self._rejections):
            cached = self.cached_rejection(keys, costs)
            if cached is not None:
                return cached
        ledger = self.ledger
        if ledger.owed:  # charged back first, so this check counts them
            error = await ledger.settle(self)
            if error is not None:
                raise error
        if len(keys) == 1:
            decision = await self._coalesced(keys[0], limits[0], costs[0])
        else:
            mkeys = [memcached_key(k) for k in keys]
            decision = await self._run(mkeys, lambda: self._cas_hit(keys, mkeys, limits, costs), "hit")
        ledger.note_check(keys, limits, decision)
        return decision

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        """Charge (positive) or refund (negative) ``amounts[i]`` on ``keys[i]`` without a limit
        check, exactly as ``ratewarden.charges.adjusted_state`` computes it."""
        if not len(keys) == len(limits) == len(amounts):
            raise ArgumentError("adjust: keys, limits and amounts must have the same length")
        self._rejections.invalidate(keys)
        mkeys = [memcached_key(k) for k in keys]
        try:
            return await self._run(mkeys, lambda: self._cas_adjust(mkeys, limits, amounts), "adjust")
        finally:
            self._rejections.invalidate(keys)

    async def _run(self, mkeys: list[bytes], operation: Callable[[], Awaitable[_T]], name: str) -> _T:
        """``operation`` (called ``name`` in errors) under this process's per-key locks, with the
        error mapping."""
        return await self._mapped(self._locked(mkeys, operation), name)

    async def _mapped(self, awaitable: Awaitable[_T], operation: str) -> _T:
        """``awaitable``, every failure as ``StoreError`` naming ``operation``."""
        try:
            return await awaitable
        except asyncio.TimeoutError:
            raise no_reply(repr(self), operation, self.timeout) from None
        except self.client_errors as exc:
            raise self.store_error(operation, exc) from exc

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        values = await self._mapped(self._get_all([memcached_key(k) for k in keys]), "peek")
        return peek_decisions(values, limits, self.clock())  # as peek_blocking reads them

    async def _get_all(self, mkeys: list[bytes]) -> list[bytes | None]:
        if not mkeys:
            return []
        unique = list(dict.fromkeys(mkeys))
        read = await self._command(b"get " + b" ".join(unique) + b"\r\n", values_reader(unique))
        found = {k: value for k, (value, _) in zip(unique, read, strict=True)}
        return [found[k] for k in mkeys]

    async def reset(self, keys: Sequence[str]) -> None:
        self._rejections.invalidate(keys)
        try:
            await self._mapped(self._delete_all([memcached_key(k) for k in keys]), "reset")
        finally:  # nor a denial read while it was under way
            self._rejections.invalidate(keys)

    async def _delete_all(self, mkeys: list[bytes]) -> None:
        for key in mkeys:
            await self._command(b"delete " + key + b"\r\n", deleted)

    async def clear(self) -> None:
        """Memcached cannot list keys, so this empties the whole instance (``flush_all``):
        give ratewarden a memcached of its own if you use it."""
        self._rejections.clear()
        await self._mapped(self._command(b"flush_all\r\n", ok), "clear")

    async def close(self) -> None:
        for task in list(self._leaders):  # batches under way end (bounded by their commands)
            with contextlib.suppress(BaseException):
                await task
        for task in list(self._undoing):  # give pending put-backs their (bounded) time
            with contextlib.suppress(BaseException):
                await task
        self._client.closed = True
        with contextlib.suppress(OSError, ClientException):
            await self._client.close()
        await self._close_blocking()
