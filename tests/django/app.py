"""The URLconf, views and stand-in authentication of tests/django."""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.asyncio import async_unsafe
from django.utils.decorators import method_decorator
from django.utils.functional import SimpleLazyObject
from django.views import View

from ratewarden.django import UNSAFE, limit
from ratewarden.keys import header


class User:
    is_authenticated = True

    def __init__(self, pk: str) -> None:
        self.pk = pk


class Anonymous:
    is_authenticated = False
    pk = None


@async_unsafe
def load_user(request: Any) -> Any:
    """Like django.contrib.auth's: a "database query", refused on the event loop."""
    name = request.headers.get("X-User")
    return User(name) if name else Anonymous()


class FakeAuthMiddleware:
    """``request.user`` as ``AuthenticationMiddleware`` sets it: lazy, and ``request.auser``
    (Django 5) unless the request says ``X-No-Auser``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _set(self, request: Any) -> None:
        request.user = SimpleLazyObject(lambda: load_user(request))
        if "X-No-Auser" not in request.headers:

            async def auser() -> Any:
                name = request.headers.get("X-User")
                return User(name) if name else Anonymous()

            request.auser = auser

    def __call__(self, request: Any) -> Any:
        self._set(request)
        if self.is_async:
            return self.get_response(request)
        return self.get_response(request)


def hello(request: Any) -> HttpResponse:
    return HttpResponse("hello")


async def ahello(request: Any) -> HttpResponse:
    return HttpResponse("hello async")


@limit("3/m")
def fbv(request: Any) -> HttpResponse:
    return HttpResponse("fbv")


@limit("3/m", key="user_or_ip")
async def afbv(request: Any) -> HttpResponse:
    return HttpResponse("afbv")


@limit("3/m", key="user")
def user_view(request: Any) -> HttpResponse:
    return HttpResponse("user")


@method_decorator(limit("2/m"), name="dispatch")
class ClassView(View):
    def get(self, request: Any) -> HttpResponse:
        return HttpResponse("cbv")


@method_decorator(limit("2/m", key="user_or_ip"), name="dispatch")
class AsyncClassView(View):
    async def get(self, request: Any) -> HttpResponse:
        return HttpResponse("acbv")


class MethodView(View):
    @method_decorator(limit("2/m", name="method-view"))
    async def get(self, request: Any) -> HttpResponse:
        return HttpResponse("method")


@limit("1/m", block=False)
@limit("2/m", block=False, name="soft-outer")
def soft(request: Any) -> JsonResponse:
    return JsonResponse({"limited": request.limited})


@limit("2/m", key="post:username", method=UNSAFE)
def login(request: Any) -> HttpResponse:
    return HttpResponse("login")


@limit("2/m", key="header:x-api-key")
def by_header(request: Any) -> HttpResponse:
    return HttpResponse("header")


@limit("2/m", key="get:token")
def by_get(request: Any) -> HttpResponse:
    return HttpResponse("get")


@limit("2/m", key=lambda request: request.GET.get("team"))
def by_callable(request: Any) -> HttpResponse:
    return HttpResponse("callable")


@limit("2/m", key=lambda group, request: group, name="shared-group")
def by_group_a(request: Any) -> HttpResponse:
    return HttpResponse("a")


@limit("2/m", key=lambda group, request: group, name="shared-group")
def by_group_b(request: Any) -> HttpResponse:
    return HttpResponse("b")


async def team_of(request: Any) -> str:
    return "team:" + request.GET.get("team", "")


@limit("2/m", key=team_of)
async def by_async_callable(request: Any) -> HttpResponse:
    return HttpResponse("async callable")


@limit("2/m", key=header("X-Tenant", hashed=False))
def by_scope_key(request: Any) -> HttpResponse:
    return HttpResponse("scope key")


@limit("100/day", algorithm="token_bucket", name="burst")
async def burst(request: Any) -> HttpResponse:
    return HttpResponse(json.dumps({"ok": True}))


urlpatterns = [
    path("mw/hello", hello),
    path("mw/async", ahello),
    path("mwuser/hello", hello),
    path("mwpost/hello", hello),
    path("free", hello),
    path("fbv", fbv),
    path("afbv", afbv),
    path("user", user_view),
    path("cbv", ClassView.as_view()),
    path("acbv", AsyncClassView.as_view()),
    path("method", MethodView.as_view()),
    path("soft", soft),
    path("login", login),
    path("header", by_header),
    path("get", by_get),
    path("callable", by_callable),
    path("group-a", by_group_a),
    path("group-b", by_group_b),
    path("async-callable", by_async_callable),
    path("scope-key", by_scope_key),
    path("burst", burst),
]
