"""The URLconf of tests/django/server_settings.py."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import path


def burst(request: Any) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("burst", burst)]
