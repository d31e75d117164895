"""Settings of the Django app that tests/django/test_servers.py serves with gunicorn: one middleware
rule, ``/burst`` at 100 a day per client (token bucket: no window boundary mid-test), on the store
``RW_DJANGO_STORE`` names (``memory://`` or ``shm://name?directory=...``)."""

from __future__ import annotations

import os

SECRET_KEY = "ratewarden-tests"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = "tests.django.server_urls"
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, object] = {}
MIDDLEWARE = ["ratewarden.django.RateLimitMiddleware"]
RATEWARDEN = {
    "STORE": os.environ.get("RW_DJANGO_STORE", "memory://"),
    "RULES": [{"path": "/burst", "rate": "100/day", "algorithm": "token_bucket"}],
}
