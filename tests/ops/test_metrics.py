"""The metrics endpoint exposes the counters with the right values, labelled by rule and group."""

from __future__ import annotations

import re
import uuid
from collections import Counter

from starlette.applications import Starlette
from starlette.routing import Mount

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.keys import header
from ratewarden.metrics import Metrics
from ratewarden.policy import PolicyMiddleware, parse_policy
from tests.servers import RedisStandalone

from ..policy.apps import build_app, client, tiered_policy


def _value(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    assert match, f"{name}{{{wanted}}} missing"
    return float(match.group(1))


async def test_metrics_endpoint_counts() -> None:
    metrics = Metrics(near_ratio=0.8)
    store = metrics.instrument(MemoryStore())
    inner = build_app()
    app = PolicyMiddleware(inner, Limiter(store), policy=parse_policy(tiered_policy(basic=5, standard=20)), metrics=metrics)
    outer = Starlette(routes=[Mount("/metrics", metrics.asgi_app()), Mount("/", app)])
    async with client(outer) as http:
        for _ in range(7):
            await http.get("/api/x", headers={"X-API-Key": "trial-1"})
        for _ in range(3):
            await http.get("/api/x", headers={"X-API-Key": "sk-standard"})
        text = (await http.get("/metrics/")).text
    assert _value(text, "ratewarden_requests_checked_total", rule="api.basic", group="basic") == 7
    assert _value(text, "ratewarden_requests_allowed_total", rule="api.basic", group="basic") == 5
    assert _value(text, "ratewarden_requests_limited_total", rule="api.basic", group="basic") == 2
    # 80 % of 5 used: the 4th and 5th requests.
    assert _value(text, "ratewarden_requests_near_limit_total", rule="api.basic", group="basic") == 2
    assert _value(text, "ratewarden_requests_allowed_total", rule="api.standard", group="standard") == 3
    assert "ratewarden_requests_near_limit_total{group=\"standard\"" not in text
    assert "ratewarden_cached_rejections_total{" not in text  # the memory store has no rejection cache
    assert _value(text, "ratewarden_store_latency_seconds_count", store="MemoryStore", operation="hit") == 10
    # Never a raw key in a label.
    assert "trial-1" not in text and "sk-standard" not in text
    metrics.close()


async def test_label_cardinality_is_bounded() -> None:
    metrics = Metrics()
    from ratewarden.decision import Decision

    for i in range(1100):
        metrics.observe(f"rule-{i}", "g", Decision(True, 10, 9, 1.0, 0.0))
    text = metrics.exposition().decode()
    assert _value(text, "ratewarden_requests_checked_total", rule="other", group="g") == 100
    metrics.close()


async def test_store_errors_are_counted() -> None:
    from ratewarden.stores.base import Store, StoreError

    class Broken(MemoryStore):
        local = False

        async def hit(self, keys, limits, costs):  # type: ignore[no-untyped-def]
            raise StoreError("down")

    metrics = Metrics()
    app = PolicyMiddleware(build_app(), Limiter(metrics.instrument(Broken())), policy=parse_policy(tiered_policy()))
    async with client(app) as http:
        statuses = [(await http.get("/api/x", headers={"X-API-Key": "trial-1"})).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]  # fail open
    assert _value(metrics.exposition().decode(), "ratewarden_store_errors_total", store="Broken", operation="hit") == 3
    assert isinstance(Broken(), Store)
    metrics.close()


async def test_cached_rejections_are_read_from_a_real_redis_store(redis_standalone: RedisStandalone) -> None:
    """Rejections the Redis store answers from its local cache show up at scrape time, wrapped
    in ``instrument`` or not, with nothing recorded on the request path."""
    from ratewarden.stores.redis import RedisStore

    prefix = f"rwmet{uuid.uuid4().hex[:8]}"
    metrics = Metrics()
    store = RedisStore(redis_standalone.url, timeout=5, prefix=prefix)
    rules = [Rule("/api/**", "2/hour", key=header("X-Client"), name="api")]
    app = PolicyMiddleware(build_app(), Limiter(metrics.instrument(store), prefix=prefix), rules, metrics=metrics)
    outer = Starlette(routes=[Mount("/metrics", metrics.asgi_app()), Mount("/", app)])
    try:
        async with client(outer) as http:
            statuses = Counter([(await http.get("/api/x", headers={"X-Client": "c"})).status_code for _ in range(9)])
            text = (await http.get("/metrics/")).text
        assert statuses == {200: 2, 429: 7}
        # The first rejection went to Redis; the six after it were answered from the cache.
        assert store.cached_rejections == 6
        assert _value(text, "ratewarden_cached_rejections_total", store="RedisStore") == 6
        assert _value(text, "ratewarden_requests_limited_total", rule="api", group="") == 7
        assert _value(text, "ratewarden_store_latency_seconds_count", store="RedisStore", operation="hit") == 9
        # A second store of the same kind adds to the same series; closing stops the reporting.
        other = RedisStore(redis_standalone.url, timeout=5, prefix=prefix, cache=True)
        other.cached_rejections = 4
        metrics.watch(other)
        assert _value(metrics.exposition().decode(), "ratewarden_cached_rejections_total", store="RedisStore") == 10
        await other.close()
        metrics.close()
        assert "ratewarden_cached_rejections_total{" not in metrics.exposition().decode()
    finally:
        await store.clear()
        await store.close()
