"""What the HTTP check API reads and writes: request bodies (bounded) parsed as JSON objects, the
``ServeError`` a request the service cannot decide raises, and answers written as one response
start and one body."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable
from typing import Any

from ..errors import RatewardenError
from ..types import Receive, Send

__all__ = [
    "MAX_BODY", "Headers", "ServeError", "error_answer", "field", "json_object", "read_body", "respond", "seconds",
    "send_answer", "send_text",
]

#: The largest request body read (``/v1/check``, ``/json``); more is answered 413.
MAX_BODY = 64 * 1024
Headers = list[tuple[bytes, bytes]]


class ServeError(RatewardenError):
    """A request the service cannot decide (a bad description, no policy loaded): answered with
    ``status`` and the message, never a crash."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def seconds(value: float) -> float | None:
    """``value`` for a JSON answer: rounded to the millisecond, None for infinity."""
    return None if math.isinf(value) else round(value, 3)


def field(data: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """``data[name]`` (``default`` when missing), a ``ServeError`` 400 when it is not a ``kind``."""
    value = data.get(name, default)
    if not isinstance(value, kind) and not (value is None and default is None):  # null only where it is the default
        what = "null" if value is None else type(value).__name__
        raise ServeError(400, f"{name!r} must be {'an object' if kind is dict else 'a string'}, got {what}")
    return value


def json_object(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object; anything else is a ``ServeError`` 400 saying what is wrong."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServeError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ServeError(400, "the body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ServeError(400, f"the body must be a JSON object, got {type(data).__name__}")
    return data


async def read_body(receive: Receive) -> bytes:
    """The request body, at most ``MAX_BODY`` bytes (more is a ``ServeError`` 413)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_BODY:
            raise ServeError(413, f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, headers: Headers, body: bytes) -> None:
    """Answer with ``headers`` as they are (the complete list: content length included)."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def send_answer(send: Send, status: int, headers: Headers, body: bytes) -> Awaitable[None]:
    """Answer with ``headers`` and the body's content length."""
    return respond(send, status, [*headers, (b"content-length", b"%d" % len(body))], body)


async def send_text(send: Send, status: int, text: str) -> None:
    """Answer ``text`` as plain text."""
    await send_answer(send, status, [(b"content-type", b"text/plain; charset=utf-8")], text.encode())


def error_answer(status: int, message: str) -> tuple[int, Headers, bytes]:
    """The service's JSON error ``{"status": ..., "error": message}``: status, header list and body."""
    body = json.dumps({"status": status, "error": message}).encode()
    return status, [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))], body
