"""``scope_of``: a Sanic request as the ASGI-shaped scope that rules, key functions and the check
layer read, so every key function works unchanged under Sanic."""

from __future__ import annotations

from typing import Any

from sanic.request import Request

__all__ = ["REQUEST_KEY", "scope_of"]

REQUEST_KEY = "sanic.request"
"""Where the scope holds the Sanic request, for a key function that reads it (``request.ctx``)."""


def scope_of(request: Request) -> dict[str, Any]:
    """The request's scope: ``type``, ``method`` (as sent), ``path`` (as Sanic routes it: not
    percent-decoded), ``query_string``, ``headers`` (lower-case names, in bytes), ``client`` (the
    socket's peer: a forwarding header counts only through ``ClientIP(trusted_proxies=...)``),
    ``state`` and ``sanic.request``.

    Args:
        request: The Sanic request.
    """
    return {
        "type": "http",
        "method": request.method,
        "path": request.path,
        "query_string": request.query_string.encode("utf-8", "surrogateescape"),
        # Sanic decodes the header block as UTF-8 with surrogateescape: this gives back its bytes
        # (any byte a client sends, in a name too, never an error).
        "headers": [
            (name.lower().encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
            for name, value in request.headers.items()
        ],
        "client": (request.ip, request.port) if request.ip else None,
        "state": {},
        REQUEST_KEY: request,
    }
