"""Key functions: who a request is charged to.

A key function takes the ASGI ``scope`` and returns a string (or ``None`` for "no value"); it may
be sync or async. Client-supplied headers are never trusted for the client address unless the
peer is a configured trusted proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ._mypyc import mypyc_attr
from .caches import remember
from .credentials import bearer_token_of, digest, header_value, query_value
from .errors import ConfigurationError
from .scopes import value_of
from .types import Scope

__all__ = [
    "MAX_FORWARDED_HOPS",
    "ClientIP",
    "KeyFunc",
    "bearer_token",
    "client_ip",
    "compose",
    "header",
    "header_key",
    "key_text",
    "path_param",
    "query_key",
    "query_param",
    "route_template",
]

KeyFunc = Callable[[Scope], "str | Awaitable[str | None] | None"]
_CACHE_LIMIT = 10_000
MAX_FORWARDED_HOPS = 32
"""Forwarding-header entries examined from the right (a proxy chain is rarely longer than a few
hops); entries further left are never read, so a long forged header costs no more than this."""
_MAX_ADDRESS = 64
"""Longest text read as an address: the longest IPv6 form (45 characters, with an IPv4 tail) fits
with brackets and an interface's zone id. Longer text is not an address and is never cached, so
each cache holds at most ``_CACHE_LIMIT`` short entries whatever clients send."""
_MAX_FORWARDED_CHARS = MAX_FORWARDED_HOPS * 512
"""Characters of a forwarding header read, from the right: room for ``MAX_FORWARDED_HOPS`` long
``Forwarded`` elements, so a 64 KB header (which only a client writes) is never decoded or split whole."""
_MAX_CACHED_PATH = 1024
"""Longest path whose route match is cached (longer ones are matched per request)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class ClientIP:
    """The client address as a key.

    The forwarding header (``forwarded_header``: ``X-Forwarded-For`` by default, or RFC 7239
    ``Forwarded``) is read only when the direct peer is a trusted proxy, and only the one header
    your proxies set: a client can send the other one, and a proxy passes it on untouched. All
    lines of that header are one list (RFC 9110: a proxy may append a line of its own rather than
    extend the client's). The list is walked from the right, skipping trusted hops, and the first
    untrusted address is the client. At most ``MAX_FORWARDED_HOPS`` entries are examined; when all
    of them are trusted, the client is the direct peer (leftmost entries could have been written by
    the client itself, so a header value never decides then). IPv4-mapped IPv6 becomes plain IPv4;
    a port on an entry (``198.51.100.9:5000``, ``[2001:db8::1]:5000``) is dropped, in either header.

    Args:
        trusted_proxies: CIDRs of the proxies whose forwarding header is believed; the default none
            means only the direct peer counts.
        ipv6_prefix: IPv6 clients are grouped by this prefix length (default /64, since one subscriber
            usually owns a whole /64).
        forwarded_header: The header your trusted proxies set: ``"X-Forwarded-For"`` (the default:
            nginx, HAProxy's ``option forwardfor``, AWS ALB, Traefik, Envoy) or ``"Forwarded"``
            (RFC 7239). The other one is never read.
    """

    __slots__ = ("_forwarded", "_last", "_norm_cache", "_trust_cache", "ipv6_prefix", "trusted")

    def __init__(
        self, trusted_proxies: Iterable[str] = (), ipv6_prefix: int = 64, forwarded_header: str = "X-Forwarded-For"
    ) -> None:
        if not 0 < ipv6_prefix <= 128:
            raise ConfigurationError(f"ipv6_prefix must be between 1 and 128, got {ipv6_prefix}")
        header = forwarded_header.strip().lower() if isinstance(forwarded_header, str) else ""
        if header not in ("x-forwarded-for", "forwarded"):
            raise ConfigurationError(
                f"forwarded_header must be 'X-Forwarded-For' or 'Forwarded' (the header your trusted "
                f"proxies set), got {forwarded_header!r}"
            )
        self._forwarded = header == "forwarded"
        try:
            self.trusted = tuple(ipaddress.ip_network(p, strict=False) for p in trusted_proxies)
        except ValueError as exc:
            raise ConfigurationError(f"invalid trusted proxy network: {exc}") from None
        self.ipv6_prefix = ipv6_prefix
        self._norm_cache: dict[str, str] = {}
        self._trust_cache: dict[str, bool] = {}
        self._last: tuple[str, str] = ("", "unknown")  # the last direct peer and its key

    def __call__(self, scope: Scope) -> str:
        client = value_of(scope, "client")
        peer = client[0] if client else None
        if not peer:
            return "unknown"
        if self.trusted and self._is_trusted(peer):
            return self._from_headers(scope, peer)
        last = self._last  # a connection's requests share one peer: no lookup for them
        if peer == last[0]:
            return last[1]
        key = self.normalize(peer)
        self._last = (peer, key)
        return key

    def normalize(self, address: str) -> str:
        """Canonical text of ``address`` (IPv6 reduced to its prefix); unparsable input is kept,
        truncated, with a marker.

        Args:
            address: An IP address as text.
        """
        cached = self._norm_cache.get(address)
        if cached is not None:
            return cached
        if len(address) > _MAX_ADDRESS:  # not an address; uncached, so junk cannot fill memory
            return "invalid:" + address[:_MAX_ADDRESS]
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]"))
        except ValueError:
            result = "invalid:" + address
        else:
            if isinstance(ip, ipaddress.IPv6Address):
                mapped = ip.ipv4_mapped
                if mapped is not None:
                    result = str(mapped)
                elif self.ipv6_prefix == 128:
                    result = str(ip)
                else:
                    result = str(ipaddress.ip_network(f"{ip}/{self.ipv6_prefix}", strict=False))
            else:
                result = str(ip)
        remember(self._norm_cache, address, result, _CACHE_LIMIT)
        return result

    def _is_trusted(self, address: str) -> bool:
        cached = self._trust_cache.get(address)
        if cached is not None:
            return cached
        if len(address) > _MAX_ADDRESS:  # not an address; uncached, as in normalize
            return False
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]"))
        except ValueError:
            result = False
        else:
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            result = any(ip in net for net in self.trusted)
        remember(self._trust_cache, address, result, _CACHE_LIMIT)
        return result

    def _from_headers(self, scope: Scope, peer: str) -> str:
        if self._forwarded:
            hops = _forwarded_for(_header_list(scope, b"forwarded"))
        else:
            xff = _header_list(scope, b"x-forwarded-for")
            hops = [_without_port(h.strip()) for h in xff.rsplit(",", MAX_FORWARDED_HOPS)[-MAX_FORWARDED_HOPS:]] if xff else []
        for address in reversed(hops):
            if address and not self._is_trusted(address):
                return self.normalize(address)
        # Every examined hop is a trusted proxy: only the peer is known not to come from the client.
        return self.normalize(peer)


def _header_list(scope: Scope, name: bytes) -> str | None:
    """Every line of the header ``name`` joined with commas, in order (RFC 9110 section 5.3: one
    list), or ``None`` without one.

    Only the rightmost ``MAX_FORWARDED_HOPS`` lines and ``_MAX_FORWARDED_CHARS`` characters are
    kept, so a huge header costs no more than the examined hops; where the text is cut, the entry
    it cuts through is dropped whole (a fragment is never read as an address)."""
    lines = [value for key, value in scope.get("headers") or () if key == name]
    if not lines:
        return None
    if len(lines) == 1:
        line = bytes(lines[0])
        if len(line) <= _MAX_FORWARDED_CHARS:  # the usual case: one short line
            return line.decode("latin-1")
    kept: list[bytes] = []
    room = _MAX_FORWARDED_CHARS
    newest_first = lines[-MAX_FORWARDED_HOPS:]
    newest_first.reverse()  # (not reversed(): mypyc cannot compile it over a list of Any)
    for value in newest_first:
        line = bytes(value)
        if len(line) > room:
            line = line[len(line) - room :]
            comma = line.find(b",")
            if comma >= 0:
                kept.append(line[comma + 1 :])
            break
        kept.append(line)
        room -= len(line) + 1
        if room <= 0:
            break
    kept.reverse()
    return b",".join(kept).decode("latin-1")


def _without_port(address: str) -> str:
    """An ``X-Forwarded-For`` entry without the port some proxies add (``198.51.100.9:5000``,
    ``[2001:db8::1]:5000``): a client choosing its source port must stay one client. A bare IPv6
    address (several colons, no brackets) is kept whole."""
    if address.startswith("["):
        end = address.find("]")
        return address[1:end] if end > 0 else address
    if address.count(":") == 1:
        return address.partition(":")[0]
    return address


def _forwarded_for(value: str | None) -> list[str]:
    """The ``for=`` addresses of an RFC 7239 ``Forwarded`` header, ports stripped (the rightmost
    ``MAX_FORWARDED_HOPS`` elements only, and one address per element: RFC 7239 allows one
    ``for`` per element, and more would let one element stand for thousands of hops)."""
    if not value:
        return []
    out = []
    for element in value.rsplit(",", MAX_FORWARDED_HOPS)[-MAX_FORWARDED_HOPS:]:
        for pair in element.split(";"):
            name, _, raw = pair.strip().partition("=")
            if name.lower() != "for" or not raw:
                continue
            raw = raw.strip().strip('"')
            if raw.startswith("["):
                raw = raw[1 : raw.find("]")] if "]" in raw else raw[1:]
            elif raw.count(":") == 1:
                raw = raw.split(":", 1)[0]
            out.append(raw)
            break
    return out


client_ip = ClientIP()
"""The peer address, trusting no forwarding header (use ``ClientIP(trusted_proxies=...)`` behind a proxy)."""


def header(name: str, *, fallback: KeyFunc | None = client_ip, hashed: bool = True) -> KeyFunc:
    """The value of header ``name`` as the key, hashed by default: a header that identifies a
    caller is often a secret (``X-API-Key``), and the key is written to the store as it is.

    The key is ``<name>:<digest>`` (``header_key`` computes it for a given value, e.g. for
    ``block``).

    Args:
        name: The header, e.g. ``X-API-Key``.
        fallback: The key function used when the request has no such value; the default is the client IP
            (so a missing value never means "unlimited"); ``None`` leaves the key missing.
        hashed: Store a digest of the value (the default). ``False`` stores the value itself, readable
            in the store: only for values that are not secrets, such as a tenant id.
    """
    raw = name.lower().encode("latin-1")
    prefix = name.lower() + ":"

    def key(scope: Scope) -> str | Awaitable[str | None] | None:
        value = header_value(scope, raw)
        if value:
            return prefix + (digest(value) if hashed else value)
        return fallback(scope) if fallback is not None else None

    return key


def header_key(name: str, value: str, *, hashed: bool = True) -> str:
    """The key ``header(name, hashed=hashed)`` gives a request whose header ``name`` is ``value``:
    what to pass to ``block``, ``penalty`` or ``Limiter.reset`` for that caller.

    Args:
        name: The header, as given to ``header``.
        value: The header's value.
        hashed: As given to ``header``.
    """
    return name.lower() + ":" + (digest(value) if hashed else value)


def bearer_token(*, fallback: KeyFunc | None = client_ip) -> KeyFunc:
    """The token of ``Authorization: Bearer <token>``, hashed so secrets never reach the store.

    Args:
        fallback: The key function used when the request has no such value; the default is the client IP
            (so a missing value never means "unlimited"); ``None`` leaves the key missing.
    """

    def key(scope: Scope) -> str | Awaitable[str | None] | None:
        token = bearer_token_of(scope)
        if token is not None:
            return "bearer:" + digest(token)
        return fallback(scope) if fallback is not None else None

    return key


def query_param(name: str, *, fallback: KeyFunc | None = client_ip, hashed: bool = True) -> KeyFunc:
    """The value of query parameter ``name`` as the key, hashed by default (``?api_key=`` is a
    secret, and the key is written to the store as it is).

    The key is ``q.<name>:<digest>`` (``query_key`` computes it for a given value).

    Args:
        name: The query parameter.
        fallback: The key function used when the request has no such value; the default is the client IP
            (so a missing value never means "unlimited"); ``None`` leaves the key missing.
        hashed: Store a digest of the value (the default). ``False`` stores the value itself, readable
            in the store: only for values that are not secrets.
    """
    prefix = f"q.{name}:"

    def key(scope: Scope) -> str | Awaitable[str | None] | None:
        value = query_value(scope, name)
        if value is not None:
            return prefix + (digest(value) if hashed else value)
        return fallback(scope) if fallback is not None else None

    return key


def query_key(name: str, value: str, *, hashed: bool = True) -> str:
    """The key ``query_param(name, hashed=hashed)`` gives a request whose parameter ``name`` is
    ``value`` (for ``block``, ``penalty`` or ``Limiter.reset``).

    Args:
        name: The query parameter, as given to ``query_param``.
        value: The parameter's value.
        hashed: As given to ``query_param``.
    """
    return f"q.{name}:" + (digest(value) if hashed else value)


def path_param(name: str, *, fallback: KeyFunc | None = client_ip) -> KeyFunc:
    """The value of path parameter ``name`` (resolved through the app's router in middleware).

    Args:
        name: The path parameter.
        fallback: The key function used when the request has no such value; the default is the client IP
            (so a missing value never means "unlimited"); ``None`` leaves the key missing.
    """

    def key(scope: Scope) -> str | Awaitable[str | None] | None:
        params = scope.get("path_params")
        if params is None:
            params = _resolve_route(scope)[1]
        if name in params:
            return f"p.{name}:{params[name]}"
        return fallback(scope) if fallback is not None else None

    return key


def route_template(scope: Scope) -> str:
    """The matched route's template (``/items/{item_id}``), never the concrete path.

    Args:
        scope: The ASGI connection scope.
    """
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    if isinstance(path, str):
        return path
    template = _resolve_route(scope)[0]
    return template if template is not None else "<unmatched>"


def compose(*funcs: KeyFunc, separator: str = "|") -> KeyFunc:
    """Several key functions joined into one key (``compose(client_ip, header("X-Tenant"))``).

    A part without a value is left empty; when no part has one, the key is missing (``None``), so
    the request is charged to its client IP like any key without a value.

    Args:
        *funcs: The key functions, in order.
        separator: Put between the parts.
    """
    if not funcs:
        raise ConfigurationError("compose() needs at least one key function")

    async def key(scope: Scope) -> str | None:
        parts = []
        found = False
        for func in funcs:
            value = func(scope)
            if isinstance(value, Awaitable):
                value = await value
            if value is None or value == "":
                parts.append("")
            else:
                found = True
                parts.append(str(value))
        return separator.join(parts) if found else None

    return key


def key_text(value: object, scope: Scope) -> str:
    """A key function's answer as the key to charge: a missing value (``None`` or ``""``) falls
    back to the client IP, so requests without the value never share one bucket.

    Args:
        value: What the key function returned.
        scope: The ASGI connection scope.
    """
    if value is None or value == "":
        return client_ip(scope)
    return value if type(value) is str else str(value)


_ROUTE_CACHE: dict[tuple[int, str, str], tuple[object, str | None, dict[str, Any]]] = {}


def _resolve_route(scope: Scope) -> tuple[str | None, dict[str, Any]]:
    """Match the app's routes (middleware runs before routing); cached per path (paths up to
    ``_MAX_CACHED_PATH`` characters, at most ``_CACHE_LIMIT`` of them)."""
    app = scope.get("app")
    router = getattr(app, "router", None)
    routes = getattr(router, "routes", None)
    if not routes:
        return None, {}
    path = scope.get("path", "")
    cache_key = (id(router), scope.get("method", ""), path)
    found = _ROUTE_CACHE.get(cache_key)
    # The entry holds the router itself: an id reused by a new router never hits a stale entry.
    if found is not None and found[0] is router:
        return found[1], found[2]
    result: tuple[str | None, dict[str, Any]] = (None, {})
    for route in routes:
        match, child = route.matches(scope)
        if match.name == "FULL":
            template = getattr(route, "path_format", None) or getattr(route, "path", None)
            result = (template, dict(child.get("path_params", {})))
            break
    if len(path) > _MAX_CACHED_PATH:  # a client's path: only short ones are kept, so bytes stay bounded
        return result
    remember(_ROUTE_CACHE, cache_key, (router, *result), _CACHE_LIMIT)
    return result
