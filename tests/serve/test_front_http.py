"""``ratewarden serve --http-front compiled`` as a real process, spoken to with httpx and raw sockets:
the same status, headers and body as the python HTTP server for every endpoint, exact under
concurrency, and the HTTP bounds of ``test_serve_bounds`` (408, 431, the connection cap's 503, bad
JSON's 400) run again here against the compiled front door."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.policy.loader import parse_policy
from ratewarden.serve.front_http import start_http_front
from ratewarden.serve.http import ServeApp
from ratewarden.types import Receive, Scope, Send
from tests.front_door import require_compiled_front
from tests.servers import RedisStandalone

from . import test_serve_bounds as python_bounds
from .test_serve_cli import POLICY, Serve


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_front()


def _start(tmp_path: Path, *options: str, limit: str = "5/hour", workers: int = 1) -> Serve:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("{basic}", limit))
    server = Serve(tmp_path, str(policy), "--watch", "0", "--workers", str(workers), *options)
    try:
        return server.ready(workers)
    except BaseException:
        server.stop()
        raise


def _serve(tmp_path: Path, *options: str) -> Iterator[Serve]:
    server = _start(tmp_path, *options)
    try:
        yield server
    finally:
        server.stop()


# -- the HTTP bounds, as test_serve_bounds tries them on the python server --------------------------------


@pytest.fixture
def bounded_serve(tmp_path: Path) -> Iterator[Serve]:
    yield from _serve(tmp_path, "--http-front", "compiled", "--http-timeout", "0.5", "--http-max-header-size", "8192",
                      "--http-max-connections", "20")


@pytest.fixture(scope="module")
def default_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from _serve(tmp_path_factory.mktemp("serve"), "--http-front", "compiled")


test_http_unfinished_requests_are_408_and_closed = python_bounds.test_http_unfinished_requests_are_408_and_closed
test_http_oversized_headers_are_431 = python_bounds.test_http_oversized_headers_are_431
test_http_headers_over_the_default_bound_are_431 = python_bounds.test_http_headers_over_the_default_bound_are_431
test_http_connections_over_the_cap_are_503_at_once_and_checks_go_on = (
    python_bounds.test_http_connections_over_the_cap_are_503_at_once_and_checks_go_on)
test_http_json_that_cannot_be_used_is_400 = python_bounds.test_http_json_that_cannot_be_used_is_400


def test_a_head_far_over_the_bound_is_431_and_the_worker_goes_on(default_serve: Serve) -> None:
    head = b"GET /check HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n"  # hyper's own refusal
    sock = python_bounds._raw(default_serve.port, b"")
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before all of it was sent
        sock.sendall(head)
    assert python_bounds._answer(sock).startswith(b"HTTP/1.1 431 ")
    assert httpx.get(f"{default_serve.url}/healthz", timeout=python_bounds.SLACK).status_code == 200


# -- the same answers as the python server --------------------------------------------------------------

_TIMES = [  # seconds to the window's end: the same on both servers but for a second boundary between them
    (re.compile(r";t=\d+"), ";t=T"),
    (re.compile(r"\d+(\.\d+)?s\b"), "Ns"),
    (re.compile(r'"(reset|retry_after)": [\d.]+'), r'"\1": N'),
    (re.compile(r'"(x-ratelimit-reset|retry-after)": "\d+"'), r'"\1": "N"'),
]
_TIMED = {"x-ratelimit-reset", "retry-after", "content-length"}  # lengths: of bodies with times in them


def _normal(text: str) -> str:
    for pattern, replacement in _TIMES:
        text = pattern.sub(replacement, text)
    return text


Request = tuple[str, str, dict[str, str], bytes | None]
Answer = tuple[int, list[tuple[str, str]], str]
ITEMS = {"X-Original-URI": "/api/items"}

#: One run of requests covering every endpoint, allowed and refused, and bad descriptions.
EVERY_ENDPOINT: list[Request] = [
    *[("GET", "/check", ITEMS, None)] * 3,  # the limit is 2
    ("GET", "/check?deny_status=403", {"X-Original-URI": "/api/items"}, None),
    ("GET", "/check", {"X-Original-URI": "/api/items", "X-API-Key": "pk-alice"}, None),
    ("GET", "/check", {"X-Forwarded-Uri": "/elsewhere", "X-Forwarded-Method": "POST"}, None),
    ("GET", "/check", {"X-Original-URI": "api/no-slash"}, None),
    ("GET", "/check?deny_status=500", {"X-Original-URI": "/api/items"}, None),
    ("POST", "/v1/check", {"Content-Type": "application/json"}, b'{"path": "/api/items", "client": "10.0.0.9"}'),
    ("POST", "/v1/check", {}, b'{"path": "/api/items", "headers": {"X-API-Key": "pk-alice"}, "cost": 3}'),
    ("POST", "/v1/check", {}, b"not json"),
    ("GET", "/v1/check", {}, None),
    ("POST", "/json", {}, b"{}"),
    ("GET", "/healthz", {}, None),
    ("HEAD", "/healthz", {}, None),
    ("GET", "/nowhere", {}, None),
]


def _answers(url: str, requests: list[Request]) -> list[Answer]:
    """Each request's status, headers and body, sent in turn on one connection (times normalised)."""
    with httpx.Client(base_url=url, timeout=python_bounds.SLACK) as client:
        return [_normalised(client.request(method, path, headers=headers, content=body))
                for method, path, headers, body in requests]


def _normalised(answer: httpx.Response) -> Answer:
    pairs = [(k, "N" if k in _TIMED else _normal(v)) for k, v in answer.headers.multi_items()]
    return answer.status_code, pairs, _normal(answer.text)


def _both(tmp_path: Path, run: Callable[[str], list[Answer]], *options: str, store: str = "",
          limit: str = "2/hour") -> tuple[list[Answer], list[Answer]]:
    """What ``run`` gets from ``--http-front python``, then from ``compiled`` (``run`` takes the
    server's URL); ``{db}`` in ``store`` is a Redis database of each front's own (1, then 2)."""
    answers = []
    for db, front in enumerate(("python", "compiled"), 1):
        directory = tmp_path / front
        directory.mkdir()
        stored = ("--store", store.format(db=db)) if store else ()
        server = _start(directory, "--http-front", front, "--no-metrics", *stored, *options, limit=limit)
        try:
            answers.append(run(server.url))
        finally:
            server.stop()
    return answers[0], answers[1]


def test_every_endpoint_answers_as_the_python_server(tmp_path: Path) -> None:
    python, compiled = _both(tmp_path, lambda url: _answers(url, EVERY_ENDPOINT))
    assert [a[0] for a in python] == [200, 200, 429, 403, 200, 200, 400, 400, 200, 200, 400, 405, 404, 200, 200, 404]
    _same(python, compiled)


def _same(python: list[Answer], compiled: list[Answer]) -> None:
    for sent, (want, got) in enumerate(zip(python, compiled, strict=True)):
        assert got == want, f"request {sent}"


def _from(client: str | None = None, forwarded: str | None = None) -> dict[str, str]:
    headers = dict(ITEMS)
    if client is not None:
        headers["X-Real-IP"] = client
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return headers


#: ``/check`` described by a proxy: whose the count is follows ``X-Real-IP``, else the last
#: ``X-Forwarded-For`` entry, from a trusted caller only (the limit is 2 per client).
PROXIED: list[Request] = [
    *[("GET", "/check", _from("203.0.113.7"), None)] * 3,
    ("GET", "/check?deny_status=401", _from("203.0.113.7"), None),
    ("GET", "/check?a=1&deny_status=403&b", _from(forwarded="198.51.100.1, 203.0.113.8"), None),
    ("GET", "/check", _from("not an address", "203.0.113.7"), None),
    ("GET", "/check", _from("[::ffff:203.0.113.9]:443"), None),
    ("GET", "/check?deny_status=401", ITEMS, None),
]


@pytest.mark.parametrize(("trusted", "statuses"), [
    ("127.0.0.1", [200, 200, 429, 401, 200, 429, 200, 200]),
    ("10.0.0.0/8", [200, 200, 429, 401, 403, 429, 429, 401]),  # this caller's headers are not believed
])
def test_check_from_a_proxy_answers_as_the_python_server(tmp_path: Path, trusted: str, statuses: list[int]) -> None:
    python, compiled = _both(tmp_path, lambda url: _answers(url, PROXIED), "--trusted-proxy", trusted)
    assert [a[0] for a in python] == statuses
    _same(python, compiled)


def test_check_on_redis_answers_as_the_python_server_then_fails_closed(
    tmp_path: Path, redis_standalone: RedisStandalone
) -> None:
    def run(url: str) -> list[Answer]:
        answers = _answers(url, [*[("GET", "/check", ITEMS, None)] * 3, ("GET", "/check?deny_status=403", ITEMS, None)])
        redis_standalone.stop()
        try:
            fresh = {**ITEMS, "X-API-Key": "trial-down"}  # not in the rejection cache: the store must answer
            return answers + _answers(url, [("GET", "/check", fresh, None), ("GET", "/check?deny_status=403", fresh, None)])
        finally:
            redis_standalone.start()

    store = redis_standalone.url.rpartition("/")[0] + "/{db}"
    python, compiled = _both(tmp_path, run, "--on-error", "closed", store=store)
    assert [a[0] for a in python] == [200, 200, 429, 403, 503, 503]
    _same(python, compiled)


class _CountedServeApp(ServeApp):
    """``ServeApp`` counting the requests it answers as an ASGI app, by path."""

    asgi_paths: list[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.asgi_paths.append(scope.get("path", ""))
        await super().__call__(scope, receive, send)


def test_check_skips_the_asgi_exchange_and_answers_as_through_it() -> None:
    policy = parse_policy(POLICY.replace("{basic}", "2/hour"), "toml", "policy.toml")
    app = _CountedServeApp(Limiter(MemoryStore()), policy)
    app.asgi_paths = []

    async def answers() -> list[httpx.Response]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = start_http_front(app, sock)
        served = asyncio.ensure_future(server.serve())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=30) as client:
                return [
                    *[await client.get("/check", headers=ITEMS) for _ in range(3)],
                    await client.get("/check?deny_status=403", headers=ITEMS),
                    await client.get("/check?deny_status=500", headers=ITEMS),
                    await client.get("/%63heck?deny_status=403", headers=ITEMS),  # /check, through the ASGI app
                    await client.get("/healthz"),
                ]
        finally:
            server.should_exit = True
            await served
            sock.close()

    got = asyncio.run(answers())
    assert [a.status_code for a in got] == [200, 200, 429, 403, 400, 403, 200]
    assert app.asgi_paths == ["/check", "/healthz"]  # only the percent-encoded /check went through ASGI
    assert got[1].headers["ratelimit"].startswith('"api.basic";r=0;') and got[3].headers["retry-after"]
    assert _normalised(got[5]) == _normalised(got[3])
    assert got[4].json() == {"status": 400, "error": "deny_status must be 401, 403 or 429, got '500'"}


@pytest.mark.parametrize("workers", [1, 2])
def test_exact_under_concurrency(tmp_path: Path, workers: int) -> None:
    limit, calls = 20, 120
    server = _start(tmp_path, "--http-front", "compiled", limit=f"{limit}/hour", workers=workers)

    async def burst() -> Counter[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=calls)) as client:
            answers = await asyncio.gather(*[
                client.get("/check", headers={"X-Original-URI": "/api/items"}) for _ in range(calls)])
        return Counter(a.status_code for a in answers)

    try:
        assert asyncio.run(burst()) == {200: limit, 429: calls - limit}
    finally:
        server.stop()


def test_version_and_log_name_the_http_front_door(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "serve", "--http-front", "compiled", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "HTTP front door: compiled (hyper in ratewarden._front" in out.stdout
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "serve", "--http-front", "python", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert "HTTP front door: python (uvicorn); not compiled: --http-front python" in out.stdout
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "serve", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert "HTTP front door: compiled (hyper in ratewarden._front" in out.stdout  # auto, where it imports
    for asked in ("compiled", "auto"):
        server = _start(tmp_path, "--http-front", asked)
        try:
            assert server.events("started")[0]["http_front"] == "compiled"
        finally:
            assert server.stop() == 0


def test_without_the_extension_http_front_compiled_exits_2(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("{basic}", "5/hour"))
    code = "import sys; sys.modules['ratewarden._front'] = None; from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    base = [sys.executable, "-c", code, "serve", str(policy), "--http", "127.0.0.1:1"]
    refused = subprocess.run([*base, "--http-front", "compiled"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("ratewarden serve: --http-front compiled: ratewarden._front does not import")
    assert "Traceback" not in refused.stderr
    version = subprocess.run([*base, "--http-front", "compiled", "--version"], capture_output=True, text=True, timeout=60)
    assert "HTTP front door: none (--http-front compiled: ratewarden._front does not import" in version.stdout
    version = subprocess.run([*base, "--version"], capture_output=True, text=True, timeout=60)
    assert "HTTP front door: python (uvicorn); not compiled: ratewarden._front does not import" in version.stdout
