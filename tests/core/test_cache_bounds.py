"""Caches keyed by what a client sends hold a bounded number of bytes, not just of entries.

Regression: 4,096 distinct 64 KB ``X-API-Key`` values grew a worker from 37 to 294 MB through the
per-rule storage-key cache (``CompiledRule.keys_cache``), 64 KB paths to 292 MB through the match
cache (``RuleSet.match``); the FastAPI edge cache is keyed by path too. Long keys and paths are now
computed but not cached (a long key is cached under its hash, which the storage key holds anyway),
and limits still apply to them.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import Depends, FastAPI

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule, RuleSet
from ratewarden.decision import Decision
from ratewarden.enforcement import answers
from ratewarden.fastapi import RateLimit
from ratewarden.fastapi.routes import edge_layer
from ratewarden.limiter import MAX_KEY_LENGTH, storage_key
from ratewarden.rules import MAX_CACHED_PATH, CompiledRule
from ratewarden.types import Scope
from ratewarden.wsgi import RateLimitMiddleware as WSGIMiddleware
from ratewarden.wsgi import scope as wsgi_scope
from tests.core.asgi import Reply, call, http_scope, request
from tests.vectors.runner import FakeClock

CLIENTS = 4096
BIG = 64 * 1024


def big(i: int, prefix: str = "") -> str:
    """A distinct 64 KB value."""
    head = f"{prefix}{i:08d}-"
    return head + "k" * (BIG - len(head))


def api_key(scope: Scope) -> str | None:
    """The raw ``X-API-Key`` value (not hashed): what a custom key function may return."""
    for name, value in scope["headers"]:
        if name == b"x-api-key":
            return str(value.decode("latin-1"))
    return None


@pytest.fixture
def limiter() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


def cached_chars(cache: dict[Any, Any]) -> int:
    """The characters of the strings held by a cache, keys and values (nested in tuples)."""

    def chars(value: object) -> Iterator[int]:
        if isinstance(value, str):
            yield len(value)
        elif isinstance(value, (tuple, list)):
            for item in value:
                yield from chars(item)
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from chars(k)
                yield from chars(v)

    return sum(sum(chars(k)) + sum(chars(v)) for k, v in cache.items())


class Growth:
    """The memory the traced block kept allocated (tracemalloc)."""

    def __enter__(self) -> Growth:
        tracemalloc.start()
        self.before = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.kept = tracemalloc.get_traced_memory()[0] - self.before
        tracemalloc.stop()


# --- storage keys ---------------------------------------------------------------------------------


async def test_long_keys_do_not_fill_the_key_cache(limiter: Limiter) -> None:
    app = RateLimitMiddleware(_ok, limiter=limiter, rules=[Rule("/api/**", "2/min", key=api_key)])
    (compiled,) = app.rules.match("GET", "/api/x")
    with Growth() as growth:
        for i in range(CLIENTS):
            assert (await request(app, "/api/x", headers=[("x-api-key", big(i))])).status == 200
    assert cached_chars(compiled.keys_cache) <= CLIENTS * 200, "the cache holds the clients' long keys"
    assert growth.kept < 8 * 1024 * 1024, f"kept {growth.kept / 2**20:.0f} MB"  # was about 260 MB
    # Each long key is still limited on its own.
    replies = [await request(app, "/api/x", headers=[("x-api-key", big(7))]) for _ in range(2)]
    assert [r.status for r in replies] == [200, 429]
    assert (await request(app, "/api/x", headers=[("x-api-key", big(7, "other"))])).status == 200


def test_storage_keys_unchanged() -> None:
    """Counters keep their storage keys: short keys as they are, long ones hashed as before."""
    compiled = CompiledRule(Rule("/api/**", "5/min; 100/day"), "rw")
    suffixes = [limit.suffix for limit in compiled.limits]
    for key in ["203.0.113.7", "x" * MAX_KEY_LENGTH, "x" * (MAX_KEY_LENGTH + 1), big(1), "a{b}"]:
        expected = tuple(storage_key("rw", "/api/**", key, suffix) for suffix in suffixes)
        assert compiled.storage_keys(key) == expected
        assert compiled.storage_keys(key) == expected  # from the cache
    assert len(compiled.keys_cache) == 5
    assert max(len(k) for k in compiled.keys_cache) == MAX_KEY_LENGTH


# --- the match cache ------------------------------------------------------------------------------


@pytest.mark.parametrize("methods", [None, "GET"])  # cached by path, or by (method, path)
async def test_long_paths_do_not_fill_the_match_cache(limiter: Limiter, methods: str | None) -> None:
    ruleset = RuleSet([Rule("/api/**", "2/min", methods=methods)])
    app = RateLimitMiddleware(_ok, limiter=limiter, rules=ruleset)
    with Growth() as growth:
        for i in range(CLIENTS):
            path = "/api/" + big(i)
            assert (await request(app, path, client=(f"10.0.{i // 256}.{i % 256}", 1))).status == 200
            assert len(ruleset.match("GET", path, websocket=True)) == 0
    cache, by_path = ruleset._table[1], ruleset._table[2]
    held = cached_chars(cache) + cached_chars(by_path or {})
    assert held <= 2 * 4096 * (MAX_CACHED_PATH + 4), "the match cache holds the clients' long paths"
    assert growth.kept < 8 * 1024 * 1024, f"kept {growth.kept / 2**20:.0f} MB"  # was about 260 MB
    # A long path is still matched and limited.
    path = "/api/" + big(1)
    replies = [await request(app, path) for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 429]
    assert (await request(app, "/api/./" + big(1))).status == 429  # and normalised like any other
    assert (await request(app, "/other/" + big(1))).status == 200


# --- the WSGI scope's header names ---------------------------------------------------------------


def test_long_header_names_do_not_fill_the_wsgi_name_cache(limiter: Limiter) -> None:
    """1,000 distinct 64 KB header names (under the 1,024 entries the cache holds) left 128 MB in the
    name cache; it now holds 4 MiB at most."""

    def ok(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b""]

    app = WSGIMiddleware(ok, limiter=limiter, rules=[Rule("/api/**", "2/min", key=api_key)])
    statuses: list[str] = []
    wsgi_scope._names.clear()
    with Growth() as growth:
        for i in range(1000):
            environ = {
                "REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "REMOTE_ADDR": "10.2.0.1",
                "HTTP_X_API_KEY": f"client-{i}", "HTTP_X_" + big(i).upper(): "1",
            }
            list(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses == ["200 OK"] * 1000
    assert cached_chars(wsgi_scope._names) <= 1024 * 1024, "the name cache holds the clients' long names"
    assert growth.kept < 8 * 1024 * 1024, f"kept {growth.kept / 2**20:.0f} MB"  # was about 128 MB
    assert "HTTP_X_API_KEY" in wsgi_scope._names  # short names are still cached


# --- the FastAPI edge cache -----------------------------------------------------------------------


async def test_long_paths_do_not_fill_the_edge_cache(limiter: Limiter) -> None:
    app = FastAPI()

    @app.get("/files/{name:path}", dependencies=[Depends(RateLimit("2/min", limiter=limiter))])
    async def files(name: str) -> dict[str, int]:
        return {"length": len(name)}

    layer = edge_layer(app, app)
    with Growth() as growth:
        for i in range(CLIENTS):
            scope = http_scope("/files/" + big(i), client=(f"10.1.{i // 256}.{i % 256}", 1))
            assert (await _call(layer, scope)).status == 200
    assert cached_chars(layer.cache) <= 4096 * 2 * (MAX_CACHED_PATH + 8), "the edge cache holds long paths"
    assert growth.kept < 8 * 1024 * 1024, f"kept {growth.kept / 2**20:.0f} MB"  # was about 520 MB
    path = "/files/" + big(3)
    statuses = [(await _call(layer, http_scope(path))).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    # Short paths are still cached.
    await _call(layer, http_scope("/files/a.txt"))
    assert "/files/a.txt" in layer.cache


async def _call(app: Any, scope: dict[str, Any]) -> Reply:
    return await call(app, scope)


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_default_429_is_kept_by_the_rejection_cache() -> None:
    """A finished 429 (body and every header, about 2 KB) fits its cache's share, so a flood of
    refusals reuses it instead of encoding the JSON body each time."""
    answers._rejections.clear()
    decision = Decision(False, 100, 0, 30.0, 30.0, 60.0, "api")
    first = answers.rejection(decision, answers.HeaderOptions(), b'"api";q=100;w=60', "a-fairly-long-group-name")
    assert len(answers._rejections) == 1
    assert answers.rejection(decision, answers.HeaderOptions(), b'"api";q=100;w=60', "a-fairly-long-group-name") == first
