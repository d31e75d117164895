"""``ratewarden serve --http-front compiled`` as a real process, spoken to with httpx and raw sockets:
the same status, headers and body as the python HTTP server for every endpoint, exact under
concurrency, and the HTTP bounds of ``test_serve_bounds`` (408, 431, the connection cap's 503, bad
JSON's 400) run again here against the compiled front door."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.front_door import require_compiled_front

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


def _answers(url: str) -> list[tuple[int, list[tuple[str, str]], str]]:
    """One run of requests covering every endpoint, allowed and refused, and bad descriptions."""
    requests: list[tuple[str, str, dict[str, str], bytes | None]] = [
        *[("GET", "/check", {"X-Original-URI": "/api/items"}, None)] * 3,  # the limit is 2
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
    out = []
    with httpx.Client(base_url=url, timeout=python_bounds.SLACK) as client:
        for method, path, headers, body in requests:
            answer = client.request(method, path, headers=headers, content=body)
            pairs = [(k, "N" if k in _TIMED else _normal(v)) for k, v in answer.headers.multi_items()]
            out.append((answer.status_code, pairs, _normal(answer.text)))
    return out


def test_every_endpoint_answers_as_the_python_server(tmp_path: Path) -> None:
    answers = []
    for front in ("python", "compiled"):
        directory = tmp_path / front
        directory.mkdir()
        server = _start(directory, "--http-front", front, "--no-metrics", limit="2/hour")
        try:
            answers.append(_answers(server.url))
        finally:
            server.stop()
    python, compiled = answers
    assert [a[0] for a in python] == [200, 200, 429, 403, 200, 200, 400, 400, 200, 200, 400, 405, 404, 200, 200, 404]
    for sent, (want, got) in enumerate(zip(python, compiled, strict=True)):
        assert got == want, f"request {sent}"


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
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "serve", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert "HTTP front door: python (uvicorn)" in out.stdout
    server = _start(tmp_path, "--http-front", "compiled")
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
