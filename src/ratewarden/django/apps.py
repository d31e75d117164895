"""``INSTALLED_APPS = [..., "ratewarden.django"]``: the app whose loading registers the
``RATEWARDEN`` system check (``checks.py``), so ``manage.py check`` validates the setting."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped]

__all__ = ["RatewardenConfig"]


class RatewardenConfig(AppConfig):  # type: ignore[misc]
    """The ``ratewarden.django`` app: no models, no URLs; its system check."""

    name = "ratewarden.django"
    label = "ratewarden"
    verbose_name = "ratewarden"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the check)
