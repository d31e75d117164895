"""Metrics: Prometheus counters (extra ``metrics``) and OpenTelemetry instruments (when the SDK is
installed), labelled by rule and group only, never by client key, so cardinality stays bounded by
the policy.

``Metrics.observe`` records one checked request; ``Metrics.instrument(store)`` wraps a store to
time it and count its errors. Rejections a store answers from its local cache (``RedisStore``
counts them in ``store.cached_rejections``) are read from the watched stores at scrape time, so
the hot path pays nothing for that metric. Checks decided without the store (its failures, the
insurance limiter's answers, those rejections) are ``ratewarden_checks_without_store_total{reason}``.
"""

from __future__ import annotations

import importlib.util
import logging
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from .decision import Decision
from .errors import ConfigurationError
from .limits import Limit
from .store_health import innermost
from .stores.adapted import as_store
from .stores.base import BlockingOperation, Capability, Store
from .stores.protocols import AsyncStore, HealthReporting

__all__ = ["InstrumentedStore", "Metrics"]

log = logging.getLogger("ratewarden.metrics")

_MAX_LABEL_VALUES = 1000
_OVERFLOW_LABEL = "other"
_SERIES_LIMIT = 4096  # remembered (counter, rule, group) children in Metrics.observe (cleared when full)


class _CachedRejections:
    """A Prometheus collector reading ``cached_rejections`` from the watched stores when scraped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stores: weakref.WeakSet[HealthReporting] = weakref.WeakSet()

    def _family(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily(
            self.name, "Rejections a store answered from its local cache, without a round trip", labels=["store"]
        )

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        family = self._family()
        totals: dict[str, float] = {}
        for store in list(self.stores):
            name = type(store).__name__
            totals[name] = totals.get(name, 0.0) + float(store.cached_rejections)
        for name, total in sorted(totals.items()):
            family.add_metric([name], total)
        yield family


class _CheckFailures:
    """A Prometheus collector reading the process's failed checks (``enforcement.failure_counts``)
    when scraped: every fail-open or fail-closed check, whether a store or a key function failed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _family(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily(
            self.name, "Rate limit checks that failed (store or key function), by what failed", labels=["what", "error"]
        )

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        from .enforcement.core import failure_counts

        family = self._family()
        for (what, error), count in sorted(failure_counts().items()):
            family.add_metric([what, error], float(count))
        yield family


class _WithoutStore:
    """A Prometheus collector of the checks decided without the store, by reason, read when
    scraped: every limiter's failed checks (``limiter.without_store_totals``: ``timeout``,
    ``unreachable``, ``error``, and of those ``local_limiter``, answered by the insurance limiter)
    and the watched stores' rejection caches (``over_limit_cache``)."""

    def __init__(self, name: str, cached: _CachedRejections) -> None:
        self.name = name
        self.cached = cached

    def _family(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily(
            self.name,
            "Rate limit checks decided without the store, by reason (its failure, the local insurance limiter,"
            " the store's cache of rejections)",
            labels=["reason"],
        )

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        from .limiter import WITHOUT_STORE_REASONS, without_store_totals

        family = self._family()
        counts = without_store_totals()
        counts["over_limit_cache"] = sum(int(getattr(s, "cached_rejections", 0)) for s in list(self.cached.stores))
        for reason in WITHOUT_STORE_REASONS:
            family.add_metric([reason], float(counts.get(reason, 0)))
        yield family


class _Labels:
    """Caps the distinct values of a label: past ``limit``, new values are reported as "other"."""

    def __init__(self, limit: int = _MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit:
            return _OVERFLOW_LABEL
        self.seen.add(value)
        return value


class Metrics:
    """Request, decision and store metrics.

    Args:
        registry: The Prometheus registry to register in; the default ``None`` is a private
            ``CollectorRegistry`` (pass ``prometheus_client.REGISTRY`` for the global one).
        namespace: The metric names' prefix.
        near_ratio: An allowed request counts as near the limit when it leaves at most ``1 - near_ratio``
            of the limit (default 0.8: 80 % used).
        otel: Also record OpenTelemetry instruments; the default ``None`` means when ``opentelemetry.sdk``
            is importable.
    """

    def __init__(
        self,
        registry: Any = None,
        *,
        namespace: str = "ratewarden",
        near_ratio: float = 0.8,
        otel: bool | None = None,
    ) -> None:
        try:
            import prometheus_client as prom
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError("ratewarden metrics need prometheus-client: pip install 'ratewarden[metrics]'") from None
        if not 0 < near_ratio <= 1:
            raise ConfigurationError(f"near_ratio must be in (0, 1], got {near_ratio!r}")
        self.near_ratio = near_ratio
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        labels = ("rule", "group")

        def counter(name: str, doc: str, names: Sequence[str] = labels) -> Any:
            return prom.Counter(name, doc, names, namespace=namespace, registry=self.registry)

        self.checked = counter("requests_checked", "Requests checked against a limit")
        self.allowed = counter("requests_allowed", "Requests allowed")
        self.limited = counter("requests_limited", "Requests rejected by a limit")
        self.shadow_limited = counter("requests_shadow_limited", "Requests over a limit but allowed (shadow mode)")
        self.near_limit = counter("requests_near_limit", "Allowed requests that used most of their limit")
        self.delayed = counter("requests_delayed", "Requests that waited for their turn instead of being rejected")
        self.banned = counter("requests_banned", "Requests refused because the client is banned", ("status",))
        self._cached = _CachedRejections(f"{namespace}_cached_rejections")
        self.registry.register(self._cached)
        self.registry.register(_CheckFailures(f"{namespace}_check_failures"))
        self.registry.register(_WithoutStore(f"{namespace}_checks_without_store", self._cached))
        self.store_errors = counter("store_errors", "Store operations that failed", ("store", "operation"))
        self.store_latency = prom.Histogram(
            "store_latency_seconds",
            "Store operation latency",
            ("store", "operation"),
            namespace=namespace,
            registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self._rule_label = _Labels()
        self._group_label = _Labels()
        self._series: dict[tuple[Any, str, str], Any] = {}
        self._otel: dict[str, Any] | None = None
        if otel or (otel is None and _importable("opentelemetry.sdk")):
            self._otel = _otel_instruments(namespace)

    def watch(self, store: Store) -> None:
        """Report ``store``'s local-cache rejections (``ratewarden_cached_rejections_total{store}``).
        Wrappers (``instrument``, ``Breaker``) are looked through; local stores (no cache) are ignored.

        Args:
            store: The limiter's store, wrapped or not.
        """
        store = innermost(store)
        if isinstance(store, HealthReporting):  # a store that keeps no cache of its rejections has no count
            self._cached.stores.add(store)

    def close(self) -> None:
        """Stop reporting the watched stores."""
        self._cached.stores.clear()

    def _labels(self, rule: str, group: str) -> tuple[str, str]:
        return self._rule_label(rule), self._group_label(group)

    def observe(self, rule: str, group: str, decision: Decision, *, shadow: bool = False) -> None:
        """Count one checked request and what was decided.

        Args:
            rule: The rule's name (a label).
            group: The client's group (a label; ``""`` without tiers).
            decision: What the check decided.
            shadow: Whether the rule only observes (shadow mode): a denial is counted, not enforced.
        """
        series = self._labelled
        series(self.checked, rule, group).inc()
        if not decision.allowed:
            series(self.shadow_limited if shadow else self.limited, rule, group).inc()
            if shadow:
                series(self.allowed, rule, group).inc()
            self._otel_add("limited" if not shadow else "shadow_limited", rule, group)
            return
        series(self.allowed, rule, group).inc()
        if decision.limit and decision.limit - decision.remaining >= self.near_ratio * decision.limit:
            series(self.near_limit, rule, group).inc()
            self._otel_add("near_limit", rule, group)
        self._otel_add("allowed", rule, group)

    def _labelled(self, counter: Any, rule: str, group: str) -> Any:
        """``counter``'s series for ``rule`` and ``group`` (labels capped), remembered: ``labels()``
        takes a lock and checks its arguments on every call, the costliest part of ``observe``. A
        series is made when first counted, as without the memo, so ``/metrics`` shows the same."""
        key = (counter, rule, group)
        found = self._series.get(key)
        if found is None:
            found = counter.labels(*self._labels(rule, group))
            if len(self._series) >= _SERIES_LIMIT:
                self._series.clear()
            self._series[key] = found
        return found

    def observe_delayed(self, rule: str, group: str) -> None:
        """Count one request that waited (``delay``) and was then served.

        Args:
            rule: The rule's name (a label).
            group: The client's group (a label).
        """
        self.delayed.labels(*self._labels(rule, group)).inc()

    def observe_shadow_rule(self, decision: Decision) -> None:
        """Count a shadow rule's decision (labelled by its policy name) if it would have denied.

        Args:
            decision: The shadow rule's decision.
        """
        if not decision.allowed:
            self.shadow_limited.labels(*self._labels(decision.policy, "")).inc()

    def observe_banned(self, status: int) -> None:
        """Count one request refused by a ban.

        Args:
            status: The status it was answered with (403 or 429).
        """
        self.banned.labels(str(status)).inc()

    def _otel_add(self, what: str, rule: str, group: str) -> None:
        if self._otel is not None:
            labels = self._labels(rule, group)
            self._otel[what].add(1, {"rule": labels[0], "group": labels[1]})

    def instrument(self, store: Store | AsyncStore) -> InstrumentedStore:
        """``store`` wrapped so each operation is timed and its failures counted (and its
        cached rejections reported).

        Args:
            store: The store to measure (a ``Store``, or a store of your own: ``protocols.AsyncStore``).
        """
        wrapped = InstrumentedStore(store, self)
        self.watch(wrapped.inner)
        return wrapped

    def asgi_app(self) -> Any:
        """An ASGI app serving this registry in the Prometheus text format (mount at ``/metrics``)."""
        import prometheus_client

        return prometheus_client.make_asgi_app(registry=self.registry)

    def exposition(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        import prometheus_client

        return bytes(prometheus_client.generate_latest(self.registry))


def _importable(name: str) -> bool:
    """Whether ``name`` can be imported; ``find_spec`` of a submodule raises when its parent is missing."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _otel_instruments(namespace: str) -> dict[str, Any] | None:
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError:
        return None
    meter = otel_metrics.get_meter("ratewarden")
    return {
        what: meter.create_counter(f"{namespace}.requests.{what}", description=f"Requests {what.replace('_', ' ')}")
        for what in ("allowed", "limited", "shadow_limited", "near_limit")
    }


class InstrumentedStore(Store):
    """A store wrapper that records latency and errors of every operation in ``Metrics``; it
    answers for what it wraps (``local``, ``supports``, ``can_block``).

    Args:
        inner: The store whose operations are measured (adapted when it is not a ``Store``).
        metrics: Where the measurements go.
    """

    def __init__(self, inner: Store | AsyncStore, metrics: Metrics) -> None:
        self.inner = as_store(inner)
        self.metrics = metrics
        name = type(self.inner).__name__
        self._hit_latency = metrics.store_latency.labels(name, "hit")
        self._peek_latency = metrics.store_latency.labels(name, "peek")
        self._name = name

    @property
    def local(self) -> bool:  # type: ignore[override]  # as local as the wrapped store
        return self.inner.local

    def supports(self, capability: Capability) -> bool:
        return self.inner.supports(capability)

    def can_block(self, *operations: BlockingOperation) -> bool:
        return self.inner.can_block(*operations)

    # A Store's *_now methods are its blocking ones (its own, on a local store): timed there.
    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.hit_now(keys, limits, costs)

    def peek_blocking(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.peek_now(keys, limits)

    def reset_blocking(self, keys: Sequence[str]) -> None:
        self.inner.reset_blocking(keys)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        return self.inner.adjust_blocking(keys, limits, amounts)

    def peek_now(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        with _Timed(self, "peek", self._peek_latency):
            return self.inner.peek_now(keys, limits)

    def _error(self, operation: str, exc: BaseException) -> None:
        self.metrics.store_errors.labels(self._name, operation).inc()
        log.warning("store_error store=%s operation=%s error=%s: %s", self._name, operation, type(exc).__name__, exc)

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        with _Timed(self, "hit", self._hit_latency):
            return await self.inner.hit(keys, limits, costs)

    def hit_now(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        with _Timed(self, "hit", self._hit_latency):
            return self.inner.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        with _Timed(self, "peek", self._peek_latency):
            return await self.inner.peek(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        await self.inner.reset(keys)

    async def clear(self) -> None:
        await self.inner.clear()

    async def close(self) -> None:
        await self.inner.close()

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], amounts: Sequence[float]) -> list[Decision]:
        from .charges import adjust

        return await adjust(self.inner, keys, limits, amounts)


class _Timed:
    """Times one call of an ``InstrumentedStore`` into ``latency`` and counts its failure, for the
    async and the synchronous methods alike."""

    __slots__ = ("latency", "operation", "start", "store")

    def __init__(self, store: InstrumentedStore, operation: str, latency: Any) -> None:
        self.store = store
        self.operation = operation
        self.latency = latency
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.latency.observe(time.perf_counter() - self.start)
        if isinstance(exc, Exception):
            self.store._error(self.operation, exc)
