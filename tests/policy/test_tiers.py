"""Three groups under real concurrent traffic each get their own limits."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from ratewarden import Limiter, MemoryStore
from ratewarden.policy import PolicyMiddleware, parse_policy

from .apps import build_app, client, tiered_policy


async def _burst(http, headers: dict[str, str], n: int, path: str = "/api/items") -> Counter[int]:
    responses = await asyncio.gather(*(http.get(path, headers=headers) for _ in range(n)))
    return Counter(r.status_code for r in responses)


async def test_each_group_gets_its_own_limits() -> None:
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(tiered_policy(1000, 20, 5)))
    async with client(app) as http:
        premium, standard, basic, unknown, internal = await asyncio.gather(
            _burst(http, {"X-API-Key": "pk-premium"}, 60),
            _burst(http, {"Authorization": "Bearer sk-standard"}, 60),
            _burst(http, {"X-API-Key": "trial-1"}, 60),
            _burst(http, {"X-API-Key": "never-issued"}, 60),
            _burst(http, {"X-API-Key": "cron"}, 60),
        )
        anonymous = await _burst(http, {}, 10)
        healthy = await _burst(http, {}, 10, "/health")
    assert premium == {200: 60}
    assert standard == {200: 20, 429: 40}
    # Every basic key has its own counter: trial-1 and never-issued each get 5.
    assert basic == {200: 5, 429: 55}
    assert unknown == {200: 5, 429: 55}
    assert internal == {200: 60}
    assert anonymous == {200: 3, 429: 7}
    assert healthy == {200: 10}


async def test_429_names_the_group_and_its_values() -> None:
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(tiered_policy(basic=2)))
    async with client(app) as http:
        for _ in range(2):
            assert (await http.get("/api/x", headers={"X-API-Key": "trial-9"})).status_code == 200
        denied = await http.get("/api/x", headers={"X-API-Key": "trial-9"})
    assert denied.status_code == 429
    body = denied.json()
    assert body["group"] == "basic" and body["limit"] == 2 and body["remaining"] == 0
    assert body["retry_after"] >= 1 and body["policy"] == "api.basic"
    assert "group 'basic'" in body["detail"]
    assert denied.headers["retry-after"] == str(body["retry_after"])


async def test_stats_report_a_key_across_its_limits(tmp_path: Path) -> None:
    text = tiered_policy(basic=5).replace('limits = ["5/min"]', 'limits = ["5/min", "50/hour"]')
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(text))
    async with client(app) as http:
        for _ in range(3):
            await http.get("/api/x", headers={"X-API-Key": "trial-7"})
    stats = await app.stats(api_key="trial-7")
    by_rate = {s["rate"]: s for s in stats}
    assert by_rate["5/minute"]["remaining"] == 2 and by_rate["5/minute"]["group"] == "basic"
    assert by_rate["50/hour"]["remaining"] == 47
    # Peeking charged nothing.
    again = await app.stats(api_key="trial-7")
    assert [s["remaining"] for s in again] == [s["remaining"] for s in stats]
