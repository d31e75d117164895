"""What ``PolicyMiddleware`` tells the application about a request: one ``RequestContext`` at
``scope["state"]["ratewarden"]`` and nothing else in the state."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.context import RequestContext
from ratewarden.keys import header
from ratewarden.policy import Identity, PolicyMiddleware, PolicyRule, Tiers

from .apps import build_app, client

seen: list[tuple[list[str], Any]] = []


async def _report(request: Request) -> JSONResponse:
    ctx = request.state.ratewarden
    seen.append((sorted(request.scope["state"]), ctx))
    return JSONResponse(
        {
            "remaining": None if ctx.decision is None else ctx.decision.remaining,
            "group": ctx.group,
            "would_deny": None if ctx.would_deny is None else ctx.would_deny.policy,
            "shadow": [d.remaining for d in ctx.shadow],
        }
    )


def _app() -> Starlette:
    return Starlette(routes=[Route("/{path:path}", _report)])


async def test_the_app_reads_decision_and_group_from_one_state_key() -> None:
    identity = Identity(["header:X-Key"], keys={"g": "gold"}, unknown_group="free", anonymous_group="free")
    tiers = Tiers({"gold": "5/min", "free": "1/min"}, identity)
    app = PolicyMiddleware(_app(), Limiter(MemoryStore()), [PolicyRule("/api/**", tiers=tiers, name="api")])
    seen.clear()
    async with client(app) as http:
        body = (await http.get("/api/x", headers={"X-Key": "g"})).json()
    assert body == {"remaining": 4, "group": "gold", "would_deny": None, "shadow": []}
    keys, ctx = seen[0]
    assert keys == ["ratewarden"] and isinstance(ctx, RequestContext)


async def test_shadow_decisions_are_in_the_context() -> None:
    rules = [
        Rule("/api/**", "5/min", name="enforced", key=header("X-Client")),
        Rule("/api/**", "1/min", name="trial", key=header("X-Client"), shadow=True),
    ]
    app = PolicyMiddleware(_app(), Limiter(MemoryStore()), rules)
    trial = PolicyMiddleware(_app(), Limiter(MemoryStore()), [Rule("/api/**", "1/min", name="all")], shadow=True)
    seen.clear()
    async with client(app) as http, client(trial) as shadowed:
        bodies = [(await http.get("/api/x", headers={"X-Client": "c"})).json() for _ in range(2)]
        over = [(await shadowed.get("/api/x")).json() for _ in range(2)]
    assert [b["shadow"] for b in bodies] == [[0], [0]] and bodies[1]["remaining"] == 3
    assert [b["would_deny"] for b in over] == [None, "all"]
    assert all(keys == ["ratewarden"] for keys, _ in seen)


async def test_two_identities_on_one_request_each_resolve_their_own_caller() -> None:
    """Regression: the identity was remembered per request under one state key, so a second tiered
    rule with a different identity reused the first one's group and key."""
    by_key = Identity(["header:X-Key"], keys={"a": "gold"}, unknown_group="free", anonymous_group="free")
    by_token = Identity(["bearer"], keys={"b": "gold"}, unknown_group="free", anonymous_group="free")
    groups = {"gold": "100/min", "free": "1/min"}
    rules = [
        PolicyRule("/api/**", tiers=Tiers(groups, by_key), name="by_key"),
        PolicyRule("/api/**", tiers=Tiers(groups, by_token), name="by_token"),
    ]
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), rules)
    async with client(app) as http:
        statuses = [(await http.get("/api/x", headers={"X-Key": "a"})).status_code for _ in range(2)]
    # by_token sees no bearer token: the anonymous group, 1/min.
    assert statuses == [200, 429]
