"""``Limiter``: the entry point that turns (key, rates) into decisions on a store."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from ._mypyc import mypyc_attr
from .algorithms import AlgorithmName
from .caches import remember
from .decision import Decision
from .errors import ConfigurationError
from .limits import DEFAULT_ALGORITHM, Limit, make_limits
from .loop_thread import LoopThread
from .rates import Rate, freeze_rates
from .stores.base import Store, StoreError, failure_reason
from .stores.memory import MemoryStore

__all__ = [
    "WITHOUT_STORE_REASONS", "FailurePolicy", "Fallback", "Limiter", "safe_key", "storage_key", "store_problem",
    "without_store_totals",
]

log = logging.getLogger("ratewarden")

FailurePolicy = Literal["open", "closed"]
#: ``Limiter(fallback=...)``: a local store, ``"local"`` (a new ``MemoryStore`` of the limiter's
#: own) or ``None`` (no insurance limiter: a failed check is not decided).
Fallback = Store | Literal["local"] | None
MAX_KEY_LENGTH = 200
#: Why a check was decided without the store (``Limiter.without_store``): the store's failure
#: (``timeout``, ``unreachable``, ``error``), who answered it instead (``local_limiter``), or
#: the store's own cache of rejections (``over_limit_cache``, read from ``Store.cached_rejections``).
WITHOUT_STORE_REASONS = ("timeout", "unreachable", "error", "local_limiter", "over_limit_cache")
_FAILURE_REASONS = ("timeout", "unreachable", "error")
_LABELS = {"timeout": "timeout", "unreachable": "unreachable", "error": "error", "local_limiter": "local limiter",
           "over_limit_cache": "over-limit cache"}
#: A failed check this long (seconds) after the previous failed one starts a new outage: the
#: limiter's own insurance limiter starts it with no counts.
OUTAGE_GAP = 60.0
#: Seconds between two log lines about checks decided without the store (per limiter).
LOG_INTERVAL = 1.0
#: What ``Limiter.check_store`` reads (a peek of this key: nothing is written), and how long it waits.
STORE_CHECK_KEY = "ratewarden-store-check"
STORE_CHECK_TIMEOUT = 5.0
# Every limiter of this process (``ratewarden_checks_without_store_total`` in ``Metrics``).
_totals: dict[str, int] = dict.fromkeys((*_FAILURE_REASONS, "local_limiter"), 0)


def without_store_totals() -> dict[str, int]:
    """``Limiter.without_store`` summed over every limiter of this process, without
    ``over_limit_cache`` (a count of the stores: ``Metrics`` reads it from the stores it watches)."""
    return dict(_totals)


def cached_rejections(store: Store) -> int:
    """``store.cached_rejections``, looking through wrappers (``Breaker``, ``Metrics.instrument``).

    Args:
        store: The limiter's store, wrapped or not.
    """
    for _ in range(8):  # wrappers of wrappers, bounded
        count = int(getattr(store, "cached_rejections", 0))
        if count:
            return count
        inner = getattr(store, "inner", None) or getattr(store, "store", None)
        if not isinstance(inner, Store):
            return 0
        store = inner
    return 0


def safe_key(key: str) -> str:
    """``key`` itself, or its hash when it is over-long or holds braces (which would break the
    Redis Cluster hash tag), so whatever a client sends stays bounded.

    Args:
        key: The key a client sent.
    """
    if len(key) > MAX_KEY_LENGTH or "}" in key or "{" in key:
        return "h." + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return key


def storage_key(prefix: str, namespace: str, key: str, suffix: str = "") -> str:
    """``prefix:{namespace|key}:suffix``, the one place storage keys are built (the limiter, compiled
    rules and bans all call it, so ``Limiter.reset`` reaches what a rule charged). The braces are
    a Redis Cluster hash tag, so every limit of one (namespace, key) shares a slot; braces in
    ``namespace`` (route templates such as ``/items/{item_id}``) become parentheses so they cannot cut
    the tag short.

    Args:
        prefix: The limiter's prefix.
        namespace: What the key is counted within (a route template, a rule name), or ``""``.
        key: Who is limited (passed through ``safe_key``).
        suffix: Which limit: ``Limit.suffix``; ``""`` for none (bans).
    """
    if "{" in namespace or "}" in namespace:
        namespace = namespace.replace("{", "(").replace("}", ")")
    base = f"{prefix}:{{{namespace}|{safe_key(key)}}}"
    return f"{base}:{suffix}" if suffix else base


@mypyc_attr(allow_interpreted_subclasses=True)
class Limiter:
    """Checks keys against rates on a store.

    Args:
        store: Where the counts live; the default ``None`` is a new ``MemoryStore()``.
        prefix: Prepended to every storage key, so several limiters can share a store.
        on_error: What happens when the store (or a key function) fails: ``"open"`` (the default) decides
            the check with ``fallback`` (a key function's failure, or no fallback: lets the request
            through) and logs; ``"closed"`` answers 503 (``Limiter.hit`` raises ``StoreError``).
        enabled: ``False`` turns every integration into a pass-through (e.g. in tests).
        fallback: The insurance limiter: under ``on_error="open"``, a check the store fails
            (``StoreError``) is decided by this local store instead, with the same keys, limits and
            costs, so an outage limits per process instead of not at all. ``"local"`` (the default)
            is a ``MemoryStore()`` of this limiter's own (none for a store that is itself local);
            ``None`` lets such checks through unchecked (``Limiter.hit`` raises the ``StoreError``).
            Its counts are never copied to the store: once the store answers, it decides again.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        prefix: str = "rw",
        on_error: FailurePolicy = "open",
        enabled: bool = True,
        fallback: Fallback = "local",
    ) -> None:
        if on_error not in ("open", "closed"):
            raise ConfigurationError(f"on_error must be 'open' or 'closed', got {on_error!r}")
        if store is not None and not isinstance(store, Store):
            # The compiled build's own argument check raises first ("...Store or None object
            # expected; got str"): both reject it here, at construction, naming its type.
            raise TypeError(
                f"store must be a ratewarden Store or None (e.g. MemoryStore(), RedisStore(url)), "
                f"got {_type_name(store)}: {store!r}"
            )
        self.store: Store = store if store is not None else MemoryStore()
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
            self._owns_fallback = not self.store.local
            self.fallback = MemoryStore() if self._owns_fallback else None
        elif isinstance(fallback, Store):
            fallback.require("local", "Limiter(fallback=...)")
            self.fallback = fallback
        elif fallback is not None:
            raise TypeError(
                f"fallback must be a local store (e.g. MemoryStore()), 'local' or None, got {_type_name(fallback)}: {fallback!r}"
            )
        # Checks decided without the store: by reason (``without_store``), and what was logged.
        self._without: dict[str, int] = dict.fromkeys((*_FAILURE_REASONS, "local_limiter"), 0)
        self._logged: dict[str, int] = dict(self._without)
        self._logged_cached = 0
        self._logged_at = -math.inf  # monotonic time of the last line
        self._batch_start = -1.0  # the first failure not logged yet (-1: none)
        self._last_failure = -math.inf
        # The store's health was reported (``check_store``, or the first failure without one): the
        # ERROR line is logged once per limiter; later failures are the warnings of ``_log_without_store``.
        self._store_reported = False

    def limits(self, rates: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM) -> tuple[Limit, ...]:
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
        store = self.store
        try:
            if store.local:
                return store.hit_now(keys, limits, costs)
            return await store.hit(keys, limits, costs)
        except StoreError as exc:
            decision = self.decide_without_store(exc, keys, limits, costs)
            if decision is None:
                raise
            return decision

    def decide_without_store(
        self, error: StoreError, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Decision | None:
        """A check the store failed: counted by ``error.reason`` (``without_store``), logged (at
        most once a second, with the count since the last line) and, under ``on_error="open"``,
        decided by the insurance limiter (``fallback``). ``None`` when nothing decided it (no
        fallback, or fail-closed): the caller applies ``on_error``. Every integration's check
        calls it when the store raises ``StoreError``; it runs only then.

        Args:
            error: What the store raised.
            keys: The check's storage keys.
            limits: The limit checked on each key.
            costs: What the request costs under each limit.
        """
        if not self._store_reported:  # nothing checked the store at start-up: this is the first word of it
            self._report_store(error, "failed a check, its first failure (nothing checked it at start-up)")
        reason = error.reason if error.reason in _FAILURE_REASONS else "error"
        self._without[reason] += 1
        _totals[reason] += 1
        now = time.monotonic()
        if now - self._last_failure >= OUTAGE_GAP and self._owns_fallback:
            self.fallback = MemoryStore()  # a new outage: nothing carried over from the last one
        self._last_failure = now
        if self._batch_start < 0:
            self._batch_start = now
        decision: Decision | None = None
        fallback = self.fallback
        if fallback is not None and self.on_error == "open":
            try:
                decision = fallback.hit_now(keys, limits, costs)
            except Exception as exc:  # the insurance limiter cannot decide either: as without one
                log.warning("insurance limiter failed: %s: %s", type(exc).__name__, exc)
            else:
                self._without["local_limiter"] += 1
                _totals["local_limiter"] += 1
        if now - self._logged_at >= LOG_INTERVAL:
            self._log_without_store(now, error)
        return decision

    def _log_without_store(self, now: float, error: StoreError) -> None:
        """One line for the checks decided without the store since the last line."""
        counts = self._without
        logged = self._logged
        cached = cached_rejections(self.store)
        since = {reason: counts[reason] - logged[reason] for reason in counts}
        since["over_limit_cache"] = max(0, cached - self._logged_cached)
        total = sum(since[reason] for reason in _FAILURE_REASONS) + since["over_limit_cache"]
        detail = ", ".join(f"{_LABELS[reason]}: {since[reason]:,}" for reason in WITHOUT_STORE_REASONS if since[reason])
        name = repr(self.store)
        message = str(error)
        message = message[len(name) + 2:] if message.startswith(name + ": ") else f"{type(error).__name__}: {message}"
        log.warning(
            "rate limit check failed: %s: %s %s decided without the store in the last %.1f s (%s): %s",
            name, f"{total:,}", "check" if total == 1 else "checks", now - self._batch_start, detail, message,
        )
        self._logged = dict(counts)
        self._logged_cached = cached
        self._logged_at = now
        self._batch_start = -1.0

    async def check_store(self, timeout: float = STORE_CHECK_TIMEOUT) -> StoreError | None:
        """Ask the store once, at start-up, whether it answers: a ``peek`` of one key, which charges
        and writes nothing. ``RateLimitMiddleware`` calls it when the server starts the app (ASGI
        lifespan ``startup``); call it yourself from your app's start-up otherwise.

        A store that cannot answer (a wrong password, an unreachable host, a TLS or permission
        problem) is logged once, at ERROR on the ``ratewarden`` logger, naming the store (password
        hidden) and what is wrong; nothing is raised: the limiter starts and follows its ``on_error``
        policy until the store answers. When nothing checked the store at start-up, the same line is
        logged at its first failed check instead. Either way it is logged once per limiter; further
        failures are the warnings of ``decide_without_store`` (one line a second at most). A local
        store (memory, shared memory) is not checked: it has nothing to reach.

        Returns the ``StoreError`` when the check failed, else ``None``.

        Args:
            timeout: Seconds to wait for the answer, on top of the store's own timeouts (default 5).
        """
        store = _innermost(self.store)  # a Breaker's fallback or a metrics wrapper must not hide it
        if store.local:
            return None
        limits = self.limits("1/s")
        error: StoreError
        started = time.monotonic()
        try:
            await asyncio.wait_for(store.peek(self.keys_for(STORE_CHECK_KEY, limits), limits), timeout)
        except StoreError as exc:
            error = exc
        except asyncio.TimeoutError:
            error = StoreError(f"{store!r}: start-up check: no reply within {timeout:g} s", reason="timeout")
        except NotImplementedError:  # a store of your own without peek: its first failure reports it
            log.debug("rate limit store %r cannot be checked at start-up (no peek)", store)
            return None
        except Exception as exc:  # a store that cannot even be asked: reported all the same
            error = StoreError(f"{store!r}: start-up check: {type(exc).__name__}: {exc}", reason=failure_reason(exc))
            error.__cause__ = exc
        else:
            self._store_reported = True
            log.debug("rate limit store %r answered its start-up check in %.1f ms", store, (time.monotonic() - started) * 1000)
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
        if self.on_error == "closed":
            policy = "the requests its limits apply to get 503 (Limiter.hit raises StoreError)"
        elif isinstance(getattr(self.store, "fallback", None), Store):
            policy = "checks are decided by the fallback store of the Breaker around it (each process counts alone)"
        elif self.fallback is not None:
            policy = "checks are decided by the insurance limiter (each process counts alone)"
        else:
            policy = "the requests its limits apply to are let through unchecked (Limiter.hit raises StoreError)"
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
        (``over_limit_cache``: ``Store.cached_rejections``)."""
        counts = dict(self._without)
        counts["over_limit_cache"] = cached_rejections(self.store)
        return counts

    async def hit(
        self,
        key: str,
        rate: str | Rate | Iterable[str | Rate],
        cost: float = 1,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        namespace: str = "",
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
        _check_cost(cost)
        limits = self.limits(rate, algorithm)
        return await self.check(self.keys_for(key, limits, namespace), limits, [cost] * len(limits))

    async def peek(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """What a request would see now, without charging anything.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        limits = self.limits(rate, algorithm)
        decisions = await self.store.peek(self.keys_for(key, limits, namespace), limits)
        return min(decisions, key=lambda d: d.remaining)

    async def reset(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> None:
        """Forget ``key``'s state under these rates (in the insurance limiter too).

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        limits = self.limits(rate, algorithm)
        keys = self.keys_for(key, limits, namespace)
        if self.fallback is not None:
            await self.fallback.reset(keys)
        await self.store.reset(keys)

    async def clear(self) -> None:
        """Forget every key (e.g. between tests), the insurance limiter's too."""
        if self.fallback is not None:
            await self.fallback.clear()
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
        self,
        key: str,
        rate: str | Rate | Iterable[str | Rate],
        cost: float = 1,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        namespace: str = "",
    ) -> Decision:
        """``hit`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            cost: Units this request uses (default 1).
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        if self.store.local:
            _check_cost(cost)
            limits = self.limits(rate, algorithm)
            keys = self.keys_for(key, limits, namespace)
            costs = [cost] * len(limits)
            try:
                return self.store.hit_now(keys, limits, costs)
            except StoreError as exc:
                decision = self.decide_without_store(exc, keys, limits, costs)
                if decision is None:
                    raise
                return decision
        return self._sync_loop.run(self.hit(key, rate, cost, algorithm, namespace))

    def peek_sync(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> Decision:
        """``peek`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        return self._sync_loop.run(self.peek(key, rate, algorithm, namespace))

    def reset_sync(
        self, key: str, rate: str | Rate | Iterable[str | Rate], algorithm: AlgorithmName = DEFAULT_ALGORITHM, namespace: str = ""
    ) -> None:
        """``reset`` for synchronous code.

        Args:
            key: Who is limited: a client IP, an API key, a user id.
            rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
                every one must allow.
            algorithm: The algorithm's name (default ``"fixed_window"``).
            namespace: What the key is counted within, e.g. a route; the default ``""`` shares one
                count for ``key`` across namespaces.
        """
        self._sync_loop.run(self.reset(key, rate, algorithm, namespace))

    def clear_sync(self) -> None:
        self._sync_loop.run(self.clear())

    def close_sync(self) -> None:
        """Close the store and stop the sync facade's loop thread."""
        self._sync_loop.run(self.store.close())
        self._sync_loop.stop()


def store_problem(error: BaseException) -> str:
    """What is wrong with a store, in words, from a ``StoreError`` and the client errors it wraps:
    authentication, permission, TLS, host name, unreachable, timeout, or an error reply.

    Args:
        error: What the store raised.
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < 8 and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    names = {kind.__name__ for exc in chain for kind in type(exc).__mro__}
    text = " ".join(str(exc) for exc in chain)
    if any(n.startswith("Authentication") for n in names) or any(
        word in text for word in ("WRONGPASS", "NOAUTH", "invalid username-password", "Authentication required")
    ):
        return "authentication failed (wrong or missing password or user name)"
    if "NOPERM" in text or "NoPermissionError" in names:
        return "permission denied (the user may not run the commands a check needs: ACL rules)"
    if "SSLError" in names or "SSLCertVerificationError" in names:
        return "TLS failed (certificate, CA or TLS settings)"
    if "gaierror" in names:
        return "host name not found (DNS)"
    reason = error.reason if isinstance(error, StoreError) else failure_reason(error)
    if reason == "unreachable":
        return "unreachable (connection refused, reset or closed: is the server running, are host and port right?)"
    if reason == "timeout":
        return "no reply in time (the server is down, paused, overloaded, or unreachable through a firewall)"
    return "the store answered with an error"


def _innermost(store: Store) -> Store:
    """The store behind wrappers (``Breaker``, ``Metrics.instrument``), as ``cached_rejections`` finds it."""
    for _ in range(8):
        inner = getattr(store, "inner", None)
        if inner is None:
            inner = getattr(store, "store", None)
        if not isinstance(inner, Store):
            return store
        store = inner
    return store


def _type_name(value: object) -> str:
    """``str``, ``abc.ABCMeta``: a type's name as the compiled build's argument checks print it."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_cost(cost: float) -> None:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise TypeError(f"cost must be a number, got {type(cost).__name__} {cost!r}")
    if not 0 <= cost < math.inf:
        raise ValueError(f"cost must be zero or positive, got {cost!r}")
