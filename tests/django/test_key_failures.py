"""Issue 28, finding 5 on the Django door: a key function that raises never lifts the limit (the
request is charged to the client's address instead), and a callable key that cannot take the
request is refused where it is declared."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import AsyncClient, Client, override_settings

from ratewarden.errors import ConfigurationError
from tests.django.settings import ratewarden_settings


def broken(request: Any) -> str:
    raise RuntimeError("auth service down")


@pytest.fixture(autouse=True)
def unthrottled_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ratewarden.enforcement.core._last_error_log", -1e9)


def test_middleware_sync_path_charges_the_client_address_when_the_key_raises() -> None:
    rules = [{"path": "/mw/**", "rate": "2/min", "key": broken}]
    with override_settings(RATEWARDEN=ratewarden_settings(RULES=rules)):
        assert [Client().get("/mw/hello").status_code for _ in range(4)] == [200, 200, 429, 429]
        assert Client(REMOTE_ADDR="10.0.0.9").get("/mw/hello").status_code == 200


async def test_middleware_async_path_charges_the_client_address_when_the_key_raises() -> None:
    rules = [{"path": "/mw/**", "rate": "2/min", "key": broken}]
    with override_settings(RATEWARDEN=ratewarden_settings(RULES=rules)):
        client = AsyncClient()
        assert [(await client.get("/mw/async")).status_code for _ in range(4)] == [200, 200, 429, 429]


def test_a_key_that_cannot_take_the_request_is_refused_where_it_is_declared() -> None:
    from ratewarden.django import SettingsError, limit, load_config

    def get_user() -> str:
        return "u"

    def three(a: Any, b: Any, c: Any) -> str:
        return "k"

    with pytest.raises(ConfigurationError, match=r"get_user\(\).* cannot be called with one argument, the request"):
        limit("2/m", key=get_user)
    with pytest.raises(ConfigurationError, match=r"three\(.* cannot be called with two arguments, \(group, request\)"):
        limit("2/m", key=three)
    with pytest.raises(SettingsError, match=r"RULES.*get_user"):
        load_config({"RULES": [{"path": "/x", "rate": "1/s", "key": get_user}]})
