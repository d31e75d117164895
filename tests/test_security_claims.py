"""Claims of docs/security.md that no other test checked (issue 36), each tried on the real door or
store: a repeated keyed parameter refused under ``on_error="closed"`` too; a failing key or cost
function logged at most once a second and counted; ``%2F`` in a path counted with the path it
decodes to (a real uvicorn); Sanic's routed spellings of a path charged to one count and its
``remote_addr`` never believed; the lookup caches' bytes (``caches.remember``, the RLS key cache, the
shared-memory locations); a charge-back that fails failing its check (a real redis-server); and the
gateway bench's peers on loopback, with ``go install`` given up after 900 s.

The ``serve`` claims are in tests/serve/test_serve_security_claims.py."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
import uuid
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sanic import response
from sanic.request import Request
from werkzeug.test import Client as WerkzeugClient

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.caches import DEFAULT_BYTES, remember, size_of
from ratewarden.enforcement.core import failure_counts
from ratewarden.errors import StoreError
from ratewarden.keys import query_param
from ratewarden.limits import Limit
from ratewarden.sanic import RateLimiter as SanicRateLimiter
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.rls import RateLimitService, RequestDescriptor
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.redis import RedisStore
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.core.asgi import request as asgi_request
from tests.core.test_rule_paths import raw_get, static_app, static_dir  # noqa: F401 (static_dir: a fixture)
from tests.sanic.server import new_app, send, serving
from tests.servers import RedisStandalone, uvicorn_in_thread
from tests.shm import unique_name
from tests.vectors.runner import FakeClock

REAL = "sk-real-caller"


def frozen(**options: Any) -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)), **options)


async def ok(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


def ok_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"served"]


# -- a keyed query parameter given twice, under on_error="closed" --------------------------------------------


async def test_a_repeated_keyed_parameter_is_400_not_503_under_fail_closed() -> None:
    """docs/security.md: "refused with 400 naming the parameter, whatever ``on_error`` says": the
    client's doing, not a failure, so fail-closed answers it as fail-open does."""
    rules = [Rule("/data", "3/hour", key=query_param("api_key"))]
    asgi = RateLimitMiddleware(ok, frozen(on_error="closed"), rules)
    wsgi = WerkzeugClient(WSGIRateLimitMiddleware(ok_wsgi, frozen(on_error="closed"), rules))
    ambiguous = f"api_key=rand&api_key={REAL}"
    answer = await asgi_request(asgi, "/data", query=ambiguous)
    assert answer.status == 400 and b"'api_key' is given more than once with different values" in answer.body
    assert (await asgi_request(asgi, "/data", query=f"api_key={REAL}&api_key={REAL}")).status == 200  # the same value
    wsgi_answer = wsgi.get(f"/data?{ambiguous}")
    assert wsgi_answer.status_code == 400 and b"more than once with different values" in wsgi_answer.data


# -- a key or cost function that raises: logged at most once a second, counted ---------------------------------


def broken_key(scope: Any) -> str:
    raise RuntimeError("auth service down")


def broken_cost(scope: Any) -> float:
    raise RuntimeError("pricing service down")


async def test_failing_key_and_cost_functions_are_logged_at_most_once_a_second_and_all_counted(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)
    keyed = RateLimitMiddleware(ok, frozen(), [Rule("/k", "100/min", key=broken_key, name="k")])
    costed = RateLimitMiddleware(ok, frozen(), [Rule("/c", "100/min", cost=broken_cost, name="c")])
    before = failure_counts()
    with caplog.at_level(logging.WARNING, logger="ratewarden"):
        started = time.monotonic()
        for _ in range(10):
            assert (await asgi_request(keyed, "/k")).status == 200
            assert (await asgi_request(costed, "/c")).status == 200
        burst = time.monotonic() - started
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rate limit check failed")]
        if burst < 1.0:  # within a second: one line for the 20 failures
            assert len(lines) == 1, lines
        await asyncio.sleep(1.05)
        assert (await asgi_request(costed, "/c")).status == 200
    later = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rate limit check failed")]
    assert len(later) == len(lines) + 1 and "cost function" in later[-1], later
    after = failure_counts()
    assert after[("key function", "RuntimeError")] - before.get(("key function", "RuntimeError"), 0) == 10
    assert after[("cost function", "RuntimeError")] - before.get(("cost function", "RuntimeError"), 0) == 11


# -- %2F in a path, on a real server -------------------------------------------------------------------------


async def test_an_encoded_slash_counts_with_the_path_it_decodes_to(static_dir: Path) -> None:  # noqa: F811
    """docs/security.md: path spellings with ``%2F`` are one resource: uvicorn decodes ``%2F`` to ``/``
    in ``scope["path"]``, where StaticFiles serves the file, and the rule counts it there too."""
    app = static_app(static_dir, frozen())
    with uvicorn_in_thread(app) as port:
        statuses = await asyncio.to_thread(
            lambda: [raw_get(port, spelling) for spelling in ("/files%2Freport.txt", "/files%2freport.txt",
                                                                "/files/%2Freport.txt", "/files/report.txt")]
        )
        more = await asyncio.to_thread(lambda: [raw_get(port, "/files%2Freport.txt") for _ in range(3)])
    assert statuses == [200, 200, 200, 429], statuses  # Rule("/files/report.txt", "3/min"), one count
    assert more == [429] * 3


# -- Sanic: its routed spellings, and its remote_addr ------------------------------------------------------------


def _sanic_app(ran: list[tuple[str, str]]) -> Any:
    app = new_app()

    async def items(request: Request) -> response.HTTPResponse:
        ran.append((request.path, request.remote_addr))
        return response.text("ok")

    app.route("/api/items", methods=["GET"])(items)
    return app


async def test_sanic_charges_every_spelling_of_a_limited_path_to_one_count() -> None:
    """docs/security.md (Sanic): rules match the normalised raw path Sanic routes, 404s charged by the
    app-wide rules too: however a client spells ``/api/items`` (``//``, ``/./``, ``..``, a trailing
    ``/``), the handler runs at most the rule's count."""
    ran: list[tuple[str, str]] = []
    app = _sanic_app(ran)
    SanicRateLimiter(app, frozen(), [Rule("/api/items", "3/min", name="api")])
    spellings = ["/api/items/", "/api//items", "/api/./items", "/api/x/../items", "//api/items", "/api/items"]
    async with serving(app) as port:
        statuses = [(await send(port, "GET", path))[0] for path in spellings * 2]
    assert statuses[:3] == [200, 404, 404], statuses  # Sanic routes "/api/items/" to the handler
    assert statuses[3:] == [429] * 9, statuses
    assert [path for path, _ in ran] == ["/api/items/"]


async def test_sanic_never_keys_on_remote_addr_set_from_forwarding_headers() -> None:
    """docs/security.md (Sanic): the client is the socket peer (``request.ip``), never Sanic's
    ``remote_addr``, which Sanic sets from ``X-Forwarded-For`` (``PROXIES_COUNT``) or ``Forwarded``
    (``FORWARDED_SECRET``) when configured to."""
    for config, header in (("PROXIES_COUNT", "X-Forwarded-For"), ("FORWARDED_SECRET", "Forwarded")):
        ran: list[tuple[str, str]] = []
        app = _sanic_app(ran)
        setattr(app.config, config, 1 if config == "PROXIES_COUNT" else "s3cret")
        SanicRateLimiter(app, frozen(), [Rule("/api/**", "2/min", name="api")])
        async with serving(app) as port:
            forged = [f"198.51.100.{i}" if header == "X-Forwarded-For" else f"for=198.51.100.{i};secret=s3cret"
                      for i in range(4)]
            statuses = [(await send(port, "GET", "/api/items", {header: value}))[0] for value in forged]
        assert statuses == [200, 200, 429, 429], (config, statuses)
        assert [addr for _, addr in ran] == ["198.51.100.0", "198.51.100.1"], ran  # Sanic believed the header


# -- the lookup caches ---------------------------------------------------------------------------------------


def test_remember_keeps_no_entry_over_its_share_and_empties_a_full_cache() -> None:
    """docs/security.md: "an entry larger than its share of the cache's bytes is not cached, and a full
    cache is emptied whole"; 4 MiB a cache unless it says otherwise."""
    assert DEFAULT_BYTES == 4 * 1024 * 1024
    cache: dict[str, str] = {}
    share = 4096 // 4
    remember(cache, "k" * share, "v", 4, 4096)  # over its 1 KiB share with its value
    assert cache == {}
    for i in range(4):
        remember(cache, f"k{i}", "v", 4, 4096)
    assert list(cache) == ["k0", "k1", "k2", "k3"]
    remember(cache, "k4", "v", 4, 4096)
    assert cache == {"k4": "v"}  # emptied whole, then the new entry
    big: dict[str, str] = {}
    for i in range(100_000):  # the default bound: 4 MiB over any number of entries
        remember(big, f"{i:08d}" + "x" * 300, "v", 4096)
    assert sum(size_of(k) + size_of(v) for k, v in big.items()) <= DEFAULT_BYTES


async def test_the_rls_storage_key_cache_stays_within_16_mib_and_still_limits() -> None:
    """docs/security.md: the RLS key cache holds at most 16 MiB (16,384 entries of 1 KiB at most):
    a flood of distinct descriptor values, long ones too, leaves it within; a value too long to cache
    is still counted."""
    domain = parse_envoy_config("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
    service = RateLimitService({"d": domain}, Limiter(MemoryStore(clock=FakeClock(6000.0))))
    for i in range(17_000):
        await service.should_rate_limit("d", [RequestDescriptor((("user", f"{i:06d}" + "v" * 300),))], 1)
    keys = service._keys
    assert 0 < len(keys) <= 16_384
    assert sum(size_of(k) + size_of(v) for k, v in keys.items()) <= 16 * 1024 * 1024
    long_value = [RequestDescriptor((("user", "L" * 5000),))]
    answers = [(await service.should_rate_limit("d", long_value, 1)).overall_ok for _ in range(3)]
    assert answers == [True, True, False]
    assert not any(size_of(k) + size_of(v) > 1024 for k, v in keys.items())


def test_the_shared_memory_location_cache_stays_within_32_mib(tmp_path: Path) -> None:
    """docs/security.md: the shared-memory store's key locations hold at most 32 MiB (65,536 entries
    of 512 B at most): more keys than that empty it; a key too long for its share is not kept."""
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path)
    try:
        segment = store._segment()
        for i in range(70_000):
            store._locate(segment, f"rw:{{{i:08d}}}:" + "k" * 200)
        where = store._where
        assert 0 < len(where) <= 65_536
        assert sum(size_of(k) + size_of(v) for k, v in where.items()) <= 32 * 1024 * 1024
        store._locate(segment, "rw:{" + "L" * 1000 + "}:x")
        assert "rw:{" + "L" * 1000 + "}:x" not in where
    finally:
        store.unlink()
        asyncio.run(store.close())


# -- a charge-back that fails ---------------------------------------------------------------------------------


class FailingChargeBack(RedisStore):
    """A real RedisStore whose charge-backs (``adjust``) fail while ``failing``."""

    failing = False

    async def adjust(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Any:
        if self.failing:
            raise StoreError("the charge-back failed", reason="timeout")
        return await super().adjust(keys, limits, costs)

    def adjust_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Any:
        if self.failing:
            raise StoreError("the charge-back failed", reason="timeout")
        return super().adjust_blocking(keys, limits, costs)


@pytest.mark.parametrize("path", ["async", "blocking"])
async def test_a_check_whose_charge_back_fails_fails_with_its_error_and_the_charge_stays_owed(
    redis_standalone: RedisStandalone, path: str
) -> None:
    """docs/security.md: what the insurance limiter admitted "reaches the store before the next check
    ...; if the charge fails, the check fails with its error" (and stays owed): the next check never
    goes ahead uncharged."""
    store = FailingChargeBack(redis_standalone.url, timeout=0.1, coalesce=False)
    limiter = Limiter(store, prefix=f"c{uuid.uuid4().hex[:10]}")
    limits = limiter.limits("5/hour")
    keys = limiter.keys_for("client", limits)

    async def check() -> Any:
        if path == "async":
            return await store.hit(keys, limits, [1.0])
        return await asyncio.to_thread(store.hit_blocking, keys, limits, [1.0])

    try:
        assert (await check()).remaining == 4
        with redis_standalone.server.paused():
            assert (await limiter.hit("client", "5/hour")).allowed  # the insurance limiter admits it: owed
        assert store.ledger.owed
        store.failing = True
        with pytest.raises(StoreError, match="the charge-back failed"):
            await check()
        assert store.ledger.owed  # still owed
        (peeked,) = await store.peek(keys, limits)
        assert peeked.remaining == 4  # the check did not go ahead without the charge
        store.failing = False
        assert (await check()).remaining == 2  # the charge-back, then this check
        assert not store.ledger.owed
    finally:
        redis_standalone.server.resume()
        await limiter.close()


# -- the gateway bench's peers ------------------------------------------------------------------------------


def test_the_gateway_bench_peers_listen_on_loopback_only(tmp_path: Path) -> None:
    """docs/security.md: the bench runs envoyproxy/ratelimit, ghz, redis-server and ``serve`` "with
    every listener on 127.0.0.1"."""
    from ratewarden.bench import gateway_procs as gp
    from ratewarden.bench.gateway_peer_run import _reference_env

    assert gp.HOST == "127.0.0.1"
    env = _reference_env(50051, 6379, tmp_path)
    assert {env[name] for name in ("GRPC_HOST", "HOST", "DEBUG_HOST")} == {"127.0.0.1"}
    assert env["REDIS_URL"].startswith("127.0.0.1:")
    argv = gp.serve_command([tmp_path / "config.yaml"], 8080, grpc=8081, spoe=12345)
    addresses = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--http", "--grpc", "--spoe")]
    assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses), argv


def test_go_install_gives_up_after_900_seconds_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/security.md: "`go install` gives up after 900 s", and the peers are then skipped with why;
    a Go binary's module version goes in the report's notes."""
    from ratewarden.bench import gateway_peers

    seen: dict[str, Any] = {}

    def run(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        if argv[1] == "install":
            seen.update(options)
            raise subprocess.TimeoutExpired(argv, options["timeout"])
        if argv[1:3] == ["version", "-m"]:
            return subprocess.CompletedProcess(argv, 0, f"{argv[3]}: go1.22\n\tpath\tgithub.com/bojand/ghz/cmd/ghz\n"
                                                        "\tmod\tgithub.com/bojand/ghz\tv0.120.0\th1:x=\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")  # go env: no GOBIN, no GOPATH

    monkeypatch.setattr(gateway_peers.subprocess, "run", run)
    monkeypatch.setattr(gateway_peers.shutil, "which", lambda name: "/opt/go/bin/go" if name == "go" else None)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GOBIN", raising=False)
    found, why = gateway_peers._go_tool("ghz", gateway_peers.GHZ_MODULE, True, lambda line: None)
    assert found == "" and seen["timeout"] == 900
    assert "`go install github.com/bojand/ghz/cmd/ghz@latest` failed" in why and "900" in why, why
    assert gateway_peers._module_version("/somewhere/ghz") == " (github.com/bojand/ghz v0.120.0)"
