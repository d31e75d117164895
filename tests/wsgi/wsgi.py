"""Direct WSGI calls for tests: a made-up environ, a recording ``start_response``, the reply."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

WSGIApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    calls: int = 0  # how many times start_response was called

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def headers_named(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers as an ASGI server would send them (latin-1 bytes)."""
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]


def environ(
    path: str = "/",
    method: str = "GET",
    headers: dict[str, str] | None = None,
    remote: str | None = "203.0.113.7",
    query: str = "",
) -> dict[str, Any]:
    """A PEP 3333 environ: ``path`` as the server gives it (its UTF-8 bytes as a latin-1 string)."""
    env: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path.encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if remote is not None:
        env["REMOTE_ADDR"] = remote
        env["REMOTE_PORT"] = "50000"
    for name, value in (headers or {}).items():
        key = name.upper().replace("-", "_")
        env[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key] = value
    return env


def call(app: WSGIApp, env: dict[str, Any]) -> Reply:
    """Run one request through ``app`` as a server would: the body read, ``close()`` called."""
    reply = Reply(status=0)

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        assert isinstance(status, str) and all(isinstance(k, str) and isinstance(v, str) for k, v in headers)
        reply.status = int(status.split(" ", 1)[0])
        reply.headers = list(headers)
        reply.calls += 1
        return lambda data: None

    result = app(env, start_response)
    try:
        reply.body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return reply


def request(app: WSGIApp, path: str = "/", **kw: Any) -> Reply:
    return call(app, environ(path, **kw))
