"""Django for tests/django: configured from ``tests.django.settings`` unless something configured
it first, and every test run with those settings and a fresh ``RATEWARDEN`` (a new store)."""

from __future__ import annotations

from collections.abc import Iterator

import django
import pytest
from django.conf import settings
from django.test.utils import override_settings

from tests.django import settings as test_settings

SETTINGS = {name: getattr(test_settings, name) for name in dir(test_settings) if name.isupper()}

if not settings.configured:
    settings.configure(**SETTINGS)
    django.setup()


#: Applied to each test (the others are start-up settings, not to be changed by a test).
PER_TEST = {k: v for k, v in SETTINGS.items() if k not in ("DATABASES", "INSTALLED_APPS")}


@pytest.fixture(autouse=True)
def _django_settings() -> Iterator[None]:
    with override_settings(**{**PER_TEST, "RATEWARDEN": test_settings.ratewarden_settings()}):
        yield
