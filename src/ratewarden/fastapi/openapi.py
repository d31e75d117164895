"""OpenAPI documentation of declared limits: the 429 answer and the rate-limit headers.

``ratewarden.fastapi.install(app)`` wraps ``app.openapi`` so that every operation with a
``Depends(RateLimit(...))`` in its dependency tree (route, router or app level) documents the
``application/problem+json`` 429 response with ``Retry-After`` and, following the dependency's
``headers``/``header_style``, the ``RateLimit``/``RateLimit-Policy`` and ``X-RateLimit-*`` headers
on its 429 and success responses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from .dependency import RateLimit
from .routes import declared_limits

__all__ = ["PROBLEM_SCHEMA", "add_limit_docs", "document_limits", "limit_responses", "rate_limit_header_docs"]

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "RateLimitProblem",
    "type": "object",
    "description": "RFC 9457 problem details of a rate-limited request.",
    "properties": {
        "type": {"type": "string", "example": "about:blank"},
        "title": {"type": "string", "example": "Too Many Requests"},
        "status": {"type": "integer", "example": 429},
        "detail": {"type": "string"},
        "policy": {"type": "string", "description": "The limit that was exceeded."},
        "limit": {"type": "integer", "description": "Its quota."},
        "retry_after": {
            "type": ["integer", "null"],
            "description": "Seconds to wait; null when the request can never fit the limit.",
        },
    },
    "required": ["type", "title", "status", "detail"],
}

_IETF = {
    "RateLimit": "Remaining quota and seconds until it resets: `\"name\";r=<remaining>;t=<seconds>` "
    "(draft-ietf-httpapi-ratelimit-headers-10).",
    "RateLimit-Policy": "Every limit that applied: `\"name\";q=<quota>;w=<window seconds>`, comma-separated.",
}
_LEGACY = {
    "X-RateLimit-Limit": "Quota of the binding limit.",
    "X-RateLimit-Remaining": "Requests left in the current window.",
    "X-RateLimit-Reset": "Seconds until the quota resets.",
}


def _header(description: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": kind}}


def rate_limit_header_docs(dependency: RateLimit) -> dict[str, Any]:
    """The rate-limit headers ``dependency`` sends, as OpenAPI header objects.

    Args:
        dependency: The ``RateLimit`` dependency of the operation.
    """
    if not dependency.answers.with_429:
        return {}
    style = dependency.answers.style
    docs: dict[str, Any] = {}
    if style in ("ietf", "both"):
        docs.update({name: _header(text) for name, text in _IETF.items()})
    if style in ("legacy", "both"):
        docs.update({name: _header(text, "integer") for name, text in _LEGACY.items()})
    return docs


def limit_responses(dependency: RateLimit) -> dict[str, Any]:
    """The 429 response object for an operation limited by ``dependency``.

    Args:
        dependency: The ``RateLimit`` dependency of the operation.
    """
    headers = {"Retry-After": _header("Seconds to wait before retrying.", "integer")}
    headers.update(rate_limit_header_docs(dependency))
    return {
        "description": "Too Many Requests: a rate limit of this operation was exceeded.",
        "headers": headers,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/RateLimitProblem"}}},
    }


def _operations(routes: Sequence[BaseRoute]) -> Iterator[tuple[str, set[str], Any]]:
    """(path, methods, dependant) of every route the schema documents, included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            if route.include_in_schema:
                yield route.path_format, set(route.methods or ()), route.dependant
            continue
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is None:
            continue
        for context in contexts():
            if isinstance(context.original_route, APIRoute) and context.include_in_schema:
                yield context.path_format, set(context.methods or ()), context.dependant


def add_limit_docs(schema: dict[str, Any], routes: Sequence[BaseRoute]) -> dict[str, Any]:
    """Add the 429 response and rate-limit headers to the limited operations of ``schema``.

    Args:
        schema: The OpenAPI schema, edited in place.
        routes: The app's routes, whose dependencies declare the limits.
    """
    paths = schema.get("paths", {})
    used = False
    for path, methods, dependant in _operations(routes):
        limits = declared_limits(dependant) if dependant is not None else []
        if not limits or path not in paths:
            continue
        first = limits[0]
        for method in methods:
            operation = paths[path].get(method.lower())
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            if "429" not in responses:
                responses["429"] = limit_responses(first)
                used = True
            if first.answers.always:
                for status, response in responses.items():
                    if str(status).startswith("2"):
                        response.setdefault("headers", {}).update(rate_limit_header_docs(first))
    if used:
        schema.setdefault("components", {}).setdefault("schemas", {}).setdefault("RateLimitProblem", PROBLEM_SCHEMA)
    return schema


def document_limits(app: FastAPI) -> None:
    """Make ``app.openapi()`` document the declared limits (once, when the schema is built).

    Args:
        app: The FastAPI app.
    """
    original: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        app.openapi_schema = add_limit_docs(original(), app.routes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
