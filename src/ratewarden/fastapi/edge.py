"""The per-request half of edge enforcement, compiled with the rest of the hot path.

``EdgeLayer`` finds the request's ``EdgeTarget`` (the declared limits of the route it will reach)
in a cache keyed by (method, root path, path) (paths up to ``MAX_CACHED_PATH`` characters: a
longer one is resolved on every request), charges them once, and answers a denial itself.
Resolving a route and building its target need FastAPI, so they live in ``ratewarden.fastapi.routes`` and run
on a cache miss only, through the ``resolver`` given to the layer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from time import monotonic
from typing import Any

from .._mypyc import mypyc_attr
from ..asgi.responses import SendWithHeaders, answer_on_limit, send_outcome
from ..caches import remember
from ..context import EdgeCheck, RequestContext, context_for
from ..decision import Decision
from ..enforcement.answers import HeaderOptions
from ..enforcement.check import LimitUnavailable, check, check_rules
from ..enforcement.outcome import ALLOW, Outcome, failed, outcome_of
from ..limiter import Limiter
from ..rules import MAX_CACHED_PATH, CompiledRule
from ..scopes import value_of
from ..types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SINK_KEY", "EdgeAnswer", "EdgeCheck", "EdgeLayer", "EdgeTarget", "Lifted"]

SINK_KEY = "ratewarden.headers"
"""Scope key of the list a dependency that checks for itself appends its headers to (a denying one
replaces them with its 429's)."""

_CACHE_LIMIT = 4096
_RECHECK_SECONDS = 1.0

Groups = tuple[tuple[Limiter, tuple[CompiledRule, ...]], ...]

EdgeAnswer = Callable[[Scope, Receive, Decision, list[tuple[bytes, bytes]]], Awaitable["ASGIApp | None"]]
"""A custom answer to a denial at the edge: given the scope, ``receive``, the decision and the 429's
headers (``Retry-After``, rate-limit headers), the ASGI app to send (``None``: the default 429)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Lifted:
    """The ``RateLimit`` dependencies taken out of one FastAPI dependant's solving (the edge is their
    check), and the way back: while an override in ``app.dependency_overrides`` applies, the
    dependant gets its ``full`` list again so FastAPI runs the override as it would without the edge;
    once no override applies and no request that skipped the edge is still in flight (it may not have
    been solved yet), it gets the ``lean`` list again. The lists are swapped, never changed in place,
    so a request being solved keeps the one it started with."""

    __slots__ = ("calls", "dependant", "full", "inflight", "lean", "restored")

    def __init__(self, dependant: object, full: list[Any], lean: list[Any], calls: tuple[object, ...]) -> None:
        self.dependant = dependant
        self.full = full
        self.lean = lean
        self.calls = calls
        self.restored = False
        self.inflight = 0

    def restore(self) -> None:
        """Put the lifted dependencies back in the dependant (a request skips the edge)."""
        self.inflight += 1
        if not self.restored:
            self.restored = True
            setattr(self.dependant, "dependencies", self.full)  # noqa: B010

    def done(self) -> None:
        """A request that skipped the edge has finished."""
        self.inflight -= 1

    def relift(self) -> None:
        """Take the lifted dependencies out again, unless a request that skipped the edge may still
        be solving them."""
        if self.inflight == 0:
            self.restored = False
            setattr(self.dependant, "dependencies", self.lean)  # noqa: B010


@mypyc_attr(allow_interpreted_subclasses=True)
class EdgeTarget:
    """The declared limits of one (route, method), grouped by limiter, with the answer's settings."""

    __slots__ = ("answers", "covered", "groups", "lifted", "overridable", "overrides", "policy", "route")

    def __init__(
        self,
        route: object,
        covered: frozenset[object],
        groups: Groups,
        answers: HeaderOptions,
        policy: bytes,
        overrides: object,
    ) -> None:
        self.route = route
        self.covered = covered
        self.groups = groups
        self.answers = answers
        self.policy = policy
        self.overrides = overrides  # the app whose dependency_overrides may replace these limits
        self.lifted: Lifted | None = None  # set when the route's unused limits leave FastAPI's solving
        # What an override may replace to take these limits out of FastAPI's run: the limits and
        # the dependencies they sit under.
        self.overridable: frozenset[object] = covered

    def overridden(self) -> bool:
        """Whether ``app.dependency_overrides`` replaces one of these limits (or a dependency one sits
        under, which FastAPI then no longer runs): then the edge stays out and FastAPI runs the
        override. When none does, lifted dependencies an earlier override put back are taken out
        again."""
        overrides = getattr(self.overrides, "dependency_overrides", None)
        if overrides and not self.overridable.isdisjoint(overrides):
            return True
        lifted = self.lifted
        if lifted is not None and lifted.restored:
            lifted.relift()
        return False


@mypyc_attr(allow_interpreted_subclasses=True)
class EdgeLayer:
    """Charges the declared limits of the route a request will reach, before routing.

    ``resolver`` (see ``ratewarden.fastapi.routes``) has ``routes()`` (the app's top-level route list),
    ``changed()`` (whether the route table changed since the last call), ``cacheable`` and
    ``lookup(scope)`` returning ``(target or None, path parameters)``. Requests without a target
    pass through with the headers sink a self-checking dependency uses. ``on_limit`` replaces the
    problem+json 429 (``install`` sets it from ``on_limit=`` or the app's own handler).
    """

    def __init__(self, app: ASGIApp, resolver: Any, on_limit: EdgeAnswer | None = None) -> None:
        self.app = app
        self.resolver = resolver
        self.on_limit = on_limit
        self.cache: dict[object, tuple[EdgeTarget | None, dict[str, Any]]] = {}  # by path, or (method, root, path)
        self.cacheable = True
        self.count = -1
        self.next_check = 0.0
        # The route list last read from the resolver: a route appended to it shows at once; a new
        # list (or any other change) at the next full check, within _RECHECK_SECONDS.
        self.routes: Sequence[object] = ()

    def target(self, scope: Scope) -> EdgeTarget | None:
        now = monotonic()
        if len(self.routes) != self.count or now >= self.next_check:
            self.routes = self.resolver.routes()
            self.count = len(self.routes)
            self.next_check = now + _RECHECK_SECONDS
            if self.resolver.changed():
                self.cache = {}
                self.cacheable = bool(self.resolver.cacheable)
        method: str = scope["method"]
        path: str = scope["path"]
        root: str = value_of(scope, "root_path", "")
        # A GET at the root is keyed by its path alone: a string keeps its hash, a tuple is built
        # and hashed anew for every request.
        cache_key: object = path if method == "GET" and not root else (method, root, path)
        found = self.cache.get(cache_key) if self.cacheable else None
        if found is None:
            found = self._resolve(scope, cache_key, len(path) + len(root) <= MAX_CACHED_PATH)
        target = found[0]
        params = found[1]
        if params and "path_params" not in scope:
            # Key and cost functions may read path parameters; the router sets the same values later.
            scope["path_params"] = dict(params)
        return target

    def _resolve(
        self, scope: Scope, cache_key: object, keep: bool = True
    ) -> tuple[EdgeTarget | None, dict[str, Any]]:
        """A cache miss: the resolver finds the route's target, kept unless the app is not cacheable
        or the path is too long to keep (``keep``: the client chooses paths, and 4,096 long ones
        would hold hundreds of megabytes)."""
        found: tuple[EdgeTarget | None, dict[str, Any]] = self.resolver.lookup(scope)
        if self.cacheable and keep:
            remember(self.cache, cache_key, found, _CACHE_LIMIT)
        return found

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """What answers this request, as an awaitable: on the usual paths the app's own (the check
        runs here, synchronously), so the layer adds no coroutine of its own. Starlette's middleware
        stack awaits it, as it awaits any app; unlike ``RateLimitMiddleware``, which may be the
        app a server is given (and is then told apart as ASGI 3 by its ``async def``), this layer
        only ever runs inside the FastAPI app ``install()`` adds it to.

        Args:
            scope: The ASGI connection scope.
            receive: The ASGI ``receive``.
            send: The ASGI ``send``.
        """
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        target = self.target(scope)
        if target is None:
            return with_collected_headers(self.app, scope, receive, send)
        if target.overridden():
            return run_overridden(self.app, target.lifted, scope, receive, send)
        context = context_for(scope)
        previous = context.edge
        if previous is not None and previous.route is target.route:
            # An outer edge layer (install() on a parent app, or called twice) charged this already.
            return self.app(scope, receive, send)
        groups = target.groups
        if len(groups) != 1:
            return self._answer_later(target, context, check_groups(groups, scope), scope, receive, send)
        limiter, rules = groups[0]
        if not limiter.enabled:
            return self._answer(target, context, None, scope, receive, send)
        try:
            checked = check(limiter, rules, scope)
        except LimitUnavailable as exc:
            return send_outcome(send, failed(exc))
        if checked is None or isinstance(checked, Decision):
            return self._answer(target, context, checked, scope, receive, send)
        return self._answer_later(target, context, checked, scope, receive, send)

    async def _answer_later(
        self,
        target: EdgeTarget,
        context: RequestContext,
        checked: Awaitable[Decision | None],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """The check had to wait (an async key, a remote store, several rules or limiters): await it,
        then answer."""
        try:
            decision = await checked
        except LimitUnavailable as exc:
            await send_outcome(send, failed(exc))
            return
        await self._answer(target, context, decision, scope, receive, send)

    def _answer(
        self,
        target: EdgeTarget,
        context: RequestContext,
        decision: Decision | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> Awaitable[None]:
        """Record the check, then send the core's ``Outcome``: the app with its headers added, the
        429, or ``on_limit``'s answer."""
        context.edge = EdgeCheck(target.route, target.covered, decision)
        if decision is None:
            return self.app(scope, receive, send)
        outcome = outcome_of(decision, target.answers, target.policy)
        if outcome.verdict == ALLOW:
            headers = outcome.headers
            return self.app(scope, receive, SendWithHeaders(send, headers) if headers else send)
        on_limit = self.on_limit
        if on_limit is None:  # the default 429: FastAPI never sees the request
            return send_outcome(send, outcome)
        return refuse_with(on_limit, scope, receive, send, decision, outcome)


def refuse_with(
    on_limit: EdgeAnswer, scope: Scope, receive: Receive, send: Send, decision: Decision, outcome: Outcome
) -> Awaitable[None]:
    """Answer the refusal ``outcome`` with the app's own answer (``None``: the default 429), adding
    ``Retry-After`` and the rate-limit headers it did not set itself (as the middleware's ``on_limit``)."""
    added = outcome.added_headers()
    return answer_on_limit(on_limit(scope, receive, decision, added), scope, receive, send, outcome, added)


async def check_groups(groups: Sequence[tuple[Limiter, tuple[CompiledRule, ...]]], scope: Scope) -> Decision | None:
    """Limits on different limiters: checked in order, as the dependencies would be; the first
    denial wins, else the decision with the least remaining."""
    decision: Decision | None = None
    for limiter, rules in groups:
        if not limiter.enabled:
            continue
        found = await check_rules(limiter, rules, scope)
        if found is None:
            continue
        if not found.allowed:
            return found
        if decision is None or found.remaining < decision.remaining:
            decision = found
    return decision


async def run_overridden(app: ASGIApp, lifted: Lifted | None, scope: Scope, receive: Receive, send: Send) -> None:
    """Run a request whose limits an override replaces past the edge, with the lifted dependencies
    back in FastAPI's solving while it is in flight (FastAPI then calls the override, or the
    dependencies not overridden check their limits themselves)."""
    if lifted is None:
        await with_collected_headers(app, scope, receive, send)
        return
    lifted.restore()
    try:
        await with_collected_headers(app, scope, receive, send)
    finally:
        lifted.done()


async def with_collected_headers(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` with a headers sink in the scope, adding what was collected to the response
    (each header the response does not set itself: a 429 answered by an exception handler keeps the
    denying limit's headers, once)."""
    collected: list[tuple[bytes, bytes]] = []
    scope[SINK_KEY] = collected

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and collected:
            own = message.get("headers") or []
            present = {bytes(name).lower() for name, _ in own}
            message["headers"] = [*own, *(h for h in collected if h[0] not in present)]
        await send(message)

    await app(scope, receive, send_with_headers)
