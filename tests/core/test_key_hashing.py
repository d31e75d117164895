"""Header and query keys are hashed by default, as ``bearer_token()`` always was.

Regression: ``header("X-API-Key")`` and ``query_param("api_key")`` put the raw value in the
storage key unless ``hashed=True`` was passed, so API keys sat in Redis in plain text.
"""

from __future__ import annotations

from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.keys import header, query_param
from tests.core.asgi import http_scope, request
from tests.policy.apps import build_app
from tests.vectors.runner import FakeClock

SECRET = "sk-live-Secret-0123"


def _scope(headers: list[tuple[str, str]] = [], query: str = "") -> dict[str, Any]:  # noqa: B006
    return http_scope("/api/x", headers=headers, query=query, client=("198.51.100.7", 1))


def test_header_and_query_keys_do_not_contain_the_value() -> None:
    by_header = header("X-API-Key")(_scope([("x-api-key", SECRET)]))
    by_query = query_param("api_key")(_scope(query=f"api_key={SECRET}"))
    assert isinstance(by_header, str) and by_header.startswith("x-api-key:") and SECRET not in by_header
    assert isinstance(by_query, str) and by_query.startswith("q.api_key:") and SECRET not in by_query
    # Still one key per value, and the same one every time.
    assert header("X-API-Key")(_scope([("x-api-key", SECRET)])) == by_header
    assert header("X-API-Key")(_scope([("x-api-key", SECRET + "x")])) != by_header
    assert query_param("api_key")(_scope(query=f"api_key={SECRET}x")) != by_query
    # The digest is the one hashed=True always gave: such limits keep their counters.
    assert header("X-API-Key", hashed=True)(_scope([("x-api-key", SECRET)])) == by_header


@pytest.mark.parametrize(
    ("make", "sent", "stored"),
    [
        (lambda: header("X-Tenant", hashed=False), {"headers": [("x-tenant", "acme")]}, "x-tenant:acme"),
        (lambda: query_param("tenant", hashed=False), {"query": "tenant=acme"}, "q.tenant:acme"),
    ],
)
def test_hashed_false_keeps_a_readable_value(make: Any, sent: dict[str, Any], stored: str) -> None:
    assert make()(_scope(**sent)) == stored


async def test_no_secret_reaches_the_store_through_the_middleware() -> None:
    store = MemoryStore(clock=FakeClock(6000.0))
    rules = [
        Rule("/api/**", "1/min", key=header("X-API-Key"), name="by-header"),
        Rule("/search", "1/min", key=query_param("api_key"), name="by-query"),
    ]
    app = RateLimitMiddleware(build_app(), Limiter(store), rules)
    for path, sent in [
        ("/api/x", {"headers": [("x-api-key", SECRET)]}),
        ("/search", {"query": f"api_key={SECRET}"}),
    ]:
        assert [(await request(app, path, **sent)).status for _ in range(2)] == [200, 429], path
        other = {"headers": [("x-api-key", "other")]} if path == "/api/x" else {"query": "api_key=other"}
        assert (await request(app, path, **other)).status == 200  # another key, another counter
    stored = list(store._data)
    assert len(stored) == 4
    assert not [k for k in stored if SECRET in k or "other" in k]
