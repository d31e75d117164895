"""@limit on function- and class-based views, sync and async, with each kind of key."""

from __future__ import annotations

import json

import django
import pytest
from django.test import AsyncClient, Client, RequestFactory

from ratewarden.django import SettingsError, limit
from ratewarden.errors import ConfigurationError


def codes(client: Client, path: str, n: int, **extra: object) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]  # type: ignore[arg-type]


async def acodes(client: AsyncClient, path: str, n: int, **extra: object) -> list[int]:
    return [(await client.get(path, **extra)).status_code for _ in range(n)]  # type: ignore[arg-type]


def test_function_view() -> None:
    client = Client()
    responses = [client.get("/fbv") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert responses[0]["X-RateLimit-Remaining"] == "2"
    assert responses[0]["RateLimit-Policy"] == '"3/m";q=3;w=60'  # the rate as written, not the module path
    assert responses[3]["Content-Type"] == "application/problem+json" and "Retry-After" in responses[3]


async def test_async_function_view() -> None:
    client = AsyncClient()
    assert await acodes(client, "/afbv", 4) == [200, 200, 200, 429]
    assert await acodes(client, "/afbv", 4, headers={"X-User": "erin"}) == [200, 200, 200, 429]


def test_async_function_view_under_wsgi() -> None:
    assert codes(Client(), "/afbv", 4) == [200, 200, 200, 429]


def test_user_key() -> None:
    client = Client()
    assert codes(client, "/user", 4, headers={"X-User": "frank"}) == [200, 200, 200, 429]
    assert codes(client, "/user", 1, headers={"X-User": "grace"}) == [200]


def test_class_based_view() -> None:
    assert codes(Client(), "/cbv", 3) == [200, 200, 429]


async def test_async_class_based_views() -> None:
    client = AsyncClient()
    assert await acodes(client, "/acbv", 3) == [200, 200, 429]
    if django.VERSION >= (5, 0):  # Django 4.2's method_decorator makes an async handler sync
        assert await acodes(client, "/method", 3) == [200, 200, 429]


def test_async_class_based_view_under_wsgi() -> None:
    assert codes(Client(), "/acbv", 3) == [200, 200, 429]


def test_block_false_sets_request_limited() -> None:
    client = Client()
    seen = [json.loads(client.get("/soft").content)["limited"] for _ in range(3)]
    assert seen == [False, True, True]  # the inner 1/m is over on the second request


def test_post_key_and_method() -> None:
    client = Client()
    assert [client.post("/login", {"username": "ann"}).status_code for _ in range(3)] == [200, 200, 429]
    assert client.post("/login", {"username": "ben"}).status_code == 200
    assert codes(client, "/login", 4) == [200] * 4  # GET is not counted


def test_header_and_get_keys() -> None:
    client = Client()
    assert codes(client, "/header", 3, headers={"X-API-Key": "k1"}) == [200, 200, 429]
    assert codes(client, "/header", 1, headers={"X-API-Key": "k2"}) == [200]
    assert codes(client, "/get?token=t1", 3) == [200, 200, 429]
    assert codes(client, "/get?token=t2", 1) == [200]


def test_callable_keys() -> None:
    client = Client()
    assert codes(client, "/callable?team=red", 3) == [200, 200, 429]
    assert codes(client, "/callable?team=blue", 1) == [200]
    # (group, request): both views name the group "shared-group", so they share one count.
    assert [client.get("/group-a").status_code, client.get("/group-b").status_code,
            client.get("/group-a").status_code] == [200, 200, 429]
    assert codes(client, "/scope-key", 3, headers={"X-Tenant": "acme"}) == [200, 200, 429]


async def test_async_callable_key() -> None:
    client = AsyncClient()
    assert await acodes(client, "/async-callable?team=red", 3) == [200, 200, 429]
    assert await acodes(client, "/async-callable?team=blue", 1) == [200]


def test_request_factory_and_direct_calls() -> None:
    from tests.django.app import fbv

    factory = RequestFactory()
    assert [fbv(factory.get("/anything", REMOTE_ADDR="198.51.100.1")).status_code for _ in range(4)] == [200] * 3 + [429]


def test_bad_arguments_fail_at_decoration() -> None:
    with pytest.raises(ConfigurationError):
        limit("ten a minute")
    with pytest.raises(ConfigurationError, match="invalid key"):
        limit("1/m", key="cookie:x")
    with pytest.raises(ConfigurationError, match="cannot import"):
        limit("1/m", key="no.such.module.key")
    with pytest.raises(ConfigurationError):
        limit("1/m", method="GETT")
    with pytest.raises(ConfigurationError, match="cost must be a finite number >= 0, got -1"):
        limit("1/m", cost=-1)

    async def akey(request: object) -> str:
        return "x"

    with pytest.raises(ConfigurationError, match="async view"):
        limit("1/m", key=akey)(lambda request: None)
    assert issubclass(SettingsError, ConfigurationError)
