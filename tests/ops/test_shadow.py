"""Shadow mode counts and reports, and never blocks."""

from __future__ import annotations

from collections import Counter

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.keys import header
from ratewarden.metrics import Metrics
from ratewarden.policy import PolicyMiddleware, parse_policy

from ..policy.apps import build_app, client


async def test_global_shadow_never_blocks_and_says_what_would_happen() -> None:
    metrics = Metrics()
    app = PolicyMiddleware(
        build_app(), Limiter(MemoryStore()), [Rule("/api/**", "3/min", name="api")], shadow=True, metrics=metrics
    )
    async with client(app) as http:
        responses = [await http.get("/api/x") for _ in range(10)]
    assert Counter(r.status_code for r in responses) == {200: 10}
    flagged = [r for r in responses if "ratelimit-shadow" in r.headers]
    assert len(flagged) == 7
    assert flagged[0].headers["ratelimit-shadow"].startswith('"api";deny;r=0;t=')
    assert all("ratelimit-shadow" not in r.headers for r in responses[:3])
    text = metrics.exposition().decode()
    assert 'ratewarden_requests_shadow_limited_total{group="",rule="api"} 7.0' in text
    assert 'ratewarden_requests_limited_total{group="",rule="api"}' not in text
    metrics.close()


async def test_policy_shadow_setting_and_shadow_rule() -> None:
    policy = parse_policy(
        '[settings]\nshadow = true\n[[rules]]\nname = "a"\npath = "/api/**"\nrate = "1/min"\n'
        '[[rules]]\nname = "s"\npath = "/search"\nrate = "1/min"\nshadow = true\n'
    )
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=policy)
    assert app.shadow
    async with client(app) as http:
        api = [await http.get("/api/x") for _ in range(5)]
        search = [await http.get("/search") for _ in range(5)]
    assert [r.status_code for r in api + search] == [200] * 10
    assert sum("ratelimit-shadow" in r.headers for r in search) == 4


async def test_per_rule_shadow_with_enforcing_rule_alongside() -> None:
    rules = [
        Rule("/api/**", "5/min", name="enforced", key=header("X-Client")),
        Rule("/api/**", "2/min", name="trial", key=header("X-Client"), shadow=True),
    ]
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), rules)
    async with client(app) as http:
        got = [await http.get("/api/x", headers={"X-Client": "c"}) for _ in range(7)]
    assert [r.status_code for r in got] == [200] * 5 + [429] * 2
    assert [("ratelimit-shadow" in r.headers) for r in got[:5]] == [False, False, True, True, True]
