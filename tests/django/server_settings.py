"""Settings of the Django app that tests/django/test_servers.py serves with gunicorn: one middleware
rule, ``/burst`` at ``RW_LIMIT`` (default 100) a day per client (token bucket: no window boundary
mid-test), on the store ``RW_DJANGO_STORE`` names (``memory://``, ``shm://name?...`` as the README's
deploy paragraph sets it, ``redis://...``, ``memcached://...``) with the storage-key prefix
``RW_DJANGO_PREFIX`` (a fresh one per test on a shared server), the failure policy
``RW_DJANGO_ON_ERROR`` and the rule's key ``RW_DJANGO_KEY`` (default ``ip``). ``RW_SLEEP`` and
``RW_PIDS``: see ``server_urls``."""

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
    "PREFIX": os.environ.get("RW_DJANGO_PREFIX", "rw"),
    "ON_ERROR": os.environ.get("RW_DJANGO_ON_ERROR", "open"),
    "RULES": [{
        "path": "/burst", "rate": f"{os.environ.get('RW_LIMIT', '100')}/day", "algorithm": "token_bucket",
        "key": os.environ.get("RW_DJANGO_KEY", "ip"),
    }],
}
