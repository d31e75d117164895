"""The check API of ``ratewarden serve`` in process (httpx's ASGITransport): tiers exact per API key
under concurrency, the gateway headers, trusted proxies, the 403 mode, JSON errors, health, metrics
and a store that does not answer (never unlimited)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.bench.services import free_port
from ratewarden.metrics import Metrics
from ratewarden.policy import load_policy, parse_policy
from ratewarden.serve.http import ServeApp

POLICY = """
version = 1

[identity]
sources = ["header:X-API-Key", "bearer", "query:api_key"]
unknown_group = "basic"
anonymous_group = "anonymous"

[identity.keys]
"pk-alice" = "premium"
"sk-bob" = "standard"
"cron" = "internal"

[groups.premium]
limits = "100/hour"

[groups.standard]
limits = "20/hour"

[groups.basic]
limits = "5/hour"

[groups.anonymous]
limits = "3/hour"

[groups.internal]
unlimited = true

[[rules]]
path = "/health"
bypass = true

[[rules]]
name = "api"
path = "/api/**"
tiered = true

[[rules]]
name = "login"
path = "/login"
methods = ["POST"]
rate = "2/hour"
key = "ip"
"""


def _app(policy: str = POLICY, limiter: Limiter | None = None, **kwargs: object) -> ServeApp:
    return ServeApp(limiter or Limiter(MemoryStore()), parse_policy(policy, "toml", "test.toml"), **kwargs)  # type: ignore[arg-type]


async def _client(app: ServeApp, caller: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(caller, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://rw")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with await _client(_app()) as c:
        yield c


def _original(uri: str, method: str = "GET", **headers: str) -> dict[str, str]:
    return {"X-Original-URI": uri, "X-Original-Method": method, **headers}


async def _statuses(client: httpx.AsyncClient, n: int, **kwargs: object) -> Counter[int]:
    answers = await asyncio.gather(*(client.get("/check", **kwargs) for _ in range(n)))  # type: ignore[arg-type]
    return Counter(a.status_code for a in answers)


# -- tiers ---------------------------------------------------------------------------------------


async def test_tiers_exact_per_api_key_under_concurrency(client: httpx.AsyncClient) -> None:
    premium, standard, basic = await asyncio.gather(
        _statuses(client, 150, headers=_original("/api/items", **{"X-API-Key": "pk-alice"})),
        _statuses(client, 40, headers=_original("/api/items", Authorization="Bearer sk-bob")),
        _statuses(client, 12, headers=_original("/api/items?api_key=trial-7&page=2")),
    )
    assert premium == {200: 100, 429: 50}
    assert standard == {200: 20, 429: 20}
    assert basic == {200: 5, 429: 7}
    unlimited = await _statuses(client, 50, headers=_original("/api/items", **{"X-API-Key": "cron"}))
    assert unlimited == {200: 50}


async def test_answers_carry_the_rate_limit_headers(client: httpx.AsyncClient) -> None:
    headers = _original("/api/items", **{"X-API-Key": "trial-1"})
    first = await client.get("/check", headers=headers)
    assert first.status_code == 200 and first.content == b""
    assert first.headers["x-ratelimit-limit"] == "5" and first.headers["x-ratelimit-remaining"] == "4"
    assert "ratelimit" in first.headers and "ratelimit-policy" in first.headers
    for _ in range(4):
        await client.get("/check", headers=headers)
    refused = await client.get("/check", headers=headers)
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["retry-after"]) > 0
    assert refused.json()["group"] == "basic"


async def test_traefik_forwarded_headers_and_method(client: httpx.AsyncClient) -> None:
    """Traefik's ForwardAuth names the original request X-Forwarded-Method/-Uri; a method-bound rule
    applies only to its method."""
    get = _statuses(client, 5, headers={"X-Forwarded-Uri": "/login", "X-Forwarded-Method": "GET"})
    assert await get == {200: 5}
    post = await _statuses(client, 5, headers={"X-Forwarded-Uri": "/login", "X-Forwarded-Method": "POST"})
    assert post == {200: 2, 429: 3}


async def test_bypass_and_unmatched_paths_are_allowed_without_a_charge(client: httpx.AsyncClient) -> None:
    assert await _statuses(client, 20, headers=_original("/health")) == {200: 20}
    answer = await client.get("/check", headers=_original("/elsewhere"))
    assert answer.status_code == 200 and "x-ratelimit-limit" not in answer.headers


async def test_deny_status_403_for_nginx_auth_request(client: httpx.AsyncClient) -> None:
    headers = _original("/api/x", **{"X-API-Key": "trial-403"})
    statuses = await asyncio.gather(*(client.get("/check?deny_status=403", headers=headers) for _ in range(8)))
    assert Counter(s.status_code for s in statuses) == {200: 5, 403: 3}
    refused = next(s for s in statuses if s.status_code == 403)
    assert refused.headers["x-ratelimit-remaining"] == "0" and "retry-after" in refused.headers
    bad = await client.get("/check?deny_status=500", headers=headers)
    assert bad.status_code == 400 and "deny_status" in bad.json()["error"]


# -- the client address --------------------------------------------------------------------------


async def test_spoofed_real_ip_from_an_untrusted_caller_is_ignored() -> None:
    async with await _client(_app(), caller="10.9.8.7") as untrusted:
        answers = [
            (await untrusted.get("/check", headers=_original("/api/a", **{"X-Real-IP": f"203.0.113.{i}"}))).status_code
            for i in range(6)
        ]
    assert Counter(answers) == {200: 3, 429: 3}  # every request charged to the caller, 10.9.8.7


async def test_trusted_proxy_headers_name_the_client() -> None:
    app = _app(trusted_proxies=["10.0.0.0/8"])
    async with await _client(app, caller="10.1.2.3") as proxy:
        for i in range(4):  # a new client each time: each within its 3/hour
            real = await proxy.get("/check", headers=_original("/api/a", **{"X-Real-IP": f"198.51.100.{i}"}))
            assert real.status_code == 200
        xff = _original("/api/a", **{"X-Forwarded-For": "6.6.6.6, 192.0.2.1"})
        assert Counter([(await proxy.get("/check", headers=xff)).status_code for _ in range(4)]) == {200: 3, 429: 1}
        # the last entry is the client: 192.0.2.1 is limited, 6.6.6.6 (client-written) is not
        other = _original("/api/a", **{"X-Forwarded-For": "192.0.2.1, 6.6.6.6"})
        assert (await proxy.get("/check", headers=other)).status_code == 200
    async with await _client(app, caller="127.0.0.1") as localhost:  # not in 10.0.0.0/8: not trusted now
        spoofed = [
            (await localhost.get("/check", headers=_original("/api/b", **{"X-Real-IP": f"198.18.0.{i}"}))).status_code
            for i in range(4)
        ]
    assert Counter(spoofed) == {200: 3, 429: 1}


# -- /v1/check -----------------------------------------------------------------------------------


async def test_json_check_exact_and_fields(client: httpx.AsyncClient) -> None:
    body = {"method": "GET", "path": "/api/items?page=1", "headers": {"X-API-Key": "pk-alice"}, "client": "192.0.2.9"}
    answers = await asyncio.gather(*(client.post("/v1/check", json=body) for _ in range(150)))
    assert {a.status_code for a in answers} == {200}
    results = [a.json() for a in answers]
    assert Counter(r["allowed"] for r in results) == {True: 100, False: 50}
    allowed = next(r for r in results if r["allowed"])
    assert allowed["status"] == 200 and allowed["limit"] == 100 and allowed["group"] == "premium"
    assert allowed["retry_after"] == 0 and allowed["headers"]["x-ratelimit-limit"] == "100"
    refused = next(r for r in results if not r["allowed"])
    assert refused["status"] == 429 and refused["remaining"] == 0 and refused["retry_after"] > 0
    assert "retry-after" in refused["headers"]


async def test_json_check_client_field_trusted_only_from_proxies() -> None:
    async with await _client(_app(), caller="10.9.9.9") as untrusted:
        results = [
            (await untrusted.post("/v1/check", json={"path": "/api/a", "client": f"192.0.2.{i}"})).json()["allowed"]
            for i in range(5)
        ]
    assert Counter(results) == {True: 3, False: 2}


async def test_json_check_cost_charges_the_same_counts(client: httpx.AsyncClient) -> None:
    """``cost`` multiplies the rules' charge, all or nothing, on the counts /check uses."""
    headers = {"X-API-Key": "pk-alice"}
    assert Counter([(await client.get("/check", headers=_original("/api/a", **headers))).status_code for _ in range(5)]) == {200: 5}

    async def json_check(cost: float) -> dict[str, object]:
        answer = await client.post("/v1/check", json={"path": "/api/a", "headers": headers, "cost": cost})
        result: dict[str, object] = answer.json()
        return result

    assert [(r["allowed"], r["remaining"]) for r in [await json_check(30) for _ in range(3)]] == [
        (True, 65), (True, 35), (True, 5)
    ]
    refused = await json_check(6)
    assert refused["allowed"] is False and refused["status"] == 429
    peek = await json_check(0)
    assert peek["allowed"] is True and peek["remaining"] == 5
    assert (await json_check(5))["allowed"] is True
    assert (await client.get("/check", headers=_original("/api/a", **headers))).status_code == 429
    concurrent = await asyncio.gather(*(
        client.post("/v1/check", json={"path": "/api/a", "headers": {"X-API-Key": "sk-bob"}, "cost": 3})
        for _ in range(20)
    ))
    assert Counter(a.json()["allowed"] for a in concurrent) == {True: 6, False: 14}  # 6 x 3 = 18 of 20


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"{}", 400, "'path' is required"),
        (b'{"path": "/a", "headers": []}', 400, "'headers' must be an object"),
        (b'{"path": "/a", "headers": {"X": 1}}', 400, "header 'X' must be a string"),
        (b'{"path": "/a", "client": "not-an-ip"}', 400, "IP address"),
        (b'{"path": "/a", "cost": -1}', 400, "'cost' must be a number from 0"),
        (b'{"path": "/a", "cost": "2"}', 400, "'cost' must be a number from 0"),
        (b'{"path": "/a", "cost": 1e9}', 400, "'cost' must be a number from 0"),
        (b'{"path": "a"}', 400, "must start with '/'"),
        (b'{"path": "/a", "method": "G E T"}', 400, "method"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b'{"path": "/a", "pad": "' + b"x" * 70_000 + b'"}', 413, "larger than"),
    ],
)
async def test_bad_requests_get_a_clear_status(client: httpx.AsyncClient, body: bytes, status: int, words: str) -> None:
    answer = await client.post("/v1/check", content=body)
    assert answer.status_code == status
    assert words in answer.json()["error"]


async def test_unknown_paths_and_methods(client: httpx.AsyncClient) -> None:
    missing = await client.get("/nope")
    assert missing.status_code == 404 and "/check" in missing.json()["error"]
    assert (await client.get("/v1/check")).status_code == 405
    assert (await client.post("/healthz")).status_code == 405
    no_rls = await client.post("/json", content=b"{}")
    assert no_rls.status_code == 404 and "envoy" in no_rls.json()["error"]
    no_metrics = await client.get("/metrics")
    assert no_metrics.status_code == 404 and "prometheus-client" in no_metrics.json()["error"]


async def test_without_a_policy_check_says_so() -> None:
    async with await _client(ServeApp(Limiter())) as c:
        answer = await c.get("/check", headers=_original("/api/a"))
        assert answer.status_code == 404 and "policy" in answer.json()["error"]
        assert (await c.get("/healthz")).status_code == 503


async def test_an_unexpected_error_is_a_500_answer_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()

    def broken(scope: object) -> Any:
        raise RuntimeError("boom")
        yield  # a step machine (the core's answer_steps) that fails when driven

    assert app.policy_app is not None
    app.policy_app.answer_steps = broken  # type: ignore[method-assign]
    async with await _client(app) as c:
        answer = await c.get("/check", headers=_original("/api/a"))
    assert answer.status_code == 500 and "RuntimeError" in answer.json()["error"]
    assert any(getattr(r, "event", None) == "check_failed" for r in caplog.records)


# -- reload, health, metrics ---------------------------------------------------------------------


async def test_apply_policy_swaps_the_limits(tmp_path: Path) -> None:
    app = _app()
    async with await _client(app) as c:
        headers = _original("/api/a", **{"X-API-Key": "swap-1"})
        assert (await _statuses(c, 4, headers=headers)) == {200: 4}
        costed = {"path": "/api/a", "headers": {"X-API-Key": "swap-3"}, "cost": 2}
        assert (await c.post("/v1/check", json=costed)).json()["remaining"] == 3
        file = tmp_path / "p.toml"
        file.write_text(POLICY.replace('limits = "5/hour"', 'limits = "1/hour"'))
        app.apply_policy(load_policy(file))
        assert (await _statuses(c, 3, headers=_original("/api/a", **{"X-API-Key": "swap-2"}))) == {200: 1, 429: 2}
        costed["headers"] = {"X-API-Key": "swap-4"}
        refused = (await c.post("/v1/check", json=costed)).json()
        assert refused["allowed"] is False and refused["limit"] == 1  # the costed checks follow the reload


async def test_healthz_and_metrics() -> None:
    app = _app(metrics=Metrics())
    async with await _client(app) as c:
        health = await c.get("/healthz")
        assert health.status_code == 200 and health.text == "ok\n"
        await _statuses(c, 7, headers=_original("/api/a", **{"X-API-Key": "m-1"}))
        metrics = await c.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'ratewarden_requests_allowed_total{group="basic",rule="api.basic"} 5.0' in metrics.text
    assert 'ratewarden_requests_limited_total{group="basic",rule="api.basic"} 2.0' in metrics.text


# -- a store that does not answer ------------------------------------------------------------------


def _down_store_limiter(on_error: str) -> Limiter:
    pytest.importorskip("redis")
    from ratewarden.stores import open_store

    return Limiter(open_store(f"redis://127.0.0.1:{free_port()}/0"), on_error=on_error)  # type: ignore[arg-type]


async def test_store_down_open_is_never_unlimited() -> None:
    """``on_error="open"``: the local insurance limiter decides, exactly; ``/healthz`` says 503."""
    limiter = _down_store_limiter("open")
    async with await _client(_app(limiter=limiter)) as c:
        statuses = await _statuses(c, 150, headers=_original("/api/a", **{"X-API-Key": "pk-alice"}))
        health = await c.get("/healthz")
    await limiter.close()
    assert statuses == {200: 100, 429: 50}
    assert health.status_code == 503 and "store unavailable" in health.text


async def test_store_down_closed_answers_503() -> None:
    limiter = _down_store_limiter("closed")
    async with await _client(_app(limiter=limiter)) as c:
        statuses = await _statuses(c, 20, headers=_original("/api/a", **{"X-API-Key": "pk-alice"}))
        answer = await c.post("/v1/check", json={"path": "/api/a", "headers": {"X-API-Key": "pk-alice"}})
    await limiter.close()
    assert statuses == {503: 20}
    assert answer.status_code == 200 and answer.json()["allowed"] is False and answer.json()["status"] == 503


# -- /json (Envoy's rate limit API as JSON) ----------------------------------------------------------

ENVOY = """
domain: rw_test
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 10
"""


async def test_envoy_json_endpoint(tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    rls = pytest.importorskip("ratewarden.serve.rls")
    envoy_config = pytest.importorskip("ratewarden.serve.envoy_config")
    pytest.importorskip("ratewarden.serve.grpc")
    file = tmp_path / "config.yaml"
    file.write_text(ENVOY)
    limiter = Limiter(MemoryStore())
    service = rls.RateLimitService(envoy_config.load_envoy_configs([file]), limiter)
    app = ServeApp(limiter, rls=service)
    request = {"domain": "rw_test", "descriptors": [{"entries": [{"key": "api_key", "value": "k1"}]}]}
    async with await _client(app) as c:
        answers = await asyncio.gather(*(c.post("/json", content=json.dumps(request)) for _ in range(15)))
        bad = await c.post("/json", content=b"{not json")
    codes = Counter((a.status_code, a.json()["overallCode"]) for a in answers)
    assert codes == {(200, "OK"): 10, (429, "OVER_LIMIT"): 5}  # as envoyproxy/ratelimit's /json answers
    assert bad.status_code == 400


@pytest.mark.parametrize("garbage", ["ones", "random-63", "random-80"])
async def test_corrupt_shared_memory_table_is_limited_and_healthz_says_so(tmp_path: Path, garbage: str) -> None:
    """A shared-memory table whose body was overwritten (``\\xff``, or seeded random bytes over the
    whole file, its locks included) fails every check, at once: the insurance limiter decides them
    (3 of 20 against 3/hour, not 20), and ``/healthz`` says 503 with the reason."""
    import random

    from ratewarden.stores import SharedMemoryStore
    from ratewarden.stores.shared_memory import segment_path
    from ratewarden.stores.shared_memory.layout import HEADER_SIZE

    store = SharedMemoryStore("serve-corrupt", max_keys=100, directory=tmp_path)
    limiter = Limiter(store)
    path = segment_path("serve-corrupt", tmp_path)
    async with await _client(_app(limiter=limiter)) as c:
        assert (await c.get("/healthz")).status_code == 200
        with open(path, "r+b") as f:
            start = HEADER_SIZE if garbage == "ones" else 0
            f.seek(start)
            size = path.stat().st_size - start
            f.write(b"\xff" * size if garbage == "ones" else random.Random(garbage).randbytes(size))
        statuses = [(await c.get("/check", headers=_original("/api/a"))).status_code for _ in range(20)]
        health = await c.get("/healthz")
    await limiter.close()
    assert statuses == [200] * 3 + [429] * 17  # the anonymous group: 3/hour
    assert limiter.without_store()["local_limiter"] == 20
    assert health.status_code == 503 and "store" in health.text and "error" in health.text, health.text
