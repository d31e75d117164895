"""Direct ASGI calls for tests: no HTTP client, so thousands of requests stay fast."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
Header = tuple[str | bytes, str | bytes]


@dataclass
class Reply:
    status: int
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    chunks: int = 0

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        wanted = name.lower().encode()
        for key, value in self.raw_headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    def headers_named(self, name: str) -> list[str]:
        wanted = name.lower().encode()
        return [v.decode("latin-1") for k, v in self.raw_headers if k.lower() == wanted]

    def json(self) -> Any:
        return json.loads(self.body)


def _encode(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


def http_scope(
    path: str = "/",
    method: str = "GET",
    headers: Iterable[Header] = (),
    client: tuple[str, int] | None = ("203.0.113.7", 50000),
    query: str | bytes = b"",
) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "root_path": "",
        "query_string": _encode(query),
        "headers": [(_encode(k).lower(), _encode(v)) for k, v in headers],
        "server": ("testserver", 80),
    }
    if client is not None:
        scope["client"] = client
    return scope


async def call(app: ASGIApp, scope: dict[str, Any], body: bytes = b"") -> Reply:
    """Run one HTTP request through ``app`` and collect the response."""
    done = asyncio.Event()
    sent_body = False
    reply = Reply(status=0)

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert reply.status == 0, "response started twice"
            reply.status = message["status"]
            reply.raw_headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            reply.body += message.get("body", b"")
            reply.chunks += 1
            if not message.get("more_body", False):
                done.set()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return reply


async def request(
    app: ASGIApp,
    path: str = "/",
    method: str = "GET",
    headers: Iterable[Header] = (),
    client: tuple[str, int] | None = ("203.0.113.7", 50000),
    query: str | bytes = b"",
) -> Reply:
    return await call(app, http_scope(path, method, headers, client, query))
