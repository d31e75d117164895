"""Reading what identifies a caller from a request: a header, a bearer token, a query parameter,
and the digest that keeps a secret out of storage keys, logs and metrics.

Shared by the key functions (``ratewarden.keys``) and the policy identity
(``ratewarden.policy.tiers``), so both read the same value from the same request.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl

from .errors import AmbiguousRequest
from .types import Scope

__all__ = ["bearer_token_of", "digest", "header_value", "query_value"]


def header_value(scope: Scope, name: bytes) -> str | None:
    """The first header called ``name`` (lower-case bytes) as text, or ``None``.

    Args:
        scope: The ASGI connection scope.
        name: The header's name, as lower-case bytes.
    """
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def bearer_token_of(scope: Scope) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the first ``Authorization`` header, as
    the header is defined once per request), or ``None`` without one.

    Args:
        scope: The ASGI connection scope.
    """
    value = header_value(scope, b"authorization")
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


def query_value(scope: Scope, name: str) -> str | None:
    """The non-empty value of query parameter ``name``, or ``None``; ``AmbiguousRequest`` when it
    has two different ones (``?api_key=a&api_key=b``): Flask's app reads the first, Django's and
    Starlette's the last, so keying on either lets a caller be served on the other uncharged.

    Args:
        scope: The ASGI connection scope.
        name: The query parameter's name.
    """
    qs = scope.get("query_string") or b""
    found: str | None = None
    if qs:
        for k, v in parse_qsl(qs.decode("latin-1"), keep_blank_values=False):
            if k == name:
                if found is not None and v != found:
                    raise AmbiguousRequest(
                        f"query parameter {name!r} is given more than once with different values; send it once"
                    )
                found = str(v)
    return found


def digest(value: str) -> str:
    """A short hash of a secret (24 hex characters), stored in its place.

    Args:
        value: The secret.
    """
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
