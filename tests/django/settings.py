"""Django settings of the tests in tests/django (no database: ``app.FakeAuthMiddleware`` stands in
for ``django.contrib.auth``). ``ratewarden_settings()`` builds a fresh ``RATEWARDEN`` each test."""

from __future__ import annotations

from typing import Any

from ratewarden import MemoryStore


def frozen() -> float:
    return 6000.0


SECRET_KEY = "ratewarden-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.django.app"
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, Any] = {}
USE_TZ = True
MIDDLEWARE = [
    "tests.django.app.FakeAuthMiddleware",
    "ratewarden.django.RateLimitMiddleware",
]

MIDDLEWARE_RULES = [
    {"path": "/mw/**", "rate": "5/min"},
    {"path": "/mwuser/**", "rate": "2/min", "key": "user"},
    {"path": "/mwpost/**", "rate": "2/min", "methods": "POST"},
]


def ratewarden_settings(**options: Any) -> dict[str, Any]:
    """``RATEWARDEN`` on a new MemoryStore with a frozen clock (counts exact whatever the time)."""
    return {"STORE": MemoryStore(clock=frozen), "RULES": MIDDLEWARE_RULES, **options}


RATEWARDEN = ratewarden_settings()
