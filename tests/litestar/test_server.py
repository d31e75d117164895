"""ratewarden.litestar on a real server: ``tests/litestar/app.py`` under uvicorn in its own process,
spoken to over loopback HTTP. Its answers are the core's, byte for byte; a streamed response passes
through; N concurrent requests against a limit of L admit exactly L, on memory and on Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from tests.servers import HOST, RedisStandalone, http_burst

from .app import CHUNK, CHUNKS, frozen

ROOT = Path(__file__).resolve().parents[2]
ADDED_BY_UVICORN = (b"date", b"server")


@contextlib.contextmanager
def serving(**env: str) -> Iterator[str]:
    """``uvicorn tests.litestar.app:create_app --factory``, one worker, on a free loopback port, with
    ``env``; yields its base URL once it answers, stops it at the end."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "uvicorn", "tests.litestar.app:create_app", "--factory", "--host", HOST,
            "--port", str(port), "--workers", "1", "--log-level", "warning", "--no-access-log", "--backlog", "2048"]
    child = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.Popen(argv, cwd=ROOT, env=child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection((HOST, port), timeout=0.2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.05)
        yield f"http://{HOST}:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


async def core_answers(sends: int) -> list[httpx.Response]:
    """What the core's ASGI middleware answers ``sends`` GETs of /api/items, with the served app's
    rule and clock: the answers the door must give."""

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = RateLimitMiddleware(ok, Limiter(MemoryStore(clock=frozen)), [Rule("/api/**", "10/hour", name="api")])
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [await client.get("/api/items") for _ in range(sends)]


def _own(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The response's header list as the app wrote it (uvicorn's Date and Server left out)."""
    return [(name.lower(), value) for name, value in response.headers.raw if name.lower() not in ADDED_BY_UVICORN]


async def test_route_and_app_limits_answer_as_the_core_does() -> None:
    with serving(RW_STORE="memory") as base, httpx.Client(base_url=base, timeout=30) as client:
        orders = [client.post("/api/orders", headers={"X-API-Key": "k1"}) for _ in range(4)]
        other_key = client.post("/api/orders", headers={"X-API-Key": "k2"})
        items = [client.get("/api/items") for _ in range(7)]
        free = client.get("/free")
    assert [r.status_code for r in orders] == [201, 201, 201, 429]
    refused = orders[-1]
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["ratelimit-policy"] == '"api";q=10;w=3600, "3/hour";q=3;w=3600'
    assert refused.headers["ratelimit"].startswith('"3/hour";r=0;t=')
    assert refused.json()["policy"] == "3/hour"
    assert other_key.status_code == 201
    # 4 orders admitted of the app's 10; the refused one charged nothing to "api" (all or nothing).
    assert [r.json()["remaining"] for r in items[:6]] == [5, 4, 3, 2, 1, 0]
    assert items[6].status_code == 429
    assert free.status_code == 200 and "ratelimit" not in free.headers
    # The 429 and an allowed answer's rate-limit headers are the core middleware's, byte for byte,
    # after the same 10 admitted requests against the same rule and clock.
    core = await core_answers(11)
    assert _own(items[6]) == _own(core[10]) and items[6].content == core[10].content
    rate_headers = [(n, v) for n, v in _own(items[5]) if b"ratelimit" in n]
    assert rate_headers == [(n, v) for n, v in _own(core[9]) if b"ratelimit" in n] and len(rate_headers) == 5


def test_a_streamed_response_passes_through_with_the_headers() -> None:
    with serving(RW_STORE="memory") as base, httpx.Client(base_url=base, timeout=30) as client, \
            client.stream("GET", "/api/stream") as response:
        chunks = list(response.iter_raw())
        headers = response.headers
    assert response.status_code == 200
    assert b"".join(chunks) == CHUNK * CHUNKS
    assert headers["transfer-encoding"] == "chunked"  # sent as it came, never buffered into one body
    assert headers["x-ratelimit-remaining"] == "9" and headers["ratelimit"].startswith('"api";r=9;t=')


def _exactly(base: str, path: str, total: int, limit: int) -> None:
    port = int(base.rsplit(":", 1)[1])
    codes = http_burst(port, path, total, concurrency=total)
    assert set(codes) <= {200, 429}, sorted(set(codes))
    assert codes.count(200) == limit, f"{codes.count(200)} admitted of {total} against {limit}"


def test_concurrent_requests_admit_exactly_the_limit_on_memory() -> None:
    with serving(RW_STORE="memory", RW_LIMIT="100") as base:
        _exactly(base, "/limited", 150, 100)


def test_concurrent_requests_admit_exactly_the_limit_on_redis(redis_standalone: RedisStandalone) -> None:
    prefix = f"rw{uuid.uuid4().hex[:10]}"
    with serving(RW_STORE=redis_standalone.url, RW_LIMIT="100", RW_PREFIX=prefix) as base:
        _exactly(base, "/limited", 150, 100)
