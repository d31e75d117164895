"""The URLconf of the conformance matrix's Django door: every path answers ``ok``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import re_path


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok", content_type="text/plain")


urlpatterns = [re_path(r"^.*$", ok)]
