"""The HTTP check API of ``ratewarden serve``, a pure ASGI app (no framework).

``/check`` answers a gateway's sub-request (nginx ``auth_request``, Traefik ForwardAuth, HAProxy):
the original request is described by headers (``X-Original-Method``/``X-Forwarded-Method``,
``X-Original-URI``/``X-Forwarded-Uri``, ``X-Real-IP``/``X-Forwarded-For`` from trusted proxies
only), described as an ASGI scope and decided by the policy core's step machine
(``PolicyCore.answer_steps``: the middleware's own steps, as if an app behind it answered 200, with
no app run), driven here: tiers, API keys, bans and shadow mode are the policy file's, exactly as
in-app. Each answer is one response start
with its complete header list and one body message.
``/v1/check`` takes the same description as JSON, ``/json`` is Envoy's rate limit API as JSON,
``/healthz`` and ``/metrics`` are for operators.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote

from ..caches import remember
from ..context import STATE_KEY
from ..errors import ConfigurationError
from ..headers import HeaderStyle
from ..limiter import Limiter
from ..metrics import Metrics
from ..policy.asgi import PolicyMiddleware
from ..policy.schema import Policy
from ..steps import Machine, drive, driven
from ..store_health import innermost, probe_store, store_problem
from ..types import Receive, Scope, Send
from .costs import COST_KEY, MAX_COST, costed_policy
from .http_io import (
    MAX_BODY,
    Headers,
    ServeError,
    error_answer,
    field,
    json_object,
    read_body,
    respond,
    seconds,
    send_answer,
    send_text,
)

__all__ = ["DEFAULT_TRUSTED", "MAX_BODY", "MAX_COST", "ServeApp", "ServeError", "costed_policy", "parse_networks"]

log = logging.getLogger("ratewarden.serve")

#: Callers whose ``X-Real-IP``/``X-Forwarded-For`` (and JSON ``client``) are believed by default.
DEFAULT_TRUSTED: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
_DENY_STATUSES = {401, 403, 429}
_BODY_HEADERS = (b"content-type", b"content-length")  # a JSON check's answer describes the decision, not the body
_CACHE_LIMIT = 4096  # entries in each per-app cache of parsed addresses (cleared when full)
_MISSING = ""  # not cached (no address is the empty string)
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> tuple[_Network, ...]:
    """Parse CIDRs (or plain addresses) into networks; a bad one raises ``ConfigurationError``.

    Args:
        cidrs: E.g. ``["127.0.0.1/32", "10.0.0.0/8", "::1"]``.
    """
    networks: list[_Network] = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ConfigurationError(f"--trusted-proxy {cidr!r} is not an address or CIDR (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def _address(text: str) -> str | None:
    """``text`` as a normalised IP address (IPv4-mapped IPv6 as IPv4), ``None`` if it is not one."""
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "1.2.3.4:5678"
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _failure(exc: Exception) -> tuple[int, Headers, bytes]:
    """The service's JSON error answer for a request that raised: its ``ServeError``'s status, else a
    500, logged (a bug or a broken store client: answered, never a dropped connection)."""
    if isinstance(exc, ServeError):
        return error_answer(exc.status, str(exc))
    log.error("check failed: %s: %s", type(exc).__name__, exc, exc_info=exc, extra={"event": "check_failed"})
    return error_answer(500, f"the check failed: {type(exc).__name__} (see the service's log)")


async def _healthcheck(app: ServeApp) -> tuple[int, Headers, bytes]:
    status, body = await importlib.import_module(f"{__package__}.healthcheck").healthcheck(app)
    return status, [(b"content-type", b"text/plain; charset=utf-8")], body


async def _allow(scope: Scope, receive: Receive, send: Send) -> None:
    """The app behind the policy (``PolicyMiddleware.answer`` answers for it: 200, empty body)."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class ServeApp:
    """The ASGI app of ``ratewarden serve``.

    Args:
        limiter: Checks the limits (its store and ``on_error`` decide outages).
        policy: The ratewarden policy that ``/check`` and ``/v1/check`` enforce; ``None`` for none.
        trusted_proxies: CIDRs of callers whose client-address headers are believed.
        metrics: Decision metrics, shown at ``/metrics``; ``None`` for none.
        rls: Envoy's ``RateLimitService`` behind ``/json``; ``None`` for none.
        header_style: Which rate-limit headers answers carry (``"both"``, ``"ietf"``, ``"legacy"``).
        exposition: What ``/metrics`` shows; the default ``None`` is ``metrics.exposition()`` (workers
            replace it by the total over every worker).
        reference: ``--envoy-env``'s settings that ``/healthcheck`` reads (``serve.healthcheck``).
    """

    def __init__(
        self,
        limiter: Limiter,
        policy: Policy | None = None,
        *,
        trusted_proxies: Sequence[str] = DEFAULT_TRUSTED,
        metrics: Metrics | None = None,
        rls: Any = None,
        header_style: HeaderStyle = "both",
        exposition: Callable[[], bytes] | None = None,
        reference: Any = None,
    ) -> None:
        self.limiter = limiter
        self.reference = reference
        self.stopping = False  # set at the stop signal: /healthcheck answers 500 (serve.healthcheck)
        self.exposition = exposition
        self.metrics = metrics
        self.rls = rls
        self.trusted = parse_networks(trusted_proxies)
        self._trust_cache: dict[str, bool] = {}
        self._address_cache: dict[str, str | None] = {}  # header value -> its address (None: not one)
        self.policy_app: PolicyMiddleware | None = None
        self._costed_app: PolicyMiddleware | None = None  # for JSON checks whose cost is not 1, built on demand
        self._header_style: HeaderStyle = header_style
        self._lock = threading.Lock()
        #: The compiled front doors' stall checks (``/healthz``): each says why its door is stuck, or ``None``.
        self.doors: list[Callable[[], str | None]] = []
        if policy is not None:
            self.apply_policy(policy)

    def apply_policy(self, policy: Policy) -> None:
        """Enforce ``policy`` from now on (an atomic swap; ban lists carry over).

        Args:
            policy: A validated policy.
        """
        with self._lock:  # reloads run in a thread; the costed middleware must follow every one
            if self.policy_app is None:
                self.policy_app = self._middleware(policy)
            else:
                self.policy_app.apply(policy)
            if self._costed_app is not None:
                self._costed_app.apply(costed_policy(policy))

    def _middleware(self, policy: Policy) -> PolicyMiddleware:
        return PolicyMiddleware(_allow, self.limiter, policy=policy, metrics=self.metrics, header_style=self._header_style)

    def _costed(self) -> PolicyMiddleware:
        """The policy middleware for checks whose cost is not 1 (a rule's cost function reads it)."""
        costed = self._costed_app
        if costed is None:
            with self._lock:
                assert self.policy_app is not None and self.policy_app.policy is not None
                if self._costed_app is None:
                    self._costed_app = self._middleware(costed_policy(self.policy_app.policy))
                costed = self._costed_app
        return costed

    # -- dispatch ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":  # a WebSocket: refuse the handshake
            await send({"type": "websocket.close", "code": 1008})
            return
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path == "/check":  # translate, drive the core, send: no hand-off in between
                await respond(send, *(await self.check(
                    scope.get("query_string", b""), scope.get("headers", ()), scope.get("client"), scope.get("server"))))
            elif path == "/v1/check":
                self._need(method, "POST")
                await self._check_json(scope, receive, send)
            elif path == "/json":
                self._need(method, "POST")
                await self._rls_json(receive, send)
            elif path == "/healthz":
                self._need(method, "GET", "HEAD")
                await self._healthz(send)
            elif path == "/metrics":
                self._need(method, "GET", "HEAD")
                await self._metrics(send)
            elif path == "/healthcheck":  # envoyproxy/ratelimit's (serve.healthcheck)
                await send_answer(send, *(await _healthcheck(self)))
            else:
                raise ServeError(404, f"no such endpoint {path!r}: use /check, /v1/check, /json, /healthz or /metrics")
        except Exception as exc:
            await respond(send, *_failure(exc))

    @staticmethod
    def _need(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise ServeError(405, f"method {method} not allowed here: use {' or '.join(allowed)}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.limiter.check_store()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- the client address --------------------------------------------------------------------

    def is_trusted(self, caller: str | None) -> bool:
        """Whether ``caller`` (an address) is one of the trusted proxies, whose client address is believed."""
        if caller is None:
            return False
        found = self._trust_cache.get(caller)
        if found is None:
            address = _address(caller)
            found = address is not None and any(ipaddress.ip_address(address) in n for n in self.trusted)
            remember(self._trust_cache, caller, found, _CACHE_LIMIT)
        return found

    def _client(self, peer: Any, headers: dict[bytes, bytes], stated: str | None = None) -> str | None:
        """The original client's address: what a trusted caller (``peer``, the ASGI ``client``) says
        (``stated``, ``X-Real-IP``, the last ``X-Forwarded-For`` entry), else the caller's own address."""
        caller: str | None = peer[0] if peer else None
        if not self.is_trusted(caller):
            return caller
        candidates = [stated] if stated is not None else []
        real = headers.get(b"x-real-ip")
        if real is not None:
            candidates.append(real.decode("latin-1"))
        forwarded = headers.get(b"x-forwarded-for")
        if forwarded is not None:
            candidates.append(forwarded.decode("latin-1").rpartition(",")[2])
        cache = self._address_cache
        for candidate in candidates:
            address = cache.get(candidate, _MISSING)
            if address is _MISSING:
                address = _address(candidate)
                remember(cache, candidate, address, _CACHE_LIMIT)  # the header's text: bytes bounded too
            if address is not None:
                return address
        return caller

    # -- running the policy --------------------------------------------------------------------

    def _policy(self, cost: float = 1) -> PolicyMiddleware:
        """The policy middleware that decides a check of this ``cost``."""
        policy_app = self.policy_app
        if policy_app is None:
            raise ServeError(404, "no ratewarden policy file is loaded: start ratewarden serve with one")
        return policy_app if cost == 1 else self._costed()

    @staticmethod
    def _described(
        method: str, uri: str, headers: Headers, client: str | None, scheme: str, cost: float = 1,
        server: object = None,
    ) -> Scope:
        """The described request as the ASGI scope the policy reads (its ``state`` receives the
        request's context)."""
        if not uri.startswith("/"):
            raise ServeError(400, f"the original URI must start with '/', got {uri[:100]!r}")
        raw_path, _, query = uri.partition("?")
        if method not in _METHODS and (not method or not method.isascii() or not method.isalpha()):
            raise ServeError(400, f"the original method must be a word such as GET, got {method[:20]!r}")
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1",
            "method": method.upper(),
            "scheme": scheme,
            "path": unquote(raw_path),
            "raw_path": raw_path.encode("latin-1", "replace"),
            "query_string": query.encode("latin-1", "replace"),
            "root_path": "",
            "headers": headers,
            "client": (client, 0) if client is not None else None,
            "server": server,
            "state": {COST_KEY: cost} if cost != 1 else {},
        }

    async def check(
        self, query: bytes, headers: Iterable[tuple[bytes, bytes]], peer: Any, server: object = None
    ) -> tuple[int, Headers, bytes]:
        """``/check``'s answer ``(status, complete header list, body)``, its error answer included,
        for the check request's query string, headers and caller (``peer``: the ASGI ``client``).
        The one translation of ``/check``: uvicorn's (``_check``) and the compiled front door's
        (``serve.front_http``, with no ASGI exchange)."""
        try:
            deny = 429
            if query:
                for name, value in parse_qsl(query.decode("latin-1")):
                    if name == "deny_status":
                        if not value.isdigit() or int(value) not in _DENY_STATUSES:
                            raise ServeError(400, f"deny_status must be 401, 403 or 429, got {value[:20]!r}")
                        deny = int(value)
            raw: Headers = headers if type(headers) is list else list(headers)
            named = dict(raw)
            method = named.get(b"x-original-method") or named.get(b"x-forwarded-method") or b"GET"
            uri = named.get(b"x-original-uri") or named.get(b"x-forwarded-uri") or b"/"
            scheme = (named.get(b"x-forwarded-proto") or b"http").decode("latin-1")
            client = self._client(peer, named)
            answered = drive(self.decide_steps(method.decode("latin-1"), uri.decode("latin-1"), raw, client, scheme, server))
            status, out, body = answered if isinstance(answered, tuple) else await answered
        except Exception as exc:
            return _failure(exc)
        return (deny if status == 429 else status), out, body

    def decide_steps(
        self, method: str, uri: str, headers: Headers, client: str | None, scheme: str = "http", server: object = None
    ) -> Machine[tuple[int, Headers, bytes]]:
        """The policy's answer for a request described by a gateway, as the core's step machine
        (``PolicyCore.answer_steps``) for the door's driver: ``(status, complete header list, body)``:
        200, or the refusal (429, 403, 503 under a closed failure policy) with its body. The one
        decision of ``/check`` and the SPOE agents; ``ServeError`` (raised when driven) for a
        description it cannot use.

        Args:
            method: The original request's method.
            uri: Its path and query (``/items?page=2``).
            headers: Its headers (lowercase names), which key functions and API-key sources read.
            client: The client's address (already vetted: from a trusted proxy, or the caller's own).
            scheme: ``http`` or ``https``.
            server: The ASGI ``server`` of the described scope.
        """
        policy = self._policy()
        return (yield from policy.answer_steps(self._described(method, uri, headers, client, scheme, server=server)))

    async def _check_json(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/check``: the decision for a request described as JSON."""
        data = json_object(await read_body(receive))
        method = field(data, "method", str, "GET")
        path = data.get("path")
        if not isinstance(path, str):
            raise ServeError(400, "'path' is required: the original request's path, e.g. \"/api/items?page=2\"")
        raw_headers = field(data, "headers", dict, {})
        stated = field(data, "client", str, None)
        cost = data.get("cost", 1)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost <= MAX_COST:
            raise ServeError(400, f"'cost' must be a number from 0 to {MAX_COST}, got {json.dumps(cost)[:40]}")
        headers: Headers = []
        for name, value in raw_headers.items():
            if not isinstance(value, str):
                raise ServeError(400, f"header {name!r} must be a string, got {type(value).__name__}")
            headers.append((name.lower().encode("latin-1", "replace"), value.encode("latin-1", "replace")))
        if stated is not None and _address(stated) is None:
            raise ServeError(400, f"'client' must be an IP address, got {stated[:60]!r}")
        client = self._client(scope.get("client"), {}, stated)
        policy_app = self._policy(cost)
        described = self._described(method, path, headers, client, "http", cost, scope.get("server"))
        status, out, _ = await driven(policy_app.answer_steps(described))
        ctx = described["state"].get(STATE_KEY)
        decision = getattr(ctx, "decision", None)
        result: dict[str, Any] = {
            "allowed": status < 400,
            "status": status,
            "limit": None,
            "remaining": None,
            "reset": None,
            "retry_after": None,
            "group": getattr(ctx, "group", None) or None,
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in out if k not in _BODY_HEADERS},
        }
        if decision is not None:
            result.update(
                limit=decision.limit,
                remaining=decision.remaining,
                reset=seconds(decision.reset_after),
                retry_after=seconds(decision.retry_after) if not decision.allowed else 0,
            )
        body = json.dumps(result).encode()
        await send_answer(send, 200, [(b"content-type", b"application/json")], body)

    async def _rls_json(self, receive: Receive, send: Send) -> None:
        """``POST /json``: Envoy's ``ShouldRateLimit`` as JSON (``serve.grpc.rls_json``)."""
        if self.rls is None:
            raise ServeError(404, "no envoy rate limit configuration is loaded: give ratewarden serve one")
        body = await read_body(receive)
        # Imported on first use: it needs grpcio and the generated Envoy API (the ``serve`` extra).
        rls_json = importlib.import_module(f"{__package__}.grpc").rls_json
        result: Any = rls_json(getattr(self.rls, "json_service", self.rls), body)  # --envoy-env: not timed
        if inspect.isawaitable(result):
            result = await result
        status, payload = result
        await send_answer(send, int(status), [(b"content-type", b"application/json")], bytes(payload))

    async def _healthz(self, send: Send) -> None:
        """200 ``ok`` when a configuration is loaded, the store answers and no check failed on it
        lately (``Limiter.store_failing``), else 503 and why."""
        if self.policy_app is None and self.rls is None:
            await send_text(send, 503, "no configuration loaded\n")
            return
        for stalled in self.doors:
            problem = stalled()
            if problem is not None:
                await send_text(send, 503, f"{problem}\n")
                return
        store = innermost(self.limiter.store)
        limits = self.limiter.limits("1/s")
        error = await probe_store(store, self.limiter.keys_for("ratewarden:healthz", limits), limits, 2.0)
        if error is not None:
            await send_text(send, 503, f"store unavailable: {store_problem(error)}\n")
            return
        error = self.limiter.store_failing()
        if error is not None:
            await send_text(send, 503, f"store failing (checks failed on it lately): {store_problem(error)}\n")
            return
        await send_text(send, 200, "ok\n")

    async def _metrics(self, send: Send) -> None:
        if self.metrics is None:
            raise ServeError(404, "no metrics: they need prometheus-client (pip install 'ratewarden[metrics]') and no --no-metrics")
        body = self.exposition() if self.exposition is not None else self.metrics.exposition()
        await send_answer(send, 200, [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")], body)
