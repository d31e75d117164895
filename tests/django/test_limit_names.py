"""Issue 39: ``@limit`` names its limit to clients as the user named it (the rate as written, or
``name=``), never as the view's module path, while each unnamed view keeps its own count; and
django-ratelimit's 403 is kept by an ``ON_LIMIT`` that raises ``PermissionDenied``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory
from django.test.utils import override_settings

from ratewarden import Limiter, MemoryStore
from ratewarden.django import limit
from tests.django.settings import ratewarden_settings
from tests.vectors.runner import FakeClock

FACTORY = RequestFactory()


def frozen() -> Limiter:
    return Limiter(MemoryStore(clock=FakeClock(6000.0)))


def hello(request: Any) -> HttpResponse:
    return HttpResponse("hello")


def other(request: Any) -> HttpResponse:
    return HttpResponse("other")


def calls(view: Any, count: int) -> list[Any]:
    return [view(FACTORY.get("/")) for _ in range(count)]


def test_an_unnamed_limit_is_shown_as_its_rate_not_the_views_module_path() -> None:
    """Was ``"policy": "tests.django.test_limit_names.hello"`` (``__main__.hello`` in a script)."""
    replies = calls(limit("2/m", limiter=frozen())(hello), 3)
    assert [r.status_code for r in replies] == [200, 200, 429]
    body = json.loads(replies[2].content)
    assert body["policy"] == "2/m"
    assert replies[0]["RateLimit-Policy"] == '"2/m";q=2;w=60'
    assert replies[2]["RateLimit"].startswith('"2/m";r=0;')
    for reply in replies:
        assert "hello" not in reply.get("RateLimit-Policy", "") and __name__ not in reply.content.decode()


def test_several_rates_are_each_named_as_written() -> None:
    replies = calls(limit("1/s; 100/h", limiter=frozen())(hello), 2)
    assert replies[0]["RateLimit-Policy"] == '"1/s";q=1;w=1, "100/h";q=100;w=3600'
    assert json.loads(replies[1].content)["policy"] == "1/s"
    named = calls(limit("1/s; 100/h", name="search", limiter=frozen())(hello), 1)[0]
    assert named["RateLimit-Policy"] == '"search-1/s";q=1;w=1, "search-100/h";q=100;w=3600'


def test_unnamed_views_with_one_rate_still_count_apart() -> None:
    """The module-qualified name still keeps the counts apart (django-ratelimit's ``group``)."""
    limiter = frozen()
    decorate = limit("1/m", limiter=limiter)
    first, second = decorate(hello), decorate(other)
    assert [r.status_code for r in calls(first, 2)] == [200, 429]
    assert [r.status_code for r in calls(second, 2)] == [200, 429]
    shared = limit("1/m", name="shared", limiter=limiter)
    assert [shared(hello)(FACTORY.get("/")).status_code, shared(other)(FACTORY.get("/")).status_code] == [200, 429]


def forbidden(request: Any, decision: Any) -> None:
    raise PermissionDenied


def test_on_limit_raising_permission_denied_is_django_ratelimits_403() -> None:
    """docs/django.md: django-ratelimit's ``Ratelimited`` is a ``PermissionDenied``; raised by
    ``ON_LIMIT`` it reaches Django's 403 handling as it did."""
    view = limit("1/m", limiter=frozen())(hello)
    with override_settings(RATEWARDEN={**ratewarden_settings(), "ON_LIMIT": forbidden}):
        assert view(FACTORY.get("/")).status_code == 200
        with pytest.raises(PermissionDenied):
            view(FACTORY.get("/"))
