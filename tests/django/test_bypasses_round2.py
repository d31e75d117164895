"""Issue 28's round-2 bypasses on the Django door (the other doors: tests/failures/test_bypasses_round2.py):
a ``GET`` limit charges ``HEAD`` (Django runs the ``GET`` view for it), a ``get:`` key given twice
with different values is refused (Django's view reads the last), and a trusted proxy's
``X-Forwarded-For`` entry loses its port. This module is its own URLconf."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratewarden.django import limit
from tests.django.settings import ratewarden_settings

REAL = "sk-real-caller"
ran: list[str] = []


def counted(request: Any) -> HttpResponse:
    ran.append(request.GET.get("api_key", request.method))
    return HttpResponse("ok")


@limit("3/h", method="GET")
def get_limited(request: Any) -> HttpResponse:
    return counted(request)


@limit("3/h", key="get:api_key")
def keyed(request: Any) -> HttpResponse:
    return counted(request)


urlpatterns = [
    path("rules/items", counted),
    path("rules/data", counted),
    path("view/items", get_limited),
    path("view/data", keyed),
]

RULES = [
    {"path": "/rules/items", "rate": "3/h", "methods": ["GET"]},
    {"path": "/rules/data", "rate": "3/h", "key": "get:api_key"},
]


@pytest.fixture(autouse=True)
def _urls_and_rules() -> Any:
    ran.clear()
    with override_settings(ROOT_URLCONF=__name__, RATEWARDEN=ratewarden_settings(RULES=RULES, TRUSTED_PROXIES=["127.0.0.1/32"])):
        yield


@pytest.mark.parametrize("where", ["rules", "view"])
def test_a_get_limit_charges_head(where: str) -> None:
    client = Client()
    codes = [client.get(f"/{where}/items").status_code for _ in range(3)] + [client.head(f"/{where}/items").status_code for _ in range(5)]
    assert codes == [200] * 3 + [429] * 5
    assert ran == ["GET"] * 3


@pytest.mark.parametrize("where", ["rules", "view"])
def test_a_get_key_given_twice_differently_is_refused(where: str) -> None:
    client = Client()
    assert [client.get(f"/{where}/data?api_key={REAL}").status_code for _ in range(4)] == [200, 200, 200, 429]
    for i in range(5):
        response = client.get(f"/{where}/data?api_key=rand-{i}&api_key={REAL}")
        assert response.status_code == 400
        assert b"'api_key' is given more than once with different values" in response.content
    assert ran == [REAL] * 3


def test_trusted_proxies_drop_the_port_of_a_forwarded_entry() -> None:
    client = Client(REMOTE_ADDR="127.0.0.1")
    entries = [f"198.51.100.9:{5000 + i}" for i in range(4)] + [f"[2001:db8::9]:{6000 + i}" for i in range(4)]
    codes = [client.get("/rules/items", headers={"X-Forwarded-For": e}).status_code for e in entries]
    assert codes == [200, 200, 200, 429] * 2
