"""A Django request as the ASGI-shaped scope the rules, key functions and check layer read.

Under ASGI, ``request.scope`` already is one; under WSGI, ``request.META`` is the environ, read by
``ratewarden.wsgi.scope_of``. Django's own keys (``user``, ``post:<name>``, callables of the
request) need the request itself: the check puts it in the scope while it runs (``REQUEST_KEY``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..types import Scope
from ..wsgi.scope import scope_of

__all__ = ["REQUEST_KEY", "in_event_loop", "request_of", "request_scope"]

REQUEST_KEY = "ratewarden.django.request"
"""Where the request is in the scope while it is checked (removed afterwards: no reference cycle)."""


def request_scope(request: Any) -> dict[str, Any]:
    """The request's scope: ``request.scope`` under ASGI, built from ``request.META`` under WSGI
    (once per request, kept in ``META``).

    Args:
        request: A Django ``HttpRequest``.
    """
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        return scope
    return scope_of(request.META)


def request_of(scope: Scope) -> Any:
    """The Django request being checked with ``scope``; a ``LookupError`` outside a check by
    ``ratewarden.django`` (a Django key function used elsewhere).

    Args:
        scope: The scope given to a key function.
    """
    request = scope.get(REQUEST_KEY)
    if request is None:
        raise LookupError(
            "a ratewarden.django key (user, post:<name> or a callable of the request) was used outside "
            "ratewarden.django's middleware or @limit: no Django request to read"
        )
    return request


def in_event_loop() -> bool:
    """Whether this thread runs an event loop (async code, where Django forbids database access)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
