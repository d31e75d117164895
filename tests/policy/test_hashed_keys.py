"""Policy files with header and query keys, now hashed by default: tiers still pick the group from
the raw API key (exact, SHA-256 and pattern tables), and no API key reaches the store."""

from __future__ import annotations

import hashlib

from ratewarden import Limiter, MemoryStore
from ratewarden.cli.policy import explain
from ratewarden.policy import PolicyMiddleware, parse_policy

from .apps import build_app, client

GOLD = "sk-live-gold-1"
HASHED_GOLD = "sk-live-hashed-77"

POLICY = f"""
version = 1
[identity]
sources = ["header:X-API-Key", "query:api_key"]
unknown_group = "free"
anonymous_group = "anon"
[identity.keys]
"{GOLD}" = "gold"
[identity.hashed_keys]
"{hashlib.sha256(HASHED_GOLD.encode()).hexdigest()}" = "gold"
[identity.patterns]
"sk-trial-*" = "trial"
[groups.gold]
limits = ["3/min"]
[groups.trial]
limits = ["2/min"]
[groups.free]
limits = ["1/min"]
[groups.anon]
limits = ["1/min"]
[[rules]]
name = "api"
path = "/api/**"
tiered = true
[[rules]]
name = "per-key"
path = "/api/**"
rate = "100/min"
key = "header:X-API-Key"
[[rules]]
name = "search"
path = "/search"
rate = "1/min"
key = "query:api_key"
[bans]
after = 100
key = "header:X-API-Key"
"""


async def test_tiers_pick_groups_from_raw_keys_and_the_store_holds_only_digests() -> None:
    store = MemoryStore()
    app = PolicyMiddleware(build_app(), Limiter(store), policy=parse_policy(POLICY))
    sent = [GOLD, HASHED_GOLD, "sk-trial-9", "sk-unknown-5"]
    async with client(app) as http:
        got = {}
        for api_key in sent:  # (a loop: Python 3.10 refuses an await nested in two comprehensions)
            got[api_key] = [(await http.get("/api/x", headers={"X-API-Key": api_key})).status_code for _ in range(4)]
        # By query too: the identity reads it raw, the search rule charges its digest.
        by_query = [(await http.get("/search", params={"api_key": "sk-trial-q"})).status_code for _ in range(2)]
        denied = await http.get("/api/x", headers={"X-API-Key": GOLD})
    assert got == {
        GOLD: [200, 200, 200, 429],
        HASHED_GOLD: [200, 200, 200, 429],
        "sk-trial-9": [200, 200, 429, 429],
        "sk-unknown-5": [200, 429, 429, 429],
    }
    assert by_query == [200, 429]
    assert denied.json()["group"] == "gold"
    stored = list(store._data)
    assert any("x-api-key:" in k for k in stored)  # the header rule counted
    leaked = [k for k in stored if "sk-" in k]
    assert not leaked, leaked


def test_explain_shows_the_stored_key_not_the_secret() -> None:
    lines = explain(parse_policy(POLICY), "GET", "/api/x", [("X-API-Key", GOLD)])
    assert any("group gold" in line for line in lines)
    assert not [line for line in lines if GOLD in line]


def test_the_identity_cache_is_bounded_in_bytes() -> None:
    """The identity remembers each presented API key's group; 64 KB keys (a client writes them)
    must not make that cache hold 10,000 of them (640 MB)."""
    from ratewarden.policy import Identity

    identity = Identity(["header:X-API-Key"], keys={GOLD: "gold"}, unknown_group="free", anonymous_group="anon")
    for i in range(2048):
        api_key = f"{i}-" + "k" * (64 * 1024)
        scope = {"type": "http", "headers": [(b"x-api-key", api_key.encode())], "client": ("10.1.2.3", 1)}
        assert identity.group(scope) == "free"
        held = sum(len(k) for k in identity._cache)
        assert held <= 8 * 1024 * 1024, f"after {i + 1} keys"
    scope = {"type": "http", "headers": [(b"x-api-key", GOLD.encode())], "client": ("10.1.2.3", 1)}
    assert identity.resolve(scope) == identity.resolve(scope) == ("gold", identity.client_key(GOLD))
    assert GOLD in identity._cache  # short keys are still remembered
