"""Rules match the path the application routes to: ``/files//report.txt``, ``/files/./report.txt``
and ``/files/x/%2e%2e/report.txt`` are the same file to Starlette's ``StaticFiles``, so one limit
counts them together (they used to pass a rule on ``/files/report.txt`` unlimited)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule, RuleSet
from ratewarden.rules import normalize_path
from tests.core.asgi import call, http_scope
from tests.servers import uvicorn_in_thread
from tests.vectors.runner import FakeClock

#: Spellings of /files/report.txt (as sent on the wire) that StaticFiles serves as that file.
SPELLINGS = [
    "/files/report.txt", "/files//report.txt", "/files/./report.txt", "/files/x/%2e%2e/report.txt", "/files/report.txt/",
]


@pytest.mark.parametrize(
    ("path", "normalised"),
    [
        ("/", "/"),
        ("", ""),
        ("*", "*"),
        ("/api/users", "/api/users"),
        ("/api/users/", "/api/users/"),
        ("//", "/"),
        ("//api///users", "/api/users"),
        ("/api/users//", "/api/users/"),
        ("/./api/./users/.", "/api/users/"),
        ("/api/x/../users", "/api/users"),
        ("/api/x/..", "/api/"),
        ("/..", "/"),
        ("/../../api", "/api"),
        ("/api//../users", "/users"),  # slashes merged first, as os.path.normpath (StaticFiles) does
        ("/api/.hidden/..x/.../y", "/api/.hidden/..x/.../y"),  # not dot segments
        ("/api/%2e%2e/users", "/api/%2e%2e/users"),  # already decoded by the server: not decoded again
        ("/a b/é", "/a b/é"),
    ],
)
def test_normalize_path(path: str, normalised: str) -> None:
    assert normalize_path(path) == normalised


def test_unchanged_path_is_the_same_object() -> None:
    """The common case (nothing to normalise) builds no new string."""
    path = "/api/users/42"
    assert normalize_path(path) is path


def test_every_integration_matches_the_normalised_path() -> None:
    rules = RuleSet([Rule("/files/report.txt", "3/min"), Rule("/admin/**", bypass=True), Rule("/ws", "1/s", websocket=True)])
    (report,) = rules.match("GET", "/files/report.txt")
    for spelling in ["/files//report.txt", "/files/./report.txt", "/files/x/../report.txt", "//files/report.txt"]:
        assert rules.match("GET", spelling) == (report,)
    # A bypass rule no longer lets "/admin/../files/report.txt" (StaticFiles: /files/report.txt) through.
    assert rules.match("GET", "/admin/../files/report.txt") == (report,)
    assert rules.match("GET", "/files/report.txt/../../admin/x") == ()
    assert len(rules.match("GET", "/ws/.", websocket=True)) == 1  # "/ws/": the limit on "/ws" covers it
    assert len(rules.match("GET", "/x/../ws", websocket=True)) == 1


def uvicorn_scope(wire_path: str, root_path: str = "") -> dict[str, Any]:
    """The scope uvicorn builds for a request line's path: ``path`` percent-decoded, with the root path."""
    scope = http_scope(root_path + unquote(wire_path))
    scope["raw_path"] = (root_path + wire_path).encode("ascii")
    scope["root_path"] = root_path
    return scope


@pytest.fixture
def static_dir(tmp_path: Path) -> Path:
    (tmp_path / "report.txt").write_text("the report\n")
    return tmp_path


def static_app(directory: Path, limiter: Limiter) -> RateLimitMiddleware:
    app = Starlette(routes=[Mount("/files", StaticFiles(directory=directory))])
    return RateLimitMiddleware(app, limiter=limiter, rules=[Rule("/files/report.txt", "3/min")])


@pytest.mark.parametrize("root_path", ["", "/prefix"])
async def test_static_files_spellings_share_one_limit(static_dir: Path, root_path: str) -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    app = static_app(static_dir, limiter)
    if root_path:  # a rule names the full path (root path included), as scope["path"] does
        app.rules.replace([Rule(root_path + "/files/report.txt", "3/min")])
    served: dict[str, list[int]] = {}
    for _ in range(6):
        for spelling in SPELLINGS:
            reply = await call(app, uvicorn_scope(spelling, root_path))
            served.setdefault(spelling, []).append(reply.status)
            if reply.status == 200:
                assert reply.body == b"the report\n"
    statuses = [status for row in served.values() for status in row]
    assert statuses.count(200) == 3, served  # was 3 + 6 * 4: every other spelling unlimited
    assert statuses.count(429) == 6 * len(SPELLINGS) - 3, served


async def test_static_files_through_httpx(static_dir: Path) -> None:
    """The same through an HTTP client (httpx drops "." segments itself; "//" and "%2e%2e" it sends)."""
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    transport = httpx.ASGITransport(app=static_app(static_dir, limiter))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        statuses = [(await client.get(spelling)).status_code for _ in range(3) for spelling in SPELLINGS]
    assert statuses.count(200) == 3, statuses
    assert statuses.count(429) == 3 * len(SPELLINGS) - 3, statuses


@pytest.fixture
def static_server(static_dir: Path) -> Iterator[int]:
    """A real uvicorn serving the limited StaticFiles app; yields its port."""
    app = static_app(static_dir, Limiter(MemoryStore(clock=FakeClock(6000.0))))
    with uvicorn_in_thread(app) as port:
        yield port


def raw_get(port: int, wire_path: str) -> int:
    """The status of ``GET wire_path`` sent byte for byte (no client normalises it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"GET {wire_path} HTTP/1.1\r\nHost: testserver\r\nConnection: close\r\n\r\n".encode("ascii"))
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


async def test_static_files_spellings_on_a_real_server(static_server: int) -> None:
    statuses = await asyncio.to_thread(
        lambda: [raw_get(static_server, spelling) for _ in range(6) for spelling in SPELLINGS]
    )
    assert statuses.count(200) == 3, statuses
    assert statuses.count(429) == 6 * len(SPELLINGS) - 3, statuses


def test_a_limit_on_a_path_covers_its_trailing_slash_spelling() -> None:
    """``StaticFiles`` serves ``/files/report.txt/`` (and ``/.``, ``//`` after it) as the file: a
    rule on the file limits those spellings too; a bypass covers only the spelling it matches."""
    rules = RuleSet([Rule("/files/report.txt", "3/min", name="file"), Rule("/open/", "1/min", bypass=True),
                     Rule("/open", "2/min", name="open")])
    for spelling in ("/files/report.txt/", "/files/report.txt/.", "/files/report.txt//", "/files//x/../report.txt/"):
        assert [c.rule.name for c in rules.match("GET", spelling)] == ["file"], spelling
    assert [c.rule.name for c in rules.match("GET", "/open")] == ["open"]
    assert rules.match("GET", "/open/") == ()  # its own bypass
    assert rules.match("GET", "/") == ()
