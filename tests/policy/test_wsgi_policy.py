"""WSGIPolicyMiddleware: the policy file, tiers, shadow mode, bans, delays, charging and reloads for
WSGI apps, called directly (PEP 3333), and its answers byte for byte those of PolicyMiddleware."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.charges import Charge
from ratewarden.decision import Decision
from ratewarden.errors import ConfigurationError
from ratewarden.limits import Limit
from ratewarden.policy import Bans, Delay, PolicyMiddleware, PolicyRule, WSGIPolicyMiddleware
from ratewarden.wsgi import scope_of
from tests.policy.apps import tiered_policy
from tests.timing import Stopwatch

Answer = tuple[int, dict[str, str], bytes]


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    status = environ.get("QUERY_STRING", "").partition("status=")[2] or "200"
    start_response(f"{status} X", [("Content-Type", "text/plain")])
    return [b"hello"]


def environ_for(path: str, *, method: str = "GET", ip: str = "10.0.0.1", headers: dict[str, str] | None = None, query: str = "") -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
        "SERVER_NAME": "test", "SERVER_PORT": "80", "REMOTE_ADDR": ip, "REMOTE_PORT": "1234",
        "wsgi.url_scheme": "http",
    }
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def call(app: Any, path: str, **kwargs: Any) -> Answer:
    environ = environ_for(path, **kwargs)
    started: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: started.append((status, headers))))
    status, headers = started[0]
    return int(status.split()[0]), {k.lower(): v for k, v in headers}, body


def statuses(app: Any, path: str, n: int, **kwargs: Any) -> list[int]:
    return [call(app, path, **kwargs)[0] for _ in range(n)]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(tiered_policy(premium=1000, standard=20, basic=5))
    return path


# -- tiers ---------------------------------------------------------------------------------------


def test_tiers_by_api_key(policy_file: Path) -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=policy_file)
    assert statuses(app, "/api/items", 7, headers={"X-API-Key": "trial-1"}).count(429) == 2
    assert statuses(app, "/api/items", 30, headers={"X-API-Key": "pk-premium"}).count(429) == 0
    assert statuses(app, "/api/items", 50, headers={"X-API-Key": "cron"}).count(429) == 0  # unlimited group
    assert statuses(app, "/api/items", 4, ip="10.0.0.9").count(429) == 1  # anonymous: 3/min per client
    status, headers, body = call(app, "/api/items", headers={"X-API-Key": "trial-1"})
    assert status == 429 and b'"group": "basic"' in body and headers["retry-after"]
    assert statuses(app, "/health", 20) == [200] * 20  # bypass


def test_the_context_is_in_the_environ(policy_file: Path) -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=policy_file)
    seen: list[Any] = []

    def inner(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        seen.append(environ["ratewarden.context"])
        return hello(environ, start_response)

    app.app = inner
    status, headers, _ = call(app, "/api/items", headers={"X-API-Key": "sk-standard"})
    assert status == 200 and seen[0].group == "standard" and seen[0].decision.remaining == 19
    assert headers["ratelimit-policy"]


# -- the 429 is the ASGI middleware's, byte for byte ----------------------------------------------


def _asgi_answer(app: Any, environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    scope = dict(scope_of(dict(environ)), state={})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def asgi_hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"Content-Type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"hello"})

    app.app = asgi_hello
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], list(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _wsgi_answer(app: Any, environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    started: list[Any] = []
    body = b"".join(app(dict(environ), lambda status, headers, exc_info=None: started.append((status, headers))))
    status, headers = started[0]
    return int(status.split()[0]), [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers], body


@pytest.mark.parametrize("header_style", ["both", "ietf", "legacy"])
def test_the_429_bytes_equal_the_asgi_middlewares(policy_file: Path, header_style: str) -> None:
    now = [1_000_000.0]
    environ = environ_for("/api/items", headers={"X-API-Key": "trial-1"})
    wsgi = WSGIPolicyMiddleware(hello, Limiter(MemoryStore(clock=lambda: now[0])), policy=policy_file, header_style=header_style)  # type: ignore[arg-type]
    asgi = PolicyMiddleware(hello, Limiter(MemoryStore(clock=lambda: now[0])), policy=policy_file, header_style=header_style)  # type: ignore[arg-type]
    answers = []
    for _ in range(6):
        w, a = _wsgi_answer(wsgi, environ), _asgi_answer(asgi, environ)
        assert w == a
        answers.append(w)
        now[0] += 0.25
    assert [status for status, _, _ in answers] == [200] * 5 + [429]
    assert b'"group": "basic"' in answers[-1][2]


def test_the_ban_answer_bytes_equal_the_asgi_middlewares() -> None:
    now = [1_000_000.0]
    rules = [PolicyRule("/api/**", "1/min", name="api")]

    def make(cls: Any) -> Any:
        bans = Bans(after=2, within=60, duration=30, clock=lambda: now[0])
        return cls(hello, Limiter(MemoryStore(clock=lambda: now[0])), rules, bans=bans)

    wsgi, asgi = make(WSGIPolicyMiddleware), make(PolicyMiddleware)
    environ = environ_for("/api/x")
    for _ in range(5):
        assert _wsgi_answer(wsgi, environ) == _asgi_answer(asgi, environ)
    status, headers, body = _wsgi_answer(wsgi, environ)
    assert status == 403 and (b"retry-after", b"30") in headers and b"blocked for 30s" in body


# -- shadow ------------------------------------------------------------------------------------------


def test_global_shadow_counts_and_never_blocks() -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), [PolicyRule("/api/**", "2/min", name="api")], shadow=True)
    answers = [call(app, "/api/x") for _ in range(4)]
    assert [a[0] for a in answers] == [200] * 4
    assert "ratelimit-shadow" not in answers[1][1]
    assert answers[2][1]["ratelimit-shadow"].startswith('"api";deny;r=0;t=')


def test_per_rule_shadow_flags_the_response(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('version = 1\n[[rules]]\nname = "search"\npath = "/search"\nrate = "2/min"\nshadow = true\n')
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=path)
    answers = [call(app, "/search") for _ in range(3)]
    assert [a[0] for a in answers] == [200] * 3
    assert "ratelimit-shadow" not in answers[0][1]
    assert "deny" in answers[2][1]["ratelimit-shadow"]


def test_shadow_setting_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('version = 1\n[settings]\nshadow = true\n[[rules]]\nname = "api"\npath = "/api/**"\nrate = "1/min"\n')
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=path)
    assert app.shadow and statuses(app, "/api/x", 3) == [200] * 3


# -- bans ----------------------------------------------------------------------------------------------


def test_ban_after_n_rejections() -> None:
    bans = Bans(after=3, within=60, duration=120)
    limiter = Limiter(MemoryStore())
    app = WSGIPolicyMiddleware(hello, limiter, [PolicyRule("/api/**", "1/min", name="api")], bans=bans)
    assert statuses(app, "/api/x", 4) == [200, 429, 429, 429]  # the third rejection bans
    status, headers, _ = call(app, "/api/x")
    assert status == 403 and headers["retry-after"] == "120" and headers["content-type"] == "application/problem+json"
    assert call(app, "/api/x", ip="10.0.0.2")[0] == 200  # another client
    assert 119 < bans.banned()["10.0.0.1"] <= 120
    bans._cache.clear()  # another worker: reads the ban back from the store
    assert bans.check_blocking(limiter, "10.0.0.1") > 119
    asyncio.run(app.unblock("10.0.0.1"))  # the admin calls are the ASGI middleware's coroutines
    assert call(app, "/api/x")[0] == 429


def test_bans_grow_on_repeat_offences() -> None:
    now = [1_000_000.0]
    bans = Bans(after=1, within=60, duration=10, growth=2.0, max_duration=100, clock=lambda: now[0])
    limiter = Limiter(MemoryStore(clock=lambda: now[0]))
    app = WSGIPolicyMiddleware(hello, limiter, [PolicyRule("/api/**", "1/min", name="api")], bans=bans)
    assert statuses(app, "/api/x", 2) == [200, 429]
    assert call(app, "/api/x")[1]["retry-after"] == "10"
    now[0] += 11
    assert call(app, "/api/x")[0] == 429  # the minute's limit, not a ban: a second offence
    assert call(app, "/api/x")[1]["retry-after"] == "20"


class _RemoteWithSyncHit:
    """A remote store whose client answers checks synchronously, but has no synchronous peek or reset."""

    def __init__(self) -> None:
        self.memory = MemoryStore()

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)

    def hit_blocking(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        return self.memory.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.memory.peek_now(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        self.memory.reset_now(keys)


class _RemoteWithoutSync(_RemoteWithSyncHit):
    hit_blocking = None  # type: ignore[assignment]


def test_a_store_without_synchronous_ban_methods_is_refused_at_start_up() -> None:
    rules = [PolicyRule("/api/**", "1/min", name="api")]
    limiter = Limiter(_RemoteWithSyncHit(), fallback=None)
    assert call(WSGIPolicyMiddleware(hello, limiter, rules), "/api/x")[0] == 200  # checks: fine
    with pytest.raises(ConfigurationError, match=r"bans .*_RemoteWithSyncHit has no such method"):
        WSGIPolicyMiddleware(hello, limiter, rules, bans=Bans(after=2))


def test_a_store_without_a_synchronous_client_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigurationError, match=r"_RemoteWithoutSync has no synchronous client"):
        WSGIPolicyMiddleware(hello, Limiter(_RemoteWithoutSync(), fallback=None), [PolicyRule("/api/**", "1/min")])


def test_a_redis_store_with_bans_is_accepted_at_start_up(tmp_path: Path) -> None:
    """Redis answers bans without an event loop (``peek_blocking``/``reset_blocking``): no refusal,
    and nothing is asked of the (unreachable) server until a request comes."""
    from ratewarden.stores import RedisStore

    path = tmp_path / "p.toml"
    path.write_text('version = 1\n[[rules]]\npath = "/api/**"\nrate = "1/min"\n[bans]\nafter = 3\n')
    store = RedisStore("redis://127.0.0.1:1/0")
    assert store.can_block("hit", "peek", "reset")
    WSGIPolicyMiddleware(hello, Limiter(store), policy=path)


def test_async_key_functions_are_refused() -> None:
    async def key(scope: Any) -> str:
        return "k"

    with pytest.raises(ConfigurationError, match="async key function"):
        WSGIPolicyMiddleware(hello, Limiter(), [PolicyRule("/api/**", "1/min", key=key)])
    with pytest.raises(ConfigurationError, match="bans' key function"):
        WSGIPolicyMiddleware(hello, Limiter(), [PolicyRule("/api/**", "1/min")], bans=Bans(key=key))


# -- delay and after-response charging ----------------------------------------------------------------------


def test_delay_sleeps_for_a_turn() -> None:
    delay = Delay(max_wait=1.0, burst=2)
    rules = [PolicyRule("/export", "4/s", algorithm="gcra", delay=delay, name="export")]
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), rules)
    with Stopwatch() as clock:
        assert statuses(app, "/export", 6) == [200] * 6  # four at once (the rate's burst), two after a wait
    assert clock.elapsed > 0.4 and clock.within(1.5), clock
    assert delay.delayed == 2 and delay.waiting == 0


def test_delay_past_max_wait_is_refused_at_once() -> None:
    rules = [PolicyRule("/export", "1/min", delay=Delay(max_wait=0.5), name="export")]
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), rules)
    with Stopwatch() as clock:
        assert statuses(app, "/export", 2) == [200, 429]
    assert clock.within(0.3), clock


def test_charge_refunds_statuses_that_do_not_count() -> None:
    rules = [PolicyRule("/login", "2/min", methods=["POST"], charge=Charge([401]), name="login")]
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), rules)
    assert statuses(app, "/login", 5, method="POST") == [200] * 5  # successes are refunded
    assert statuses(app, "/login", 3, method="POST", query="status=401") == [401, 401, 429]


def test_charge_refunds_when_the_app_raises() -> None:
    def broken(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        raise RuntimeError("boom")

    rules = [PolicyRule("/login", "1/min", charge=Charge([401]), name="login")]
    app = WSGIPolicyMiddleware(broken, Limiter(MemoryStore()), rules)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            call(app, "/login")  # a 500: does not count


# -- reloads ------------------------------------------------------------------------------------------


def test_reload_on_file_change(policy_file: Path) -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=policy_file, watch=0.05)
    try:
        assert statuses(app, "/api/x", 6, headers={"X-API-Key": "trial-1"}).count(429) == 1
        policy_file.write_text(tiered_policy(basic=50))
        stat = policy_file.stat()
        os.utime(policy_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        deadline = time.monotonic() + 5
        while app.reloader is not None and app.reloader.reloads == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert statuses(app, "/api/x", 10, headers={"X-API-Key": "trial-2"}).count(429) == 0
        policy_file.write_text("version = 1\n[[rules]]\npath = 3\n")
        assert app.reload() is False and app.policy is not None  # the old policy is kept
    finally:
        app.close()


def test_a_reload_the_store_cannot_serve_is_refused(policy_file: Path, tmp_path: Path) -> None:
    limiter = Limiter(_RemoteWithSyncHit(), fallback=None)
    app = WSGIPolicyMiddleware(hello, limiter, policy=policy_file)
    policy_file.write_text(tiered_policy() + "[bans]\nafter = 3\n")
    assert app.reload() is False
    assert app.reloader is not None and "_RemoteWithSyncHit" in str(app.reloader.last_error)
    assert app.bans is None


# -- exactness under threads -----------------------------------------------------------------------------


def test_150_threads_against_a_limit_of_100_get_exactly_100() -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), [PolicyRule("/api/**", "100/min", name="api")])
    barrier = threading.Barrier(150)
    results: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        status = call(app, "/api/x")[0]
        with lock:
            results.append(status)

    threads = [threading.Thread(target=worker) for _ in range(150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 150 and results.count(200) == 100 and results.count(429) == 50


# -- metrics and the failure policy ----------------------------------------------------------------------


def test_metrics_count_the_decisions_and_bans() -> None:
    from ratewarden.metrics import Metrics

    metrics = Metrics()
    rules = [PolicyRule("/api/**", "1/min", name="api")]
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), rules, metrics=metrics, bans=Bans(after=1))
    try:
        assert statuses(app, "/api/x", 3) == [200, 429, 403]
        text = metrics.exposition().decode()
        assert 'ratewarden_requests_limited_total{group="",rule="api"} 1.0' in text
    finally:
        app.close()


def test_a_failing_key_function_under_fail_closed_answers_503() -> None:
    def key(scope: Any) -> str:
        raise RuntimeError("no key")

    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore(), on_error="closed"), [PolicyRule("/api/**", "1/min", key=key)])
    status, headers, body = call(app, "/api/x")
    assert status == 503 and headers["retry-after"] == "1" and b"unavailable" in body
    open_app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), [PolicyRule("/api/**", "1/min", key=key)])
    assert statuses(open_app, "/api/x", 3) == [200, 429, 429]  # charged to the client's address instead
