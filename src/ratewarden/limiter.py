"""``Limiter``: the entry point that turns (key, rates) into decisions on a store."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Literal

from ._mypyc import mypyc_attr
from .algorithms import AlgorithmName
from .caches import remember
from .decision import Decision
from .errors import ArgumentError, ConfigurationError
from .limits import DEFAULT_ALGORITHM, Limit, make_limits
from .loop_thread import LoopThread
from .rates import RateSpec, freeze_rates
from .steps import Hit, Machine, drive, driven
from .storage_keys import MAX_KEY_LENGTH as MAX_KEY_LENGTH
from .storage_keys import safe_key, storage_key
from .store_health import (
    FAILURE_REASONS,
    STORE_CHECK_KEY,
    STORE_CHECK_TIMEOUT,
    WITHOUT_STORE_REASONS,
    cached_rejections,
    check_failure,
    count_without_store,
    innermost,
    log_without_store,
    outage_policy,
    probe_store,
    store_problem,
    without_store_totals,
)
from .stores.adapted import as_store, type_name
from .stores.base import Store, StoreError
from .stores.insurance import Ledger
from .stores.memory import MemoryStore
from .stores.protocols import AsyncStore

# Storage keys (storage_keys.py) and the store's health (store_health.py) are re-exported as part
# of this module's API.
__all__ = [
    "WITHOUT_STORE_REASONS", "FailurePolicy", "Fallback", "Limiter", "safe_key", "storage_key", "store_problem",
    "without_store_totals",
]

log = logging.getLogger("ratewarden")

FailurePolicy = Literal["open", "closed"]
#: ``Limiter(fallback=...)``: a local store (``protocols.LocalStore``), ``"local"`` (a new
#: ``MemoryStore`` of the limiter's own) or ``None`` (no insurance limiter: a failed check is not decided).
Fallback = Store | AsyncStore | Literal["local"] | None
#: A failed check this long (seconds) after the previous failed one starts a new outage: the
#: limiter's own insurance limiter starts it with no counts.
OUTAGE_GAP = 60.0
#: Seconds between two log lines about checks decided without the store (per limiter).
LOG_INTERVAL = 1.0
#: Keys the insurance limiter remembers having seeded in an outage (emptied whole when full: a key
#: seeded again is only brought down to its share, never up).
SEEDED = 16_384
SEEDED_BYTES = SEEDED * 512
#: ``Limiter.store_failing``'s default: a failed check this recent (seconds) means the store fails.
FAILING_FOR = 5.0


@mypyc_attr(allow_interpreted_subclasses=True)
class Limiter:
    """Checks keys against rates on a store.

    Args:
        store: Where the counts live: a ``Store`` or a store of your own (``stores.protocols.AsyncStore``,
            adapted once, here: ``limiter.store`` is then the adapter); the default ``None`` is a new ``MemoryStore()``.
        prefix: Prepended to every storage key, so several limiters can share a store.
        on_error: What happens when the store (or a key function) fails: ``"open"`` (the default) decides
            the check with ``fallback`` (a key function's failure, or no fallback: lets the request
            through) and logs; ``"closed"`` answers 503 (``Limiter.hit`` raises ``StoreError``).
        enabled: ``False`` turns every integration into a pass-through (e.g. in tests).
        fallback: The insurance limiter: under ``on_error="open"``, a check the store fails
            (``StoreError``, or any other exception: a bug) is decided by this local store instead,
            with the same keys, limits and costs, so an outage limits per process instead of not at
            all. ``"local"`` (the default) is a ``MemoryStore()`` of this limiter's own (for a
            ``MemoryStore``, made when it first fails); ``None`` lets such checks through unchecked
            (``Limiter.hit`` raises the ``StoreError``). A key starts from what the store last said
            was left for it (a remote store's ``ledger``), this process's share of it (``workers``);
            what it admits is charged to the store by the first check that succeeds once it answers.
        workers: How many processes share the store's limits (each has its own insurance limiter,
            which admits ``1/workers`` of what is left); the default ``None`` reads the
            ``WEB_CONCURRENCY`` environment variable (uvicorn's, gunicorn's), else 1.
    """

    def __init__(
        self,
        store: Store | AsyncStore | None = None,
        *,
        prefix: str = "rw",
        on_error: FailurePolicy = "open",
        enabled: bool = True,
        fallback: Fallback = "local",
        workers: int | None = None,
    ) -> None:
        if on_error not in ("open", "closed"):
            raise ConfigurationError(f"on_error must be 'open' or 'closed', got {on_error!r}")
        self.store: Store = as_store(store) if store is not None else MemoryStore()
        self.prefix = prefix
        self.on_error: FailurePolicy = on_error
        self.enabled = enabled
        self._limits_cache: dict[tuple[object, str], tuple[Limit, ...]] = {}
        self._sync_loop = LoopThread()
        self._owns_fallback = False
        self.fallback: Store | None = None
        if isinstance(fallback, str):
            if fallback != "local":
                raise ConfigurationError(f"fallback must be a local store, 'local' or None, got {fallback!r}")
            self._owns_fallback = True  # a MemoryStore's is made when it fails (decide_without_store)
            self.fallback = None if self.store.local and isinstance(self.store, MemoryStore) else MemoryStore()
        elif isinstance(fallback, (Store, AsyncStore)):
            self.fallback = as_store(fallback, "fallback")
            self.fallback.require("local", "Limiter(fallback=...)")
        elif fallback is not None:
            raise TypeError(
                f"fallback must be a local store (e.g. MemoryStore()), 'local' or None, got {type_name(fallback)}: {fallback!r}"
            )
        self.workers = _workers(workers)
        # Keys the insurance limiter has seeded in this outage: key -> monotonic time the seed ends.
        self._seeded: dict[str, float] = {}
        self._last_error: StoreError | None = None
        # Checks decided without the store: by reason (``without_store``), and what was logged.
        self._without: dict[str, int] = dict.fromkeys((*FAILURE_REASONS, "local_limiter"), 0)
        self._logged: dict[str, int] = dict(self._without)
        self._logged_cached = 0
        self._logged_at = -math.inf  # monotonic time of the last line
        self._batch_start = -1.0  # the first failure not logged yet (-1: none)
        self._last_failure = -math.inf
        # The store's health was reported (``check_store``, or the first failure without one): the
        # ERROR line is logged once per limiter; later failures are the warnings of ``_log_without_store``.
        self._store_reported = False

    def limits(self, rates: RateSpec, algorithm: AlgorithmName = DEFAULT_ALGORITHM) -> tuple[Limit, ...]:
        """Parse and cache ``rates`` for ``algorithm`` (strings are cached, so the hot path does not re-parse).

        Args:
            rates: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of
                them; every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
        """
        spec = freeze_rates(rates)  # a generator is read once, for the cache key and the limits alike
        cache_key = (spec, algorithm)
        found = self._limits_cache.get(cache_key)
        if found is None:
            found = make_limits(spec, algorithm)
            remember(self._limits_cache, cache_key, found, 1024)
        return found

    def keys_for(self, key: str, limits: Sequence[Limit], namespace: str = "") -> list[str]:
        """The storage key of ``key`` under each of ``limits``.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            limits: What ``Limiter.limits`` returned.
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be a string (e.g. the client IP), got {type(key).__name__} {key!r}")
        prefix = self.prefix
        return [storage_key(prefix, namespace, key, limit.suffix) for limit in limits]

    async def check(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision:
        """All-or-nothing check of prepared storage keys (used by the integrations).

        Args:
            keys: Storage keys, one per limit (``Limiter.keys_for`` builds them).
            limits: The limit checked on each key, ``limits[i]`` on ``keys[i]``.
            costs: What the request costs under each limit, ``costs[i]`` for ``keys[i]``.
        """
        return await driven(self._hit_steps(keys, limits, costs))

    def _hit_steps(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Machine[Decision]:
        """``check`` as a step machine (``ratewarden.steps``): the store's answer, or the insurance
        limiter's when the store failed (else its ``StoreError``)."""
        store = self.store
        try:
            decision: Decision = yield Hit(store, keys, limits, costs)
        except Exception as exc:  # a StoreError, or a bug in the store (check_failure)
            error = check_failure(store, exc)
            fallback = self.decide_without_store(error, keys, limits, costs)
            if fallback is None:
                raise error from error.__cause__
            return fallback
        return decision

    def decide_without_store(
        self, error: StoreError, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision | None:
        """A check the store failed: counted by ``error.reason`` (``without_store``), logged (at
        most once a second, with the count since the last line) and, under ``on_error="open"``,
        decided by the insurance limiter (``fallback``). ``None`` when nothing decided it (no
        fallback, or fail-closed): the caller applies ``on_error``. Every check calls it when its store raises.

        Args:
            error: What the store raised.
            keys: The check's storage keys.
            limits: The limit checked on each key.
            costs: What the request costs under each limit.
        """
        reason = error.reason if error.reason in FAILURE_REASONS else "error"
        self._without[reason] += 1
        count_without_store(reason)
        now = time.monotonic()
        if now - self._last_failure >= OUTAGE_GAP:
            self._seeded.clear()
            if self._owns_fallback:
                self.fallback = MemoryStore()  # a new outage: nothing carried over from the last one
        if not self._store_reported:  # nothing checked the store at start-up: this is the first word of it
            self._report_store(error, "failed a check, its first failure (nothing checked it at start-up)")
        self._last_failure = now
        self._last_error = error
        if self._batch_start < 0:
            self._batch_start = now
        decision: Decision | None = None
        fallback = self.fallback
        if fallback is not None and self.on_error == "open":
            ledger = _ledger_of(self.store)
            try:
                self._seed(fallback, ledger, keys, limits, now)
                decision = fallback.hit_now(keys, limits, costs)
            except Exception as exc:  # the insurance limiter cannot decide either: as without one
                log.warning("insurance limiter failed: %s: %s", type(exc).__name__, exc)
            else:
                self._without["local_limiter"] += 1
                count_without_store("local_limiter")
                if decision.allowed and ledger is not None:
                    ledger.owe(keys, limits, costs, decision)
        if now - self._logged_at >= LOG_INTERVAL:
            self._log_without_store(now, error)
        return decision

    def _seed(self, fallback: Store, ledger: Ledger | None, keys: Sequence[str], limits: Sequence[Limit], now: float) -> None:
        """Bring each key's count on the insurance limiter down to this process's share of what the
        store last said was left for it (``ledger``; else the whole limit) over ``workers``: once per
        key and outage window, again when the store answered for it since; never up."""
        seeded = self._seeded
        workers = self.workers
        for key, limit in zip(keys, limits, strict=False):
            again = seeded.get(key, 0.0) > now  # seeded in this outage: again only if the store answered since
            left = ledger.last_remaining(key, now, marked=not again) if ledger is not None else None
            if again and left is None:
                continue
            if left is None and workers == 1:  # the whole limit: nothing to bring down
                remember(seeded, key, now + limit.rate.period, SEEDED, SEEDED_BYTES)
                continue
            share = (limit.rate.limit if left is None else max(0, left)) // workers
            (current,) = fallback.peek_now((key,), (limit,))
            until = current.reset_after
            if current.remaining > share and fallback.supports("adjust"):
                (current,) = fallback.adjust_now((key,), (limit,), (current.remaining - share,))
                until = current.reset_after
            remember(seeded, key, now + (until if until > 0 else limit.rate.period), SEEDED, SEEDED_BYTES)

    def store_failing(self, within: float = FAILING_FOR) -> StoreError | None:
        """The store's last failure, when a check failed in the last ``within`` seconds and the
        store has not answered one since (a remote store's ``ledger`` knows); else ``None``.
        ``ratewarden serve``'s ``/healthz`` asks it: a store can fail on checks while a read of
        one key still answers (a corrupt shared-memory table, a Cluster shard without a primary).

        Args:
            within: Seconds a failure counts for.
        """
        error = self._last_error
        if error is None or time.monotonic() - self._last_failure > within:
            return None
        ledger = _ledger_of(self.store)
        if ledger is not None and ledger.answered_at > self._last_failure:
            return None
        return error

    def _log_without_store(self, now: float, error: StoreError) -> None:
        """One line for the checks decided without the store since the last line."""
        counts = self._without
        logged = self._logged
        cached = cached_rejections(self.store)
        since = {reason: counts[reason] - logged[reason] for reason in counts}
        since["over_limit_cache"] = max(0, cached - self._logged_cached)
        log_without_store(self.store, error, since, now - self._batch_start)
        self._logged = dict(counts)
        self._logged_cached = cached
        self._logged_at = now
        self._batch_start = -1.0

    async def check_store(self, timeout: float = STORE_CHECK_TIMEOUT) -> StoreError | None:
        """Ask the store once, at start-up, whether it answers, and return the ``StoreError`` when it
        does not (``None`` when it does): returned, never raised, so that one bad store does not keep
        the app from starting. To refuse to start instead, raise it yourself:
        ``if (error := await limiter.check_store()) is not None: raise error``.

        The check is a ``peek`` of one key, which charges and writes nothing.
        ``RateLimitMiddleware`` calls it when the server starts the app (ASGI lifespan ``startup``);
        call it yourself from your app's start-up otherwise.

        A store that cannot answer (a wrong password, an unreachable host, a TLS or permission
        problem) is logged once, at ERROR on the ``ratewarden`` logger, naming the store (password
        hidden) and what is wrong; nothing is raised: the limiter starts and follows its ``on_error``
        policy until the store answers. When nothing checked the store at start-up, the same line is
        logged at its first failed check instead. Either way it is logged once per limiter; further
        failures are the warnings of ``decide_without_store`` (one line a second at most). A local
        store (memory, shared memory) is not checked: it has nothing to reach.

        Args:
            timeout: Seconds to wait for the answer, on top of the store's own timeouts (default 5).
        """
        store = innermost(self.store)  # a Breaker's fallback or a metrics wrapper must not hide it
        if store.local:
            return None
        limits = self.limits("1/s")
        try:
            error = await probe_store(store, self.keys_for(STORE_CHECK_KEY, limits), limits, timeout)
        except NotImplementedError:  # a store of your own without peek: its first failure reports it
            log.debug("rate limit store %r cannot be checked at start-up (no peek)", store)
            return None
        if error is None:
            self._store_reported = True
            return None
        self._report_store(error, "failed its start-up check", store)
        return error

    def _report_store(self, error: StoreError, what: str, store: Store | None = None) -> None:
        """The one ERROR line about a store that does not answer (once per limiter)."""
        if self._store_reported:
            return
        self._store_reported = True
        name = repr(store if store is not None else self.store)
        message = str(error)
        if message.startswith(name + ": "):
            message = message[len(name) + 2:]
        policy = outage_policy(self.on_error, self.store, self.fallback)
        log.error(
            "rate limit store %s %s: %s; the store said: %s. The limiter runs anyway (on_error=%r): until the store "
            "answers, %s; further failures are logged as warnings, one line a second at most",
            name, what, store_problem(error), message.rstrip("."), self.on_error, policy,
        )

    def without_store(self) -> dict[str, int]:
        """How many checks this limiter decided without its store, by reason: the store failed
        (``timeout``: no reply in time; ``unreachable``: no connection; ``error``: an error or
        broken reply), of those how many the insurance limiter answered (``local_limiter``; the
        rest were let through under ``on_error="open"`` without a fallback, or refused under
        ``"closed"``), and the rejections the store answered from its local cache
        (``over_limit_cache``: the store's ``cached_rejections``, ``protocols.HealthReporting``)."""
        counts = dict(self._without)
        counts["over_limit_cache"] = cached_rejections(self.store)
        return counts

    async def hit(
        self, key: str, rate: RateSpec, cost: float = 1, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """Charge ``cost`` to ``key`` under every rate in ``rate``, all or nothing.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            cost: Units this request uses (default 1; 0 only reads).
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        return await self.check(*self._charge(key, rate, cost, algorithm, namespace))

    def _charge(
        self, key: str, rate: RateSpec, cost: float, algorithm: AlgorithmName, namespace: str
    ) -> tuple[list[str], tuple[Limit, ...], list[float]]:
        """What ``hit`` charges: the storage keys, their limits and their costs (``cost`` checked)."""
        _check_cost(cost)
        keys, limits = self._keys_under(key, rate, algorithm, namespace)
        return keys, limits, [cost] * len(limits)

    def _keys_under(
        self, key: str, rate: RateSpec, algorithm: AlgorithmName, namespace: str
    ) -> tuple[list[str], tuple[Limit, ...]]:
        """``key``'s storage keys under ``rate``'s limits, and those limits."""
        limits = self.limits(rate, algorithm)
        return self.keys_for(key, limits, namespace), limits

    async def peek(
        self, key: str, rate: RateSpec, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """What a request would see now, without charging anything.

        Args:
            key: Who is limited, as for ``hit``.
            rate: One rate or several, as for ``hit``.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, as for ``hit``.
        """
        decisions = await self.store.peek(*self._keys_under(key, rate, algorithm, namespace))
        return min(decisions, key=lambda d: d.remaining)

    async def reset(
        self, key: str, rate: RateSpec, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> None:
        """Forget ``key``'s state under these rates (in the insurance limiter too).

        Args:
            key: Whose state to forget, as for ``hit``.
            rate: The rates it was counted under, as for ``hit``.
            algorithm: The algorithm they were counted with (default ``"fixed_window"``).
            namespace: The namespace it was counted within, as for ``hit``.
        """
        keys, _ = self._keys_under(key, rate, algorithm, namespace)
        if self.fallback is not None:
            await self.fallback.reset(keys)
        ledger = _ledger_of(self.store)
        if ledger is not None:
            ledger.forget(keys)
        await self.store.reset(keys)

    async def clear(self) -> None:
        """Forget every key (e.g. between tests), the insurance limiter's too."""
        if self.fallback is not None:
            await self.fallback.clear()
        ledger = _ledger_of(self.store)
        if ledger is not None:
            ledger.forget()
        await self.store.clear()

    async def close(self) -> None:
        """Close the store (on the sync facade's loop if it used the store) and stop that loop."""
        if self._sync_loop.started:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.store.close(), self._sync_loop.start()))
            await asyncio.get_running_loop().run_in_executor(None, self._sync_loop.stop)
            return
        await self.store.close()

    # Sync facade, for threads and plain code. Every call runs the async one on one private
    # loop thread (remote stores keep their connections on that loop from call to call); a
    # local store's check needs no loop at all, as in ``check``.
    def hit_sync(
        self, key: str, rate: RateSpec, cost: float = 1, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """``hit`` for synchronous code: the same arguments, the same answer.

        Args:
            key: As for ``hit``.
            rate: As for ``hit``.
            cost: As for ``hit``.
            algorithm: As for ``hit``.
            namespace: As for ``hit``.
        """
        if self.store.local:  # answered at once, no loop
            decided = drive(self._hit_steps(*self._charge(key, rate, cost, algorithm, namespace)))
            assert isinstance(decided, Decision)
            return decided
        return self._sync_loop.run(self.hit(key, rate, cost, algorithm, namespace))

    def peek_sync(
        self, key: str, rate: RateSpec, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """``peek`` for synchronous code.

        Args:
            key: As for ``peek``.
            rate: As for ``peek``.
            algorithm: As for ``peek``.
            namespace: As for ``peek``.
        """
        return self._sync_loop.run(self.peek(key, rate, algorithm, namespace))

    def reset_sync(
        self, key: str, rate: RateSpec, algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> None:
        """``reset`` for synchronous code.

        Args:
            key: As for ``reset``.
            rate: As for ``reset``.
            algorithm: As for ``reset``.
            namespace: As for ``reset``.
        """
        self._sync_loop.run(self.reset(key, rate, algorithm, namespace))

    def clear_sync(self) -> None:
        self._sync_loop.run(self.clear())

    def close_sync(self) -> None:
        """Close the store and stop the sync facade's loop thread."""
        self._sync_loop.run(self.store.close())
        self._sync_loop.stop()


def _workers(workers: int | None) -> int:
    """``Limiter(workers=...)``, checked; ``None``: ``WEB_CONCURRENCY`` when it is a positive integer, else 1."""
    if workers is None:
        text = os.environ.get("WEB_CONCURRENCY", "").strip()
        return int(text) if text.isdigit() and int(text) > 0 else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers must be a positive integer (the processes sharing the store), got {workers!r}")
    return workers


def _ledger_of(store: Store) -> Ledger | None:
    """The ledger of the store behind ``store``'s wrappers, if it keeps one (``RedisStore``, ``MemcachedStore``)."""
    ledger = getattr(innermost(store), "ledger", None)
    return ledger if isinstance(ledger, Ledger) else None


def _check_cost(cost: float) -> None:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise TypeError(f"cost must be a number, got {type(cost).__name__} {cost!r}")
    if not 0 <= cost < math.inf:
        raise ArgumentError(f"cost must be zero or positive, got {cost!r}")
