"""The ``manage.py check`` system check of the ``RATEWARDEN`` setting: what the middleware or
``@limit`` would refuse at their first use (an unknown option, a bad value, a ``POLICY`` file that
is missing or invalid, the middleware without a rule) is reported by ``check``, ``runserver`` and
``migrate`` before any request, with the store left unopened.

Registered when ``ratewarden.django`` is imported: add ``"ratewarden.django"`` to ``INSTALLED_APPS``
(its ``AppConfig`` imports it) so ``manage.py check`` runs it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings  # type: ignore[import-untyped]
from django.core import checks  # type: ignore[import-untyped]

from .config import SETTING, SettingsError, check_config

__all__ = ["MIDDLEWARE_PATH", "check_settings"]

MIDDLEWARE_PATH = "ratewarden.django.RateLimitMiddleware"
"""How ``MIDDLEWARE`` names the middleware."""


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``ratewarden.E001``: the ``RATEWARDEN`` setting cannot be used (the message names the option);
    ``ratewarden.E002``: the middleware is in ``MIDDLEWARE`` but no rule is configured.

    Args:
        app_configs: The apps being checked (the setting is project-wide: ignored).
        **kwargs: Django's other arguments (``databases``...).
    """
    values = getattr(settings, SETTING, None)
    try:
        check_config(values)
    except SettingsError as exc:
        return [checks.Error(str(exc), hint="See docs/django.md, Settings.", obj=SETTING, id="ratewarden.E001")]
    middleware = getattr(settings, "MIDDLEWARE", None) or ()
    if MIDDLEWARE_PATH in middleware and not (values or {}).get("RULES") and (values or {}).get("POLICY") is None:
        return [checks.Error(
            f"{MIDDLEWARE_PATH} is in MIDDLEWARE but neither {SETTING}['RULES'] nor {SETTING}['POLICY'] gives it a rule",
            hint="Add rules, or remove the middleware and limit views with @limit.",
            obj=SETTING, id="ratewarden.E002",
        )]
    return []


checks.register(check_settings, "ratewarden")
