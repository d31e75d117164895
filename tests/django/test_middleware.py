"""RateLimitMiddleware with django.test.Client (WSGI, sync path) and AsyncClient (ASGI, async path)."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient, Client, override_settings

from ratewarden import MemoryStore
from ratewarden.errors import StoreError
from tests.django.settings import frozen, ratewarden_settings


class FailingStore(MemoryStore):
    """Every check fails, as an unreachable store's would."""

    def hit_now(self, keys, limits, costs):  # type: ignore[no-untyped-def]
        raise StoreError("down", reason="unreachable")

    def hit_one(self, key, limit, cost):  # type: ignore[no-untyped-def]
        raise StoreError("down", reason="unreachable")

    def hit_blocking(self, keys, limits, costs):  # type: ignore[no-untyped-def]
        raise StoreError("down", reason="unreachable")

    async def hit(self, keys, limits, costs):  # type: ignore[no-untyped-def]
        raise StoreError("down", reason="unreachable")


def test_sync_path_limits_with_429_problem_and_headers() -> None:
    client = Client()
    responses = [client.get("/mw/hello") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    first, last = responses[0], responses[-1]
    assert first.content == b"hello"
    assert first["X-RateLimit-Limit"] == "5" and first["X-RateLimit-Remaining"] == "4"
    assert first["RateLimit-Policy"] == '"/mw/**";q=5;w=60'
    assert last["Content-Type"] == "application/problem+json"
    assert int(last["Retry-After"]) >= 1
    assert int(last["Content-Length"]) == len(last.content)
    body = json.loads(last.content)
    assert body["status"] == 429 and body["limit"] == 5 and body["title"] == "Too Many Requests"


def test_unmatched_paths_pass_without_headers() -> None:
    response = Client().get("/free")
    assert response.status_code == 200 and "X-RateLimit-Limit" not in response


def test_clients_are_counted_apart() -> None:
    assert [Client(REMOTE_ADDR="10.0.0.1").get("/mw/hello").status_code for _ in range(6)][-1] == 429
    assert Client(REMOTE_ADDR="10.0.0.2").get("/mw/hello").status_code == 200


def test_methods_of_a_rule() -> None:
    client = Client()
    assert [client.post("/mwpost/hello").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/mwpost/hello").status_code == 200  # GET is not limited there


async def test_async_path_limits_sync_and_async_views() -> None:
    client = AsyncClient()
    codes = [(await client.get("/mw/async")).status_code for _ in range(3)]
    codes += [(await client.get("/mw/hello")).status_code for _ in range(3)]
    assert codes == [200] * 5 + [429]
    response = await client.get("/mw/async")
    assert response["Content-Type"] == "application/problem+json" and "Retry-After" in response


async def test_user_key_loads_the_user_off_the_event_loop() -> None:
    """``request.user`` is a lazy "database" object that refuses the event loop: the key awaits
    ``request.auser()`` (Django 5), or loads it in a thread (no ``auser``)."""
    client = AsyncClient()
    alice = [(await client.get("/mwuser/hello", headers={"X-User": "alice"})).status_code for _ in range(3)]
    bob = [(await client.get("/mwuser/hello", headers={"X-User": "bob", "X-No-Auser": "1"})).status_code
           for _ in range(3)]
    assert alice == bob == [200, 200, 429]
    # Anonymous requests are charged to their IP, not one shared bucket.
    assert (await client.get("/mwuser/hello")).status_code == 200


def test_user_key_under_wsgi() -> None:
    client = Client()
    assert [client.get("/mwuser/hello", headers={"X-User": "carol"}).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/mwuser/hello", headers={"X-User": "dave"}).status_code == 200


def test_trusted_proxies() -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(TRUSTED_PROXIES=["10.0.0.0/8"])):
        proxy = Client(REMOTE_ADDR="10.1.2.3")
        codes = [proxy.get("/mw/hello", headers={"X-Forwarded-For": "203.0.113.7"}).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
        assert proxy.get("/mw/hello", headers={"X-Forwarded-For": "203.0.113.8"}).status_code == 200
    # Not trusted: the header is ignored, the peer is charged.
    stranger = Client(REMOTE_ADDR="192.0.2.1")
    codes = [stranger.get("/mw/hello", headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code for i in range(6)]
    assert codes == [200] * 5 + [429]


def test_trusted_proxies_apply_to_rule_objects_on_the_default_key() -> None:
    """A ``Rule`` left on the default key follows TRUSTED_PROXIES as a dict rule's ``"ip"`` does; one
    with its own key keeps it."""
    from ratewarden import Rule
    from ratewarden.keys import header

    rules = [Rule("/mw/**", "2/min", name="objects"), Rule("/mwuser/**", "2/min", key=header("X-User"))]
    with override_settings(RATEWARDEN=ratewarden_settings(TRUSTED_PROXIES=["10.0.0.0/8"], RULES=rules)):
        proxy = Client(REMOTE_ADDR="10.1.2.3")
        first = [proxy.get("/mw/hello", headers={"X-Forwarded-For": "203.0.113.7"}).status_code for _ in range(3)]
        assert first == [200, 200, 429]
        assert proxy.get("/mw/hello", headers={"X-Forwarded-For": "203.0.113.8"}).status_code == 200
        stranger = Client(REMOTE_ADDR="192.0.2.1")  # not a proxy: its header is ignored
        spoofed = [stranger.get("/mw/hello", headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code
                   for i in range(3)]
        assert spoofed == [200, 200, 429]
        users = [proxy.get("/mwuser/hello", headers={"X-User": "erin", "X-Forwarded-For": f"203.0.113.{i}"}).status_code
                 for i in range(3)]
        assert users == [200, 200, 429]  # its own key: one count for erin, whatever the address


@pytest.mark.parametrize(("options", "expected"), [
    ({"HEADERS": "off"}, set()),
    ({"HEADERS": "on_limit"}, set()),
    ({"HEADER_STYLE": "ietf"}, {"ratelimit", "ratelimit-policy"}),
    ({"HEADER_STYLE": "legacy"}, {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}),
])
def test_header_settings(options: dict[str, str], expected: set[str]) -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(**options)):
        client = Client()
        allowed = client.get("/mw/hello")
        assert {n.lower() for n in allowed.headers if "ratelimit" in n.lower()} == expected
        for _ in range(5):
            denied = client.get("/mw/hello")
        assert denied.status_code == 429 and "Retry-After" in denied
        assert ("X-RateLimit-Limit" in denied) == (options.get("HEADERS") == "on_limit"
                                                   or options.get("HEADER_STYLE") == "legacy")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["wsgi", "asgi"])
async def test_failure_policy(asynchronous: bool) -> None:
    async def get(path: str) -> object:
        if asynchronous:
            return await AsyncClient().get(path)
        return Client().get(path)

    with override_settings(RATEWARDEN=ratewarden_settings(STORE=FailingStore(clock=frozen))):
        # The insurance limiter decides while the store fails: still 5/min.
        assert [(await get("/mw/hello")).status_code for _ in range(7)] == [200] * 5 + [429] * 2  # type: ignore[attr-defined]
    with override_settings(RATEWARDEN=ratewarden_settings(STORE=FailingStore(clock=frozen), ON_ERROR="closed")):
        response = await get("/mw/hello")
        assert response.status_code == 503  # type: ignore[attr-defined]
        assert response["Content-Type"] == "application/problem+json"  # type: ignore[index]
        assert response["Retry-After"] == "1"  # type: ignore[index]
        assert (await get("/free")).status_code == 200  # type: ignore[attr-defined]


def test_disabled_is_a_pass_through() -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(ENABLED=False)):
        client = Client()
        assert {client.get("/mw/hello").status_code for _ in range(8)} == {200}
