"""The baseline: the same app with no limiter at all."""

from __future__ import annotations

from ..apps import ASGIApp, build_app
from .base import Adapter


class BareAdapter(Adapter):
    name = "bare"

    def build(self) -> ASGIApp:
        return build_app()
