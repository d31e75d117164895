"""Django integration: ``RateLimitMiddleware`` (the rules of ``settings.RATEWARDEN``) and the
``@limit`` view decorator, for sync views under WSGI and async views under ASGI.

Importing it configures nothing: the ``RATEWARDEN`` setting is read when the middleware or a
decorated view is first used (``config``). See docs/django.md.
"""

from __future__ import annotations

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
