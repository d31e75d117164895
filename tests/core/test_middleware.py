"""RateLimitMiddleware over direct ASGI calls: headers, 429 bodies, handlers, rules, odd input."""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest
from starlette.responses import PlainTextResponse, Response

from ratewarden import Decision, Limiter, MemoryStore, RateLimitMiddleware, Rule, RuleSet, context_of
from ratewarden.keys import header
from tests.core.asgi import Reply, request
from tests.vectors.runner import FakeClock


async def ok_app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """The wrapped app: 200 with its own header, echoing the path."""
    assert scope["type"] == "http"
    body = json.dumps({"path": scope["path"], "method": scope["method"]}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"x-app", b"yes")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(6000.0)  # the start of an aligned minute, hour and 10 s window


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(MemoryStore(clock=clock))


def wrap(limiter: Limiter, rules: Sequence[Rule] | RuleSet, **options: Any) -> RateLimitMiddleware:
    return RateLimitMiddleware(ok_app, limiter=limiter, rules=rules, **options)


async def run(app: RateLimitMiddleware, n: int, path: str = "/api/x", **kw: Any) -> list[Reply]:
    return [await request(app, path, **kw) for _ in range(n)]


# --- headers -----------------------------------------------------------------------------------


async def test_ietf_and_legacy_headers_on_allowed_requests(limiter: Limiter, clock: FakeClock) -> None:
    app = wrap(limiter, [Rule("/api/**", "100/min", name="api")])
    first = await request(app, "/api/items")
    assert first.status == 200
    assert first.header("x-app") == "yes"  # the app's own headers are kept
    assert first.header("ratelimit-policy") == '"api";q=100;w=60'
    assert first.header("ratelimit") == '"api";r=99;t=60'
    assert first.header("x-ratelimit-limit") == "100"
    assert first.header("x-ratelimit-remaining") == "99"
    assert first.header("x-ratelimit-reset") == "60"
    assert first.header("retry-after") is None
    clock.advance(15.2)
    second = await request(app, "/api/items")
    assert second.header("ratelimit") == '"api";r=98;t=45'
    assert second.header("x-ratelimit-reset") == "45"


async def test_429_answer(limiter: Limiter, clock: FakeClock) -> None:
    app = wrap(limiter, [Rule("/api/**", "3/min", name="api")])
    replies = await run(app, 3)
    assert [r.status for r in replies] == [200, 200, 200]
    clock.advance(20.5)
    limited = await request(app, "/api/x")
    assert limited.status == 429
    assert limited.header("content-type") == "application/problem+json"
    assert limited.header("x-app") is None  # the app never ran
    assert limited.header("retry-after") == "40"  # ceil(39.5), the next aligned window
    assert limited.header("ratelimit") == '"api";r=0;t=40'
    assert limited.header("x-ratelimit-remaining") == "0"
    assert int(limited.header("content-length") or -1) == len(limited.body)
    problem = limited.json()
    assert problem["status"] == 429
    assert problem["title"] == "Too Many Requests"
    assert problem["type"] == "about:blank"
    assert problem["retry_after"] == 40
    assert problem["policy"] == "api" and problem["limit"] == 3
    assert "40" in problem["detail"]
    clock.advance(39.5)
    assert (await request(app, "/api/x")).status == 200


async def test_t_is_the_time_until_more_quota_not_past_the_window(limiter: Limiter, clock: FakeClock) -> None:
    """draft-10's ``t``: seconds until more quota is made available. A sliding window's request
    fades over the next window (fully restored 2 periods later), yet quota comes back from the
    next boundary: ``t`` names the boundary and never exceeds ``w``."""
    app = wrap(limiter, [Rule("/api/**", "100/min", name="api", algorithm="sliding_window")])
    clock.advance(15.0)
    first = await request(app, "/api/x")
    assert first.header("ratelimit-policy") == '"api";q=100;w=60'
    assert first.header("ratelimit") == '"api";r=99;t=45'  # was t=105: 15 s in, the window ends at 60
    assert first.header("x-ratelimit-reset") == "45"


async def test_t_of_a_bucket_bigger_than_its_rate_stays_within_the_window(
    limiter: Limiter, clock: FakeClock
) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/s burst 5", name="b", algorithm="token_bucket")])
    replies = await run(app, 3)
    assert [r.header("ratelimit") for r in replies][-1] == '"b";r=2;t=1'  # 3 s to full, a token in 1
    assert replies[-1].header("x-ratelimit-reset") == "1"


async def test_t_of_a_429_is_its_retry_after(limiter: Limiter, clock: FakeClock) -> None:
    app = wrap(limiter, [Rule("/api/**", "2/min", name="s", algorithm="sliding_window")])
    clock.advance(30.0)
    assert [r.status for r in await run(app, 2)] == [200, 200]
    limited = await request(app, "/api/x")
    assert limited.status == 429
    # The count of this window fades over the next one: one unit is back 30 s after the boundary.
    assert limited.header("retry-after") == "60"
    assert limited.header("ratelimit") == '"s";r=0;t=60'  # was t=90, the full restore


async def test_reused_429_answers_track_the_clock_and_survive_outer_middleware(
    limiter: Limiter, clock: FakeClock
) -> None:
    """429 bodies and headers are built once and reused: a later rejection must still carry its
    own Retry-After, and an outer middleware appending to the header list must not leak into the
    next rejection."""
    app = wrap(limiter, [Rule("/api/**", "1/min", name="api")])

    async def outer(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        async def appending(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"].append((b"x-outer", b"1"))  # in place, as CORS middleware does
            await send(message)

        await app(scope, receive, appending)

    assert (await request(outer, "/api/x")).status == 200
    first, second = await request(outer, "/api/x"), await request(outer, "/api/x")
    clock.advance(30.0)
    later = await request(outer, "/api/x")
    for reply in (first, second, later):
        assert reply.status == 429
        assert reply.headers_named("x-outer") == ["1"]
        assert int(reply.header("content-length") or -1) == len(reply.body)
    assert first.header("retry-after") == second.header("retry-after") == "60"
    assert later.header("retry-after") == "30" and later.json()["retry_after"] == 30
    assert later.header("ratelimit") == '"api";r=0;t=30'


async def test_cost_that_can_never_fit_has_no_retry_after(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "3/min", cost=5)])
    limited = await request(app, "/api/x")
    assert limited.status == 429
    assert limited.header("retry-after") is None
    assert limited.json()["retry_after"] is None


@pytest.mark.parametrize("mode", ["always", "on_limit", "off"])
async def test_header_modes(limiter: Limiter, mode: str) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min")], headers=mode)
    ok, limited = await run(app, 2)
    assert (ok.status, limited.status) == (200, 429)
    assert (ok.header("ratelimit") is not None) == (mode == "always")
    assert (ok.header("x-ratelimit-limit") is not None) == (mode == "always")
    assert (limited.header("ratelimit") is not None) == (mode != "off")
    assert (limited.header("x-ratelimit-remaining") is not None) == (mode != "off")
    assert limited.header("retry-after") == "60"  # Retry-After is part of every 429


@pytest.mark.parametrize(
    ("style", "ietf", "legacy"), [("both", True, True), ("ietf", True, False), ("legacy", False, True)]
)
async def test_header_styles(limiter: Limiter, style: str, ietf: bool, legacy: bool) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min")], header_style=style)
    ok, limited = await run(app, 2)
    for reply in (ok, limited):
        assert (reply.header("ratelimit") is not None) == ietf
        assert (reply.header("ratelimit-policy") is not None) == ietf
        assert (reply.header("x-ratelimit-limit") is not None) == legacy
        assert (reply.header("x-ratelimit-reset") is not None) == legacy


def test_bad_options_are_rejected(limiter: Limiter) -> None:
    with pytest.raises(ValueError, match="headers"):
        wrap(limiter, [], headers="sometimes")
    with pytest.raises(ValueError, match="header_style"):
        wrap(limiter, [], header_style="fancy")
    with pytest.raises(TypeError, match="Rule"):
        wrap(limiter, ["/api/**"])  # type: ignore[list-item]


async def test_several_rates_report_the_tightest(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "10/s; 3/min", name="api")])
    first = await request(app, "/api/x")
    assert first.header("x-ratelimit-limit") == "3"
    assert first.header("x-ratelimit-remaining") == "2"


# --- custom handlers ----------------------------------------------------------------------------


async def test_custom_sync_on_limit_handler(limiter: Limiter) -> None:
    seen: list[Decision] = []

    def on_limit(scope: MutableMapping[str, Any], decision: Decision) -> Response:
        seen.append(decision)
        return PlainTextResponse(f"slow down, {scope['path']}", 429, {"retry-after": "7"})

    app = wrap(limiter, [Rule("/api/**", "1/min")], on_limit=on_limit)
    ok, limited = await run(app, 2)
    assert ok.status == 200
    assert limited.status == 429 and limited.body == b"slow down, /api/x"
    assert limited.header("retry-after") == "7"
    assert len(seen) == 1 and not seen[0].allowed and seen[0].limit == 1


async def test_custom_async_on_limit_handler(limiter: Limiter) -> None:
    async def on_limit(scope: MutableMapping[str, Any], decision: Decision) -> Response:
        return Response(b"custom", 503)

    app = wrap(limiter, [Rule("/api/**", "1/min")], on_limit=on_limit)
    _, limited = await run(app, 2)
    assert (limited.status, limited.body) == (503, b"custom")


# --- rules and wildcards ------------------------------------------------------------------------


async def statuses(app: RateLimitMiddleware, paths: Sequence[str], method: str = "GET") -> list[int]:
    return [(await request(app, p, method=method)).status for p in paths]


async def test_single_segment_wildcard(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/users/*", "1/min")])
    assert await statuses(app, ["/users/1/posts"] * 3) == [200, 200, 200]  # two segments: no match
    assert await statuses(app, ["/users"] * 2) == [200, 200]  # no segment: no match
    # One rule, one client: /users/1 and /users/2 share the rule's counter.
    assert await statuses(app, ["/users/1", "/users/2"]) == [200, 429]


async def test_multi_segment_wildcard(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "4/min")])
    assert await statuses(app, ["/apix", "/v1/api", "/ap"] * 3) == [200] * 9
    assert await statuses(app, ["/api", "/api/", "/api/a/b/c", "/api/x"]) == [200] * 4
    assert await statuses(app, ["/api/q"]) == [429]


async def test_wildcards_in_the_middle(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/orgs/*/repos/**", "1/min")])
    assert await statuses(app, ["/orgs/a/repos/b/c", "/orgs/z/repos"]) == [200, 429]
    assert await statuses(app, ["/orgs/a/b/repos/x"] * 2) == [200, 200]


async def test_regex_rules(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("re:/v[0-9]+/items", "2/min"), Rule(re.compile(r"/legacy/.*\.php"), "1/min")])
    assert await statuses(app, ["/vx/items", "/v1/items/more", "/v1/itemsx"] * 2) == [200] * 6
    assert await statuses(app, ["/v1/items", "/v22/items", "/v3/items"]) == [200, 200, 429]
    assert await statuses(app, ["/legacy/a/b.php", "/legacy/c.php", "/legacy/c.phpx"]) == [200, 429, 200]


async def test_method_filters(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min", methods=["post", "PUT"])])
    assert await statuses(app, ["/api/x"] * 3, "GET") == [200] * 3
    assert await statuses(app, ["/api/x"] * 2, "POST") == [200, 429]
    assert await statuses(app, ["/api/x"], "PUT") == [429]


async def test_bypass_rules_win_whatever_their_order(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "2/min"), Rule("/api/health", bypass=True)])
    health = await run(app, 5, "/api/health")
    assert [r.status for r in health] == [200] * 5
    assert health[0].header("ratelimit") is None  # bypassed: not charged, no headers
    # The bypassed requests did not consume the /api/** allowance.
    assert await statuses(app, ["/api/x", "/api/y", "/api/z"]) == [200, 200, 429]


async def test_bypass_by_method(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min"), Rule("/**", methods=["OPTIONS"], bypass=True)])
    assert await statuses(app, ["/a"] * 3, "OPTIONS") == [200] * 3
    assert await statuses(app, ["/a"] * 2) == [200, 429]


async def test_several_rules_are_all_or_nothing(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "5/min", name="api"), Rule("/api/expensive", "2/min", name="expensive")])
    replies = await run(app, 3, "/api/expensive")
    assert [r.status for r in replies] == [200, 200, 429]
    assert replies[2].json()["policy"] == "expensive"
    # The denied request charged neither rule: /api/** has 5 - 2 used = 3 left, so 1 more -> 2.
    other = await request(app, "/api/other")
    assert other.status == 200
    assert other.header("x-ratelimit-remaining") == "2"


async def test_unmatched_paths_pass_untouched(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min")])
    for _ in range(3):
        reply = await request(app, "/public")
        assert reply.status == 200 and reply.header("ratelimit") is None


async def test_rules_can_be_replaced_at_run_time(limiter: Limiter) -> None:
    rules = RuleSet([Rule("/api/**", "1/min")])
    app = wrap(limiter, rules)
    assert await statuses(app, ["/api/x", "/api/x", "/other"]) == [200, 429, 200]
    rules.replace([Rule("/other", "1/min")])
    assert await statuses(app, ["/api/x", "/other", "/other"]) == [200, 200, 429]


async def test_many_rules_match_like_one(limiter: Limiter) -> None:
    rules = [Rule(f"/svc{i}/**", "1/min") for i in range(50)]
    app = wrap(limiter, rules)
    assert await statuses(app, ["/svc37/a", "/svc37/b", "/svc38/a", "/svc5"]) == [200, 429, 200, 200]


async def test_shadow_rules_never_block(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/api/**", "1/min", shadow=True)])
    assert await statuses(app, ["/api/x"] * 3) == [200] * 3


async def test_cost_per_rule(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/upload", "10/min", cost=4), Rule("/dyn", "10/min", cost=lambda s: len(s["path"]))])
    replies = await run(app, 3, "/upload")
    assert [r.status for r in replies] == [200, 200, 429]
    assert replies[1].header("x-ratelimit-remaining") == "2"
    assert await statuses(app, ["/dyn", "/dyn", "/dyn"]) == [200, 200, 429]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Rule("api/**", "1/min"),
        lambda: Rule("/api"),
        lambda: Rule("re:(", "1/min"),
        lambda: Rule("/api", "1/fortnight"),
        lambda: Rule("/api", "1/min", algorithm="nope"),
        lambda: Rule("/api", "1/min", cost=-1),
    ],
)
def test_bad_rules_fail_at_construction(bad: Any) -> None:
    with pytest.raises(ValueError):
        bad()


async def test_disabled_limiter_passes_everything(clock: FakeClock) -> None:
    limiter = Limiter(MemoryStore(clock=clock), enabled=False)
    app = wrap(limiter, [Rule("/api/**", "1/min")])
    assert await statuses(app, ["/api/x"] * 3) == [200] * 3


async def test_non_http_scopes_pass_through(limiter: Limiter) -> None:
    seen: list[str] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    middleware = RateLimitMiddleware(app, limiter=limiter, rules=[Rule("/**", "1/min")])
    await middleware({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


async def test_decision_is_available_to_the_app(limiter: Limiter) -> None:
    captured: list[Any] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        context = context_of(scope)
        captured.append(context.decision if context is not None else None)
        await ok_app(scope, receive, send)

    middleware = RateLimitMiddleware(app, limiter=limiter, rules=[Rule("/**", "5/min")])
    await request(middleware, "/x")
    assert isinstance(captured[0], Decision) and captured[0].remaining == 4


# --- odd input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/api/%2e%2e/x", "//api//x", "/api/" + "x" * 20_000, "/api/é/ü", "/api/\x00", "/api/../../etc/passwd", "/api/{x}"],
)
async def test_odd_paths_are_served_and_limited(limiter: Limiter, path: str) -> None:
    app = wrap(limiter, [Rule("/**", "2/min")])
    assert await statuses(app, [path] * 3) == [200, 200, 429]


async def test_missing_client_is_served_and_limited(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "2/min")])
    replies = await run(app, 3, "/x", client=None)
    assert [r.status for r in replies] == [200, 200, 429]
    # Another peer is not affected by the anonymous bucket.
    assert (await request(app, "/x")).status == 200


async def test_non_ascii_and_oversized_header_keys(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "1/min", key=header("X-API-Key"))])
    for value in (b"\xc3\xa9\xff\xfe", "k" * 50_000, b"a{b}c", b"\x00\x01"):
        replies = await run(app, 2, "/x", headers=[(b"x-api-key", value)])
        assert [r.status for r in replies] == [200, 429], value[:10]
    stored = list(limiter.store._data)  # type: ignore[attr-defined]
    assert all(len(k) < 400 for k in stored)
    assert all(k.count("{") == 1 and k.count("}") == 1 for k in stored)


async def test_non_ascii_rule_names_give_valid_headers(limiter: Limiter) -> None:
    app = wrap(limiter, [Rule("/**", "3/min", name="lïmit ünicode")])
    reply = await request(app, "/x")
    assert reply.status == 200
    value = reply.header("ratelimit-policy") or ""
    assert value.isascii() and value.endswith(";q=3;w=60")


async def test_ratelimit_policy_lists_every_limit_that_applied(limiter: Limiter) -> None:
    """Draft-10 RateLimit-Policy is a list: every limit charged is stated, the binding one in RateLimit."""
    app = wrap(limiter, [Rule("/api/**", "2/min; 100/hour", name="api"), Rule("/**", "5/min", name="all")])
    first = await request(app, "/api/x")
    policy = '"api-2/min";q=2;w=60, "api-100/hour";q=100;w=3600, "all";q=5;w=60'
    assert first.header("ratelimit-policy") == policy
    assert first.header("ratelimit") == '"api-2/min";r=1;t=60'
    await request(app, "/api/x")
    limited = await request(app, "/api/x")
    assert limited.status == 429 and limited.header("ratelimit-policy") == policy
    # A request only one rule applies to states that rule's limit alone.
    assert (await request(app, "/other")).header("ratelimit-policy") == '"all";q=5;w=60'
