"""Django integration: ``RateLimitMiddleware`` (the rules of ``settings.RATEWARDEN``) and the
``@limit`` view decorator, for sync views under WSGI and async views under ASGI.

Importing it configures nothing: the ``RATEWARDEN`` setting is read when the middleware or a
decorated view is first used (``config``), and checked earlier by ``manage.py check`` (``checks``)
when ``"ratewarden.django"`` is in ``INSTALLED_APPS``. See docs/django.md.
"""

from __future__ import annotations

from . import checks  # noqa: F401  (registers the RATEWARDEN system check: manage.py check)
from .config import DjangoConfig, SettingsError, current_config, load_config
from .decorators import ALL, UNSAFE, limit
from .keys import KeySpec, django_key
from .middleware import RateLimitMiddleware

__all__ = [
    "ALL",
    "UNSAFE",
    "DjangoConfig",
    "KeySpec",
    "RateLimitMiddleware",
    "SettingsError",
    "current_config",
    "django_key",
    "limit",
    "load_config",
]
